"""What the number head costs beside the cross-entropy a user already runs: forward + backward of
``linear_number_token_loss`` (NTL from the hidden states at the number-labelled positions and the
K number rows of the output layer, a (P, H) × (H, K) product) against the materialised
``hidden @ weight.T`` + ``F.cross_entropy`` on the same hidden states, in the same run.

Variants, each one training step (forward, then ``backward()`` into the hidden states' and the
weight's ``.grad``), timed in ``--rounds`` interleaved rounds (the order rotates each round),
medians with p20/p80, every time a multiple of ``ce``'s median in the same run:

* ``ce``: ``logits = hidden @ weight.T``, ``F.cross_entropy`` (the 1.0 reference);
* ``head``: the number head alone (for ``reweigh`` with a constant, precomputed log-sum-exp);
* ``ce+head``: both, one backward of ``ce + 0.3 * ntl`` (the real use); for ``reweigh`` the
  head's ``lse=`` is ``logits.logsumexp(-1)``, and ``ce+head lp`` takes ``label_log_probs=``
  from the cross-entropy itself (``-F.cross_entropy(reduction="none")``);
* ``ce+ntloss``: ``F.cross_entropy + 0.3 * ntloss.NTLoss`` (the authors' package, on the full
  logits; digits only: ntloss sees single digits, not the 1,110 chunks);
* ``cce``, ``cce+head``: Cut Cross-Entropy's ``linear_cross_entropy`` (``impl="torch_compile"``
  on CPU, ``"cce"`` on CUDA) alone and with the head beside it (``reweigh``: the lse from its
  ``return_lse=True`` where the installed version has it, else ``label_log_probs`` from its
  ``reduction="none"`` per-token loss);
* ``liger``, ``liger+head``: Liger-Kernel's fused linear cross-entropy, CUDA only (on CPU its
  Triton kernels run only in Triton's interpreter).

Cases: N tokens (``--tokens``, 4096) × H × V (``--cases``, e.g. ``H1024-V65536,H2048-V131072:2``,
``:R`` giving that case R rounds instead of ``--rounds``); per case the label sets of
``--labels``: ``K10-p10`` = the 10 digits as number tokens, 10 % of the labels number tokens,
``K1110-p30-reweigh`` = every 1-, 2- and 3-digit string (1,110 number tokens, Llama-3 style),
30 %, ``reweigh=True``; the other labels random text ids, 5 % ``-100``. The label sets of a case
share its hidden states, weight, text labels and ignored positions, and its ``ce``, ``cce`` and
``liger`` steps (whose cost does not depend on which ids the labels are; they use the first label
set's). ``--combined-on`` restricts the variants that include a full cross-entropy (``ce+head``,
``cce+head``, ...) to some label sets (``head`` runs on every set). Before the timed rounds every
variant is checked against ``F.cross_entropy + 0.3 * number_token_loss`` on the materialised
logits at a small shape (N = 512, H = 64, V = 4096; relative error of the value and of both
gradients ≤ 1e-4 in float32, 3e-2 in bfloat16) and warmed up on 64 tokens of the case (this
also compiles CCE's torch_compile path).

Peak memory: every variant once more, in a fresh subprocess on CPU (inputs built, the 64-token
warm-up, VmHWM reset to VmRSS, one step: the rise of VmHWM) and in process on CUDA
(``max_memory_allocated``), as a multiple of ``ce``'s peak. Targets (the issue's, on CPU): the
head's forward + backward ≤ 0.02× ``ce`` for digits, ≤ 0.05× for the chunks.

Usage: ``python benchmarks/bench_number_head.py [--cases H1024-V65536,H2048-V131072]
[--labels K10-p10,K10-p30,K1110-p10,K1110-p30,K1110-p30-reweigh] [--combined-on NAMES]
[--variants NAMES] [--tokens 4096] [--rounds 5] [--threads 2] [--device cpu|cuda]
[--dtype float32|bfloat16] [--no-memory] [--out PATH] [--quick]``; prints a Markdown table and
writes ``PATH.{jsonl,md}`` (default ``benchmarks/results/<date>-number-head-<device>``; none for
``--quick`` without ``--out``); ``--summarize FILE.jsonl`` prints the Markdown of a results file.
Float32 on CPU, bfloat16 on CUDA by default. ``--quick``: N = 512, H = 128, V = 8192, 2 rounds (a
dry run). On 2 CPU cores ``ce`` at N = 4096, H = 2048, V = 131,072 takes about a minute a step
(three 2.2-TFLOP matrix products, 104 s of CPU time) when the cores are free: count rounds × the
variants that include a cross-entropy.

On a machine whose cores other processes share, run it with ``OMP_WAIT_POLICY=PASSIVE`` (the rows
record it): with OpenMP's default spin-waiting a small multi-threaded kernel, as the head's are,
can wait a scheduler time slice for a descheduled worker thread, and the head's step took 240 ms
instead of 2 ms at N = 512 (fifty 56 × 128 × 10 products and their ``exp``: 1.2 s at 2 threads,
1 ms at 1 thread; 2 ms at 2 threads with ``PASSIVE``). The large products run as fast either way.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import json
import math
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from bench_common import numtok_source, proc_status, provenance, quantiles, reset_peak_memory
from bench_kinds import vocabularies

from numtok import NumberVocab, linear_number_token_loss, number_token_loss

RESULTS = Path(__file__).resolve().parent / "results"
NTL_WEIGHT = 0.3
SEQUENCE_LENGTH = 512  # ntloss reads (batch, sequence, V) logits
IGNORED_FRACTION = 0.05
FIRST_TEXT_ID = 1210  # ids 100..1209 are the number tokens (bench_kinds.vocabularies)
WARM_UP_TOKENS = 64
CHECK_SHAPE = (512, 64, 4096)  # N, H, V of the correctness check
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
TARGETS = {10: 0.02, 1110: 0.05}  # the head's forward + backward, as a multiple of ce (CPU)
VOCABULARY_OF = {10: "digits (10)", 1110: "1-3-digit chunks (1,110)"}
DEFAULT_CASES = "H1024-V65536,H2048-V131072"
DEFAULT_LABELS = "K10-p10,K10-p30,K1110-p10,K1110-p30,K1110-p30-reweigh"
SHAPE_VARIANTS = ("ce", "cce", "liger")  # one cross-entropy per case, shared by its label sets
LABEL_VARIANTS = ("head", "ce+head", "ce+head lp", "ce+ntloss", "cce+head", "liger+head")


@dataclass(frozen=True)
class Case:
    tokens: int  # N
    hidden_size: int  # H
    vocab_size: int  # V
    dtype: str
    rounds: int

    @property
    def name(self) -> str:
        return f"N{self.tokens}-H{self.hidden_size}-V{self.vocab_size}"

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class LabelSet:
    number_tokens: int  # K: 10 (digits) or 1110 (1-3-digit chunks)
    percent: int  # of the labels that are number tokens
    reweigh: bool

    @property
    def name(self) -> str:
        return f"K{self.number_tokens}-p{self.percent}" + ("-reweigh" if self.reweigh else "")

    @classmethod
    def parse(cls, text: str) -> LabelSet:
        parts = text.split("-")
        if (
            len(parts) not in (2, 3)
            or parts[0] not in ("K10", "K1110")
            or not parts[1].startswith("p")
            or parts[2:] not in ([], ["reweigh"])
        ):
            raise argparse.ArgumentTypeError(f"label set {text!r}: K10|K1110-pPERCENT[-reweigh]")
        return cls(int(parts[0][1:]), int(parts[1][1:]), parts[2:] == ["reweigh"])


def parse_cases(text: str, tokens: int, dtype: str, rounds: int) -> list[Case]:
    """``H1024-V65536,H2048-V131072:2`` -> cases (``:R``: R rounds for that case)."""
    cases = []
    for part in text.split(","):
        shape, _, case_rounds = part.partition(":")
        sizes = dict((item[0], int(item[1:])) for item in shape.split("-"))
        if set(sizes) != {"H", "V"} or sizes["V"] <= FIRST_TEXT_ID:
            raise SystemExit(f"--cases {part!r}: HSIZE-VSIZE[:ROUNDS], V > {FIRST_TEXT_ID}")
        cases.append(Case(tokens, sizes["H"], sizes["V"], dtype, int(case_rounds or rounds)))
    return cases


# ------------------------------------------------------------------ inputs


@functools.cache
def number_vocab(number_tokens: int, vocab_size: int) -> NumberVocab:
    return vocabularies(vocab_size)[VOCABULARY_OF[number_tokens]]


@dataclass
class Inputs:
    hidden: torch.Tensor  # (N, H) leaf
    weight: torch.Tensor  # (V, H) leaf
    labels: dict[str, torch.Tensor]  # label set -> (N,)
    lse: dict[str, torch.Tensor]  # reweigh label set -> (N,) constant lse for the head alone
    shared_labels: str  # the label set whose labels the shape-level variants use

    def sliced(self, tokens: int) -> Inputs:
        """The first ``tokens`` positions (fresh leaves), the same weight: the warm-up."""
        hidden = self.hidden.detach()[:tokens].clone().requires_grad_()
        return Inputs(
            hidden,
            self.weight,
            {name: labels[:tokens] for name, labels in self.labels.items()},
            {name: lse[:tokens] for name, lse in self.lse.items()},
            self.shared_labels,
        )


def make_inputs(
    case: Case, label_sets: list[LabelSet], device: torch.device, exact_lse: bool = True
) -> Inputs:
    """Hidden states ~ N(0, 1), weight ~ N(0, 1/H) (logits ~ N(0, 1)); per label set its labels
    (the same text ids and ignored positions for all sets) and, for ``reweigh``, each position's
    log-sum-exp for the head alone: exact (the logits in chunks of 512 rows, no gradient) or,
    with ``exact_lse=False`` (the memory probes, where only the shapes matter), log V.
    Deterministic for a case."""
    generator = torch.Generator().manual_seed(0)
    n, h, v = case.tokens, case.hidden_size, case.vocab_size
    hidden = torch.randn(n, h, generator=generator)
    weight = torch.randn(v, h, generator=generator) / h**0.5
    choice = torch.rand(n, generator=generator)
    text = torch.randint(FIRST_TEXT_ID, v, (n,), generator=generator)
    hidden = hidden.to(device, case.torch_dtype).requires_grad_()
    weight = weight.to(device, case.torch_dtype).requires_grad_()
    labels, lse = {}, {}
    for label_set in label_sets:
        vocab = number_vocab(label_set.number_tokens, v)
        numbers_generator = torch.Generator().manual_seed(label_set.number_tokens)
        numbers = vocab.ids[torch.randint(len(vocab), (n,), generator=numbers_generator)]
        set_labels = torch.where(choice < label_set.percent / 100, numbers, text)
        set_labels = torch.where(choice >= 1 - IGNORED_FRACTION, -100, set_labels)
        labels[label_set.name] = set_labels.to(device)
        if label_set.reweigh:
            lse[label_set.name] = full_lse(hidden, weight) if exact_lse else torch.full(
                (n,), math.log(v), device=device
            )  # fmt: skip
    return Inputs(hidden, weight, labels, lse, label_sets[0].name)


@torch.no_grad()
def full_lse(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.cat(
        [
            torch.logsumexp((hidden[start : start + 512] @ weight.T).float(), dim=-1)
            for start in range(0, hidden.shape[0], 512)
        ]
    )


@functools.cache
def ntloss_of(vocab_size: int, reweigh: bool) -> Any:
    """ntloss's NTLoss on a WordLevel tokenizer whose ids 100..109 are the digits (as
    bench_loss.py builds it): the digit vocabulary of these benchmarks."""
    from loguru import logger
    from ntloss import NTLoss
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = {"<unk>": 0, **{f"w{i}": i for i in range(1, vocab_size)}}
    for digit in range(10):
        del words[f"w{100 + digit}"]
        words[str(digit)] = 100 + digit
    backend = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    logger.disable("ntloss")
    return NTLoss(tokenizer, vocab_size=vocab_size, reweigh=reweigh)


# ------------------------------------------------------------------ variants

Variant = Callable[[Inputs, LabelSet], torch.Tensor]


def _head(x: Inputs, label_set: LabelSet, **lse: torch.Tensor) -> torch.Tensor:
    vocab = number_vocab(label_set.number_tokens, x.weight.shape[0])
    return linear_number_token_loss(
        x.hidden, x.weight, x.labels[label_set.name], vocab, reweigh=label_set.reweigh, **lse
    )


def _mean_over_labels(per_token: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean of a ``reduction="none"`` cross-entropy over the non-ignored labels (what
    ``reduction="mean"`` gives)."""
    return per_token.sum() / (labels != -100).sum().clamp_min(1)


def v_ce(x: Inputs, label_set: LabelSet) -> torch.Tensor:
    return F.cross_entropy(x.hidden @ x.weight.T, x.labels[label_set.name])


def v_head(x: Inputs, label_set: LabelSet) -> torch.Tensor:
    if not label_set.reweigh:
        return _head(x, label_set)
    return _head(x, label_set, lse=x.lse[label_set.name])


def v_ce_head(x: Inputs, label_set: LabelSet) -> torch.Tensor:
    logits = x.hidden @ x.weight.T
    ce = F.cross_entropy(logits, x.labels[label_set.name])
    if not label_set.reweigh:
        return ce + NTL_WEIGHT * _head(x, label_set)
    return ce + NTL_WEIGHT * _head(x, label_set, lse=torch.logsumexp(logits, dim=-1))


def v_ce_head_lp(x: Inputs, label_set: LabelSet) -> torch.Tensor:
    labels = x.labels[label_set.name]
    per_token = F.cross_entropy(x.hidden @ x.weight.T, labels, reduction="none")
    ntl = _head(x, label_set, label_log_probs=-per_token)
    return _mean_over_labels(per_token, labels) + NTL_WEIGHT * ntl


def v_ce_ntloss(x: Inputs, label_set: LabelSet) -> torch.Tensor:
    logits, labels = x.hidden @ x.weight.T, x.labels[label_set.name]
    n, v = logits.shape
    batch = n // SEQUENCE_LENGTH if n % SEQUENCE_LENGTH == 0 else 1
    ntloss = ntloss_of(v, label_set.reweigh)
    ntl = ntloss(logits.view(batch, n // batch, v), labels.view(batch, n // batch))
    return F.cross_entropy(logits, labels) + NTL_WEIGHT * ntl


def _cce(x: Inputs, labels: torch.Tensor, **options: Any) -> Any:
    from cut_cross_entropy import linear_cross_entropy

    impl = "cce" if x.hidden.device.type == "cuda" else "torch_compile"
    return linear_cross_entropy(x.hidden, x.weight, labels, impl=impl, **options)


@functools.cache
def cce_returns_lse() -> bool:
    from cut_cross_entropy import linear_cross_entropy

    return "return_lse" in inspect.signature(linear_cross_entropy).parameters


def v_cce(x: Inputs, label_set: LabelSet) -> torch.Tensor:
    return _cce(x, x.labels[label_set.name])  # type: ignore[no-any-return]


def v_cce_head(x: Inputs, label_set: LabelSet) -> torch.Tensor:
    labels = x.labels[label_set.name]
    if not label_set.reweigh:
        return _cce(x, labels) + NTL_WEIGHT * _head(x, label_set)  # type: ignore[no-any-return]
    if cce_returns_lse():
        ce, lse = _cce(x, labels, return_lse=True)
        return ce + NTL_WEIGHT * _head(x, label_set, lse=lse)  # type: ignore[no-any-return]
    per_token = _cce(x, labels, reduction="none")
    ntl = _head(x, label_set, label_log_probs=-per_token)
    return _mean_over_labels(per_token, labels) + NTL_WEIGHT * ntl


def _liger(x: Inputs, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    return liger_fused_linear_cross_entropy(  # type: ignore[no-any-return]
        x.hidden, x.weight, labels, reduction=reduction
    )


def v_liger(x: Inputs, label_set: LabelSet) -> torch.Tensor:
    return _liger(x, x.labels[label_set.name])


def v_liger_head(x: Inputs, label_set: LabelSet) -> torch.Tensor:
    labels = x.labels[label_set.name]
    if not label_set.reweigh:
        return _liger(x, labels) + NTL_WEIGHT * _head(x, label_set)
    per_token = _liger(x, labels, reduction="none")
    ntl = _head(x, label_set, label_log_probs=-per_token)
    return _mean_over_labels(per_token, labels) + NTL_WEIGHT * ntl


VARIANTS: dict[str, Variant] = {
    "ce": v_ce,
    "cce": v_cce,
    "liger": v_liger,
    "head": v_head,
    "ce+head": v_ce_head,
    "ce+head lp": v_ce_head_lp,
    "ce+ntloss": v_ce_ntloss,
    "cce+head": v_cce_head,
    "liger+head": v_liger_head,
}


def lse_source(variant: str, label_set: LabelSet) -> str | None:
    """Where a ``reweigh`` row's head takes each position's log-sum-exp from."""
    if not label_set.reweigh or variant not in LABEL_VARIANTS:
        return None
    return {
        "head": "lse=: a constant tensor (the exact log-sum-exp, computed before the rounds)",
        "ce+head": "lse=logits.logsumexp(-1) of the materialised logits",
        "ce+head lp": "label_log_probs=-F.cross_entropy(logits, reduction='none')",
        "ce+ntloss": "ntloss computes it from the logits",
        "cce+head": "lse= from CCE's return_lse=True"
        if cce_returns_lse()
        else "label_log_probs=-CCE(reduction='none') (this CCE has no return_lse)",
        "liger+head": "label_log_probs=-Liger(reduction='none')",
    }[variant]


def importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def not_run_reason(
    variant: str, label_set: LabelSet | None, device: torch.device, args: argparse.Namespace
) -> str | None:
    """Why ``variant`` does not run (on this label set), or None when it does."""
    if variant.startswith("liger") and device.type != "cuda":
        return (
            "CUDA only: on CPU Liger-Kernel's Triton kernels run only in Triton's interpreter, "
            "far too slow at these sizes"
        )
    if args.variants is not None and variant not in args.variants and variant != "ce":
        return "not selected (--variants)"
    if variant in ("cce", "cce+head") and not importable("cut_cross_entropy"):
        return "cut_cross_entropy is not installed"
    if variant.startswith("liger") and not importable("liger_kernel.transformers.functional"):
        return "liger_kernel is not installed"
    if label_set is None:
        return None
    if variant == "ce+head lp" and not label_set.reweigh:
        return "reweigh rows only (the labels' log-probabilities stand in for the lse)"
    if variant == "ce+ntloss":
        if label_set.number_tokens != 10:
            return (
                "ntloss sees single digits only (digit_level=True; with digit_level=False it "
                "reads '123' as 123 and '01' as 1, another loss than numtok's on these chunks), "
                "so it cannot compute NTL on the 1,110-chunk vocabulary"
            )
        if not (importable("ntloss") and importable("transformers")):
            return "ntloss or transformers is not installed"
    if (
        variant != "head"
        and args.combined_on is not None
        and label_set.name not in args.combined_on
    ):
        return "not on this label set (--combined-on)"
    return None


def jobs_of(
    label_sets: list[LabelSet], device: torch.device, args: argparse.Namespace
) -> tuple[list[tuple[str, LabelSet | None]], list[str]]:
    """The (variant, label set) steps of a case (label set None: a shape-level variant, run on
    the first set's labels) and the lines saying what does not run and why."""
    jobs: list[tuple[str, LabelSet | None]] = []
    skipped: dict[str, list[str]] = {}
    for variant in SHAPE_VARIANTS:
        reason = not_run_reason(variant, None, device, args)
        if reason is None:
            jobs.append((variant, None))
        else:
            skipped.setdefault(f"`{variant}`: {reason}", [])
    for label_set in label_sets:
        for variant in LABEL_VARIANTS:
            reason = not_run_reason(variant, label_set, device, args)
            if reason is None:
                jobs.append((variant, label_set))
            elif "reweigh rows only" not in reason:
                skipped.setdefault(f"`{variant}`: {reason}", []).append(label_set.name)
    notes = [
        f"{key} ({', '.join(names)})" if names and len(names) < len(label_sets) else key
        for key, names in skipped.items()
    ]
    return jobs, notes


def label_set_of(x: Inputs, label_set: LabelSet | None, label_sets: list[LabelSet]) -> LabelSet:
    if label_set is not None:
        return label_set
    return next(s for s in label_sets if s.name == x.shared_labels)


# ------------------------------------------------------------------ running


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_once(variant: Variant, x: Inputs, label_set: LabelSet) -> tuple[float, float, float]:
    """(forward, backward) wall-clock seconds of one step, and the CPU seconds of the whole step
    (user + system of this process); the gradients land in ``.grad``."""
    device = x.hidden.device
    x.hidden.grad = x.weight.grad = None
    synchronize(device)
    cpu_start, start = time.process_time(), time.perf_counter()
    loss = variant(x, label_set)
    synchronize(device)
    middle = time.perf_counter()
    loss.backward()
    synchronize(device)
    end = time.perf_counter()
    return middle - start, end - middle, time.process_time() - cpu_start


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    difference = (value.double() - reference.double()).norm()
    return float(difference / reference.double().norm().clamp_min(1e-300))


def check_variants(
    jobs: list[tuple[str, LabelSet | None]],
    label_sets: list[LabelSet],
    device: torch.device,
    dtype: str,
) -> tuple[dict[tuple[str, str | None], float], dict[tuple[str, str | None], str]]:
    """Every (variant, label set) once at the small shape ``CHECK_SHAPE`` against
    ``F.cross_entropy`` (+ 0.3 · ``number_token_loss``, or that alone for ``head``) on the
    materialised float32 logits: value and both gradients; raises past the tolerance. For the head
    alone with ``reweigh``, its constant lse is replaced by the differentiable logsumexp of the
    logits, as the reference has it. Returns the relative errors and, for the variants that
    failed to run (other than ``ce`` and ``head``), the error."""
    n, h, v = CHECK_SHAPE
    case = Case(n, h, v, dtype, 1)
    x = make_inputs(case, label_sets, device)
    tolerance = TOLERANCE[case.torch_dtype]
    errors: dict[tuple[str, str | None], float] = {}
    failures: dict[tuple[str, str | None], str] = {}
    for name, job_set in jobs:
        label_set = label_set_of(x, job_set, label_sets)
        hidden, weight = x.hidden.detach().float(), x.weight.detach().float()
        hidden.requires_grad_(), weight.requires_grad_()
        logits, labels = hidden @ weight.T, x.labels[label_set.name]
        vocab = number_vocab(label_set.number_tokens, v)
        ntl = number_token_loss(logits, labels, vocab, reweigh=label_set.reweigh)
        reference = {
            "head": ntl,
            **dict.fromkeys(SHAPE_VARIANTS, F.cross_entropy(logits, labels)),
        }.get(name, F.cross_entropy(logits, labels) + NTL_WEIGHT * ntl)
        expected = [reference.detach(), *torch.autograd.grad(reference, [hidden, weight])]
        call = x
        if name == "head" and label_set.reweigh:
            lse = torch.logsumexp((x.hidden @ x.weight.T).float(), dim=-1)
            call = dataclasses.replace(x, lse={**x.lse, label_set.name: lse})
        x.hidden.grad = x.weight.grad = None
        try:
            loss = VARIANTS[name](call, label_set)
            loss.backward()
        except Exception as error:  # a library that cannot run here: left out, and said so
            if name in ("ce", "head"):
                raise
            failures[name, None if job_set is None else job_set.name] = repr(error)[:300]
            continue
        actual = [loss.detach(), x.hidden.grad, x.weight.grad]
        error = max(relative_error(a, e) for a, e in zip(actual, expected, strict=True))  # type: ignore[arg-type]
        if not error <= tolerance:
            where = label_set.name if job_set is not None else "shared"
            raise AssertionError(f"{name} ({where}) is off by {error:.2e} relative")
        errors[name, None if job_set is None else job_set.name] = error
    return errors, failures


def measure_memory(
    case: Case,
    label_sets: list[LabelSet],
    name: str,
    job_set: LabelSet | None,
    x: Inputs,
    args: argparse.Namespace,
) -> int:
    """Peak extra memory of one step: in a fresh subprocess on CPU, in process on CUDA."""
    device = x.hidden.device
    label_set = label_set_of(x, job_set, label_sets)
    if device.type == "cuda":
        run_once(VARIANTS[name], x, label_set)  # the timed rounds' own warm-up is long past
        x.hidden.grad = x.weight.grad = None
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        baseline = torch.cuda.memory_allocated(device)
        run_once(VARIANTS[name], x, label_set)
        peak = torch.cuda.max_memory_allocated(device) - baseline
        x.hidden.grad = x.weight.grad = None
        return peak
    probe = {
        "case": dataclasses.asdict(case),
        "label_set": label_set.name,
        "variant": name,
    }
    command = [sys.executable, __file__, "--probe-memory", json.dumps(probe)]
    command += ["--threads", str(args.threads), "--device", "cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    output = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    return int(output.strip().splitlines()[-1])


def probe_memory(text: str) -> int:
    """In this fresh process: the peak resident memory one step adds (see measure_memory)."""
    probe = json.loads(text)
    case, label_set = Case(**probe["case"]), LabelSet.parse(probe["label_set"])
    x = make_inputs(case, [label_set], torch.device("cpu"), exact_lse=False)
    variant = VARIANTS[probe["variant"]]
    run_once(variant, x.sliced(WARM_UP_TOKENS), label_set)
    x.hidden.grad = x.weight.grad = None
    baseline = reset_peak_memory()
    run_once(variant, x, label_set)
    return proc_status("VmHWM") - baseline


def log(started: float, message: str) -> None:
    print(f"[{time.perf_counter() - started:7.0f} s] {message}", file=sys.stderr, flush=True)


def run_case(
    case: Case,
    label_sets: list[LabelSet],
    jobs: list[tuple[str, LabelSet | None]],
    errors: dict[tuple[str, str | None], float],
    args: argparse.Namespace,
    meta: dict[str, Any],
    started: float,
) -> list[dict[str, Any]]:
    device = torch.device(args.device)
    log(started, f"{case.name}: building inputs")
    x = make_inputs(case, label_sets, device)
    warm = x.sliced(WARM_UP_TOKENS)
    for name, job_set in jobs:
        run_once(VARIANTS[name], warm, label_set_of(x, job_set, label_sets))
    del warm
    key = [(name, None if s is None else s.name) for name, s in jobs]
    samples: dict[tuple[str, str | None], dict[str, list[float]]] = {
        k: {"forward": [], "backward": [], "full": [], "cpu": []} for k in key
    }
    for round_index in range(case.rounds):
        shift = round_index % len(jobs)
        for (name, job_set), k in (
            list(zip(jobs, key, strict=True))[shift:] + list(zip(jobs, key, strict=True))[:shift]
        ):
            forward, backward, cpu = run_once(
                VARIANTS[name], x, label_set_of(x, job_set, label_sets)
            )
            x.hidden.grad = x.weight.grad = None
            for mode, value in (("forward", forward), ("backward", backward)):
                samples[k][mode].append(value)
            samples[k]["full"].append(forward + backward)
            samples[k]["cpu"].append(cpu)
            if forward + backward > 1:
                log(started, f"{case.name} round {round_index + 1}/{case.rounds}: {k} "
                             f"{forward + backward:.1f} s (CPU {cpu:.1f} s)")  # fmt: skip
        log(started, f"{case.name}: round {round_index + 1}/{case.rounds} done")
    memory: dict[tuple[str, str | None], int] = {}
    if not args.no_memory:
        for (name, job_set), k in zip(jobs, key, strict=True):
            memory[k] = measure_memory(case, label_sets, name, job_set, x, args)
            log(started, f"{case.name}: peak memory of {k}: {memory[k] / 2**20:.0f} MiB")
    del x
    load_at_end = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    base = quantiles(samples["ce", None]["full"])[1]
    base_cpu = quantiles(samples["ce", None]["cpu"])[1]
    base_memory = memory.get(("ce", None))
    rows = []
    for (name, job_set), k in zip(jobs, key, strict=True):
        label_set = job_set or label_sets[0]  # the shape-level variants ran on the first set
        p20, median, p80 = quantiles(samples[k]["full"])
        cpu = quantiles(samples[k]["cpu"])[1]
        row: dict[str, Any] = {
            **meta,
            "load_average_at_case_end": load_at_end,
            "case": case.name,
            "tokens": case.tokens,
            "hidden_size": case.hidden_size,
            "vocab_size": case.vocab_size,
            "dtype": case.dtype,
            "labels": None if job_set is None else job_set.name,
            "labels_used": label_set.name,
            "number_tokens": label_set.number_tokens,
            "number_fraction": label_set.percent / 100,
            "ignored_fraction": IGNORED_FRACTION,
            "reweigh": label_set.reweigh,
            "ntl_weight": NTL_WEIGHT,
            "variant": name,
            "lse_source": lse_source(name, label_set),
            "rounds": case.rounds,
            "median_ms": round(median, 2),
            "p20_ms": round(p20, 2),
            "p80_ms": round(p80, 2),
            "forward_median_ms": round(quantiles(samples[k]["forward"])[1], 2),
            "backward_median_ms": round(quantiles(samples[k]["backward"])[1], 2),
            "cpu_median_ms": round(cpu, 2),
            "baseline": "ce",
            "time_ratio": round(median / base, 4),
            "cpu_time_ratio": round(cpu / base_cpu, 4),
            "check_relative_error": errors[k],
            "samples_ms": [round(1e3 * s, 2) for s in samples[k]["full"]],
        }
        if k in memory:
            row["peak_extra_mib"] = round(memory[k] / 2**20, 1)
            if base_memory:
                row["peak_x_ce"] = round(memory[k] / base_memory, 3)
        if name == "head":
            target = TARGETS[label_set.number_tokens]
            row["target_x_ce"] = target
            row["meets_target"] = median / base <= target
        rows.append(row)
    return rows


# ------------------------------------------------------------------ tables


def _ratio(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.3f}×" if value < 0.1 else f"{value:.2f}×"


def summary_table(rows: list[dict[str, Any]]) -> list[str]:
    """One line per case and label set: the ratios to ``ce`` and the memory multiples."""
    lines = [
        "| case | labels | rounds | `ce` s (p20-p80) | `head` × ce (target) | `ce+head` | "
        "`ce+ntloss` | `cce` | `cce+head` | `liger` | `liger+head` | "
        "peak × ce's: head / ce+head / ce+ntloss / cce / cce+head |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in dict.fromkeys(row["case"] for row in rows):
        of_case = [row for row in rows if row["case"] == case]
        shared = {row["variant"]: row for row in of_case if row["labels"] is None}
        for labels in dict.fromkeys(row["labels"] for row in of_case if row["labels"]):
            by = {**shared, **{r["variant"]: r for r in of_case if r["labels"] == labels}}

            def ratio(variant: str, by: dict[str, dict[str, Any]] = by) -> str:
                if variant not in by:
                    return "–"
                row = by[variant]
                return f"{_ratio(row['time_ratio'])} ({_ratio(row['cpu_time_ratio'])})"

            def peak(variant: str, by: dict[str, dict[str, Any]] = by) -> str:
                value = by.get(variant, {}).get("peak_x_ce")
                return "–" if value is None else f"{value:.2f}"

            ce, head = by["ce"], by.get("head")
            head_cell = "–"
            if head is not None:
                verdict = "pass" if head["meets_target"] else "**fail**"
                head_cell = (
                    f"**{_ratio(head['time_ratio'])}** ({_ratio(head['cpu_time_ratio'])}; "
                    f"≤ {head['target_x_ce']}: {verdict})"
                )
            ce_head = ratio("ce+head")
            if "ce+head lp" in by:
                ce_head = f"{ce_head} (lse) / {ratio('ce+head lp')} (lp)"
            memory = " / ".join(
                peak(v) for v in ("head", "ce+head", "ce+ntloss", "cce", "cce+head")
            )
            lines.append(
                f"| {case} | {labels} | {ce['rounds']} | {ce['median_ms'] / 1e3:.1f} s "
                f"({ce['p20_ms'] / 1e3:.1f}-{ce['p80_ms'] / 1e3:.1f}) | {head_cell} | {ce_head} | "
                f"{ratio('ce+ntloss')} | {ratio('cce')} | {ratio('cce+head')} | {ratio('liger')} | "
                f"{ratio('liger+head')} | {memory} |"
            )
    return lines


def detail_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| case | labels | variant | rounds | full ms (p20-p80) | × ce | CPU × ce | fwd ms | "
        "bwd ms | peak MiB | peak × ce | check error |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        labels = row["labels"] or f"(shared; {row['labels_used']}'s labels)"
        lines.append(
            f"| {row['case']} | {labels} | {row['variant']} | {row['rounds']} | "
            f"{row['median_ms']:.1f} ({row['p20_ms']:.1f}-{row['p80_ms']:.1f}) | "
            f"{_ratio(row['time_ratio'])} | {_ratio(row['cpu_time_ratio'])} | "
            f"{row['forward_median_ms']:.1f} | {row['backward_median_ms']:.1f} | "
            f"{row.get('peak_extra_mib', '–')} | {row.get('peak_x_ce', '–')} | "
            f"{row['check_relative_error']:.1e} |"
        )
    return lines


def report(rows: list[dict[str, Any]], finished: bool = True) -> str:
    """The Markdown of a run's rows: a line of provenance, the summary, what did not run, every
    row."""
    first, notes = rows[0], rows[0]["not_run"]
    loads = [row["load_average_at_case_end"] for row in rows]
    wall = max(row["elapsed_s_at_case_end"] for row in rows)
    header = (
        f"`{first['command']}`{'' if finished else ' (stopped early: the cases done so far)'}: "
        f"forward + backward, N = {first['tokens']} tokens, {first['dtype']}, {first['device']}"
        f"{' (' + first['gpu'] + ')' if first['gpu'] else ''}, {first['threads']} thread(s); "
        f"{first['cpu']}, {first['cpu_count']} usable cores, torch {first['torch']}, numtok "
        f"{first['numtok']}, {first['date']}, OMP_WAIT_POLICY="
        f"{first['omp_wait_policy'] or '(unset)'}; load average "
        f"{first['load_average_at_start']:.1f} at the start, {max(loads):.1f} at most at a "
        f"case's end; {wall / 60:.0f} minutes."
    )
    lines = [
        header,
        "",
        "Medians of the rounds (interleaved, the order rotated each round) as a multiple of "
        "`ce` (materialised `hidden @ weight.T` + `F.cross_entropy`) in the same run, wall "
        "clock (and, in brackets, CPU time: user + system of the process); "
        "`ce+head lp`: the head's `label_log_probs=` from the cross-entropy's per-token loss "
        "instead of `lse=logsumexp(logits)`; peak = the extra peak memory of one step (fresh "
        "process, VmHWM, on CPU) as a multiple of `ce`'s.",
        "",
        *summary_table(rows),
        "",
    ]
    if notes:
        lines += ["Not run:", "", *(f"* {note}" for note in notes), ""]
    lines += ["Every row:", "", *detail_table(rows)]
    return "\n".join(lines) + "\n"


def targets_lines(rows: list[dict[str, Any]]) -> list[str]:
    return [
        f"target: {row['case']} {row['labels']}: head {row['time_ratio']:.4f}× ce "
        f"(CPU {row['cpu_time_ratio']:.4f}×) ≤ {row['target_x_ce']}× -> "
        f"{'pass' if row['meets_target'] else 'FAIL'}"
        for row in rows
        if row["variant"] == "head"
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=None, help=f"default {DEFAULT_CASES}")
    parser.add_argument("--labels", default=DEFAULT_LABELS)
    parser.add_argument(
        "--combined-on",
        type=lambda text: text.split(","),
        help="label sets on which the variants with a cross-entropy run (default: all)",
    )
    parser.add_argument("--variants", type=lambda text: text.split(","), help="default: all")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", help="float32 on CPU, bfloat16 on CUDA by default")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--out", type=Path, help="where the .jsonl and .md go (no suffix)")
    parser.add_argument("--quick", action="store_true", help="N = 512, H = 128, V = 8192, 2 rounds")
    parser.add_argument("--summarize", type=Path, help="print the Markdown of a .jsonl and exit")
    parser.add_argument("--probe-memory", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.summarize:
        print(report([json.loads(line) for line in args.summarize.read_text().splitlines()]))
        return
    torch.set_num_threads(args.threads)
    if args.probe_memory:
        print(probe_memory(args.probe_memory))
        return
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    if args.quick:
        args.tokens, args.rounds = 512, 2
        args.cases = args.cases or "H128-V8192"
    cases = parse_cases(args.cases or DEFAULT_CASES, args.tokens, dtype, args.rounds)
    label_sets = [LabelSet.parse(text) for text in args.labels.split(",")]
    command = shlex.join(["python", "benchmarks/bench_number_head.py", *sys.argv[1:]])
    started = time.perf_counter()
    meta = {
        **provenance(device, compiled=False),
        "threads": args.threads,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "numtok_source": numtok_source(),
    }
    jobs, notes = jobs_of(label_sets, device, args)
    log(started, f"checking {len(jobs)} steps at N, H, V = {CHECK_SHAPE}")
    errors, failures = check_variants(jobs, label_sets, device, dtype)
    for (name, labels), error in failures.items():
        notes.append(f"`{name}` ({labels or 'shared'}): failed in the check: {error}")
    jobs = [
        (name, job_set)
        for name, job_set in jobs
        if (name, None if job_set is None else job_set.name) in errors
    ]
    log(started, f"checked: largest relative error {max(errors.values()):.1e}")
    stamp = meta["date"][:16].replace(":", "")
    base = args.out or (None if args.quick else RESULTS / f"{stamp}-number-head-{device.type}")
    meta |= {"command": command, "not_run": notes}
    rows: list[dict[str, Any]] = []
    for index, case in enumerate(cases):
        new_rows = run_case(case, label_sets, jobs, errors, args, meta, started)
        for row in new_rows:
            row["elapsed_s_at_case_end"] = round(time.perf_counter() - started)
        rows += new_rows
        text = report(rows, index == len(cases) - 1)
        if base is not None:
            base.parent.mkdir(parents=True, exist_ok=True)
            base.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            base.with_suffix(".md").write_text(text)
        print("\n".join(targets_lines([r for r in rows if r["case"] == case.name])), flush=True)
    print(text)
    if base is not None:
        print(f"results: {base}.jsonl, {base}.md", file=sys.stderr)


if __name__ == "__main__":
    main()
