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

Peak memory: every variant once more, in a fresh process on CPU (inputs built, the 64-token
warm-up, VmHWM reset to VmRSS, one step: the rise of VmHWM) and in process on CUDA
(``max_memory_allocated``), as a multiple of ``ce``'s peak. The check, the clock and the probe
are benchmarks/runner.py's; each row also holds its ratios to the anchors that ran (``ce``,
``liger``, ``ce+ntloss``). Targets (the issue's, on CPU): the
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
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from anchors import (
    CHUNKS,
    DIGITS,
    importable,
    liger_linear_cross_entropy,
    ntloss,
    ntloss_available,
    vocabularies,
)
from bench_common import numtok_source, provenance, quantiles
from runner import Implementation, Inputs, Measured, in_fresh_process, peak_of_step, probe, run

from numtok import NumberVocab, linear_number_token_loss, number_token_loss

RESULTS = Path(__file__).resolve().parent / "results"
NTL_WEIGHT = 0.3
SEQUENCE_LENGTH = 512  # ntloss reads (batch, sequence, V) logits
IGNORED_FRACTION = 0.05
FIRST_TEXT_ID = 1210  # ids 100..1209 are the number tokens (anchors.vocabularies)
WARM_UP_TOKENS = 64
CHECK_SHAPE = (512, 64, 4096)  # N, H, V of the correctness check
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
TARGETS = {10: 0.02, 1110: 0.05}  # the head's forward + backward, as a multiple of ce (CPU)
VOCABULARY_OF = {10: DIGITS, 1110: CHUNKS}
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


def make_inputs(case: Case, label_sets: list[LabelSet], device: torch.device, lse: str) -> Inputs:
    """``hidden`` ~ N(0, 1) and ``weight`` ~ N(0, 1/H) (logits ~ N(0, 1)); per label set its
    ``labels <set>`` (the same text ids and ignored positions for all sets) and, for ``reweigh``,
    ``lse <set>``, each position's log-sum-exp for the head alone: ``lse="exact"`` (the logits in
    chunks of 512 rows, no gradient), ``"log V"`` (the memory probes, where only the shapes
    matter) or ``"from logits"`` (none: the head takes the logits' differentiable log-sum-exp, as
    the check's reference has it). Deterministic for a case."""
    generator = torch.Generator().manual_seed(0)
    n, h, v = case.tokens, case.hidden_size, case.vocab_size
    hidden = torch.randn(n, h, generator=generator)
    weight = torch.randn(v, h, generator=generator) / h**0.5
    choice = torch.rand(n, generator=generator)
    text = torch.randint(FIRST_TEXT_ID, v, (n,), generator=generator)
    x = {
        "hidden": hidden.to(device, case.torch_dtype).requires_grad_(),
        "weight": weight.to(device, case.torch_dtype).requires_grad_(),
    }
    for label_set in label_sets:
        vocab = number_vocab(label_set.number_tokens, v)
        numbers_generator = torch.Generator().manual_seed(label_set.number_tokens)
        numbers = vocab.ids[torch.randint(len(vocab), (n,), generator=numbers_generator)]
        set_labels = torch.where(choice < label_set.percent / 100, numbers, text)
        set_labels = torch.where(choice >= 1 - IGNORED_FRACTION, -100, set_labels)
        x[f"labels {label_set.name}"] = set_labels.to(device)
        if label_set.reweigh and lse == "exact":
            x[f"lse {label_set.name}"] = full_lse(x["hidden"], x["weight"])
        elif label_set.reweigh and lse == "log V":
            x[f"lse {label_set.name}"] = torch.full((n,), math.log(v), device=device)
    return x


def first_tokens(x: Inputs, tokens: int) -> Inputs:
    """The first ``tokens`` positions (a fresh leaf), the same weight: the warm-up."""
    return {
        name: tensor if name == "weight" else tensor.detach()[:tokens].clone().requires_grad_(
            tensor.requires_grad
        )
        for name, tensor in x.items()
    }  # fmt: skip


@torch.no_grad()
def full_lse(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.cat(
        [
            torch.logsumexp((hidden[start : start + 512] @ weight.T).float(), dim=-1)
            for start in range(0, hidden.shape[0], 512)
        ]
    )


# ------------------------------------------------------------------ implementations

Variant = Callable[[Inputs, LabelSet], torch.Tensor]


def _labels(x: Inputs, label_set: LabelSet) -> torch.Tensor:
    return x[f"labels {label_set.name}"]


def _head(x: Inputs, label_set: LabelSet, **lse: torch.Tensor) -> torch.Tensor:
    vocab = number_vocab(label_set.number_tokens, x["weight"].shape[0])
    return linear_number_token_loss(
        x["hidden"], x["weight"], _labels(x, label_set), vocab, reweigh=label_set.reweigh, **lse
    )


def _mean_over_labels(per_token: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean of a ``reduction="none"`` cross-entropy over the non-ignored labels (what
    ``reduction="mean"`` gives)."""
    return per_token.sum() / (labels != -100).sum().clamp_min(1)


def v_ce(x: Inputs, label_set: LabelSet) -> torch.Tensor:
    return F.cross_entropy(x["hidden"] @ x["weight"].T, _labels(x, label_set))


def v_head(x: Inputs, label_set: LabelSet) -> torch.Tensor:
    """The head alone; for ``reweigh`` with the inputs' constant lse (where the check's inputs
    have none, the logits' differentiable one)."""
    if not label_set.reweigh:
        return _head(x, label_set)
    lse = x.get(f"lse {label_set.name}")
    if lse is None:
        lse = torch.logsumexp((x["hidden"] @ x["weight"].T).float(), dim=-1)
    return _head(x, label_set, lse=lse)


def v_ce_head(x: Inputs, label_set: LabelSet) -> torch.Tensor:
    logits = x["hidden"] @ x["weight"].T
    ce = F.cross_entropy(logits, _labels(x, label_set))
    if not label_set.reweigh:
        return ce + NTL_WEIGHT * _head(x, label_set)
    return ce + NTL_WEIGHT * _head(x, label_set, lse=torch.logsumexp(logits, dim=-1))


def v_ce_head_lp(x: Inputs, label_set: LabelSet) -> torch.Tensor:
    labels = _labels(x, label_set)
    per_token = F.cross_entropy(x["hidden"] @ x["weight"].T, labels, reduction="none")
    ntl = _head(x, label_set, label_log_probs=-per_token)
    return _mean_over_labels(per_token, labels) + NTL_WEIGHT * ntl


def v_ce_ntloss(x: Inputs, label_set: LabelSet) -> torch.Tensor:
    logits, labels = x["hidden"] @ x["weight"].T, _labels(x, label_set)
    n, v = logits.shape
    batch = n // SEQUENCE_LENGTH if n % SEQUENCE_LENGTH == 0 else 1
    ntl = ntloss(
        logits.view(batch, n // batch, v), labels.view(batch, n // batch), label_set.reweigh
    )
    return F.cross_entropy(logits, labels) + NTL_WEIGHT * ntl


def _cce(x: Inputs, labels: torch.Tensor, **options: Any) -> Any:
    from cut_cross_entropy import linear_cross_entropy

    impl = "cce" if x["hidden"].device.type == "cuda" else "torch_compile"
    return linear_cross_entropy(x["hidden"], x["weight"], labels, impl=impl, **options)


@functools.cache
def cce_returns_lse() -> bool:
    from cut_cross_entropy import linear_cross_entropy

    return "return_lse" in inspect.signature(linear_cross_entropy).parameters


def v_cce(x: Inputs, label_set: LabelSet) -> torch.Tensor:
    return _cce(x, _labels(x, label_set))  # type: ignore[no-any-return]


def v_cce_head(x: Inputs, label_set: LabelSet) -> torch.Tensor:
    labels = _labels(x, label_set)
    if not label_set.reweigh:
        return _cce(x, labels) + NTL_WEIGHT * _head(x, label_set)  # type: ignore[no-any-return]
    if cce_returns_lse():
        ce, lse = _cce(x, labels, return_lse=True)
        return ce + NTL_WEIGHT * _head(x, label_set, lse=lse)  # type: ignore[no-any-return]
    per_token = _cce(x, labels, reduction="none")
    ntl = _head(x, label_set, label_log_probs=-per_token)
    return _mean_over_labels(per_token, labels) + NTL_WEIGHT * ntl


def v_liger(x: Inputs, label_set: LabelSet) -> torch.Tensor:
    return liger_linear_cross_entropy(x["hidden"], x["weight"], _labels(x, label_set))


def v_liger_head(x: Inputs, label_set: LabelSet) -> torch.Tensor:
    labels = _labels(x, label_set)
    if not label_set.reweigh:
        ce = liger_linear_cross_entropy(x["hidden"], x["weight"], labels)
        return ce + NTL_WEIGHT * _head(x, label_set)
    per_token = liger_linear_cross_entropy(x["hidden"], x["weight"], labels, reduction="none")
    ntl = _head(x, label_set, label_log_probs=-per_token)
    return _mean_over_labels(per_token, labels) + NTL_WEIGHT * ntl


def reference(x: Inputs, label_set: LabelSet, ce: bool, ntl: bool) -> torch.Tensor:
    """``F.cross_entropy`` and/or ``number_token_loss`` on the materialised float32 logits: what
    every variant is checked against."""
    logits, labels = x["hidden"].float() @ x["weight"].float().T, _labels(x, label_set)
    vocab = number_vocab(label_set.number_tokens, logits.shape[-1])
    number_loss = number_token_loss(logits, labels, vocab, reweigh=label_set.reweigh)
    if not ce:
        return number_loss
    return F.cross_entropy(logits, labels) + (NTL_WEIGHT * number_loss if ntl else 0)


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
ANCHORS = {"ce", "liger", "ce+ntloss"}


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
        if not ntloss_available():
            return "ntloss or transformers is not installed"
    if (
        variant != "head"
        and args.combined_on is not None
        and label_set.name not in args.combined_on
    ):
        return "not on this label set (--combined-on)"
    return None


def implementation(variant: str, label_set: LabelSet, shared: bool) -> Implementation:
    """``variant`` on ``label_set``'s labels; ``shared``: a shape-level variant, one per case
    (named without its label set), checked against ``F.cross_entropy``."""
    where = label_set.name
    checked_by = "ce" if shared else "ntl" if variant == "head" else "ce+ntl"
    return Implementation(
        variant if shared else f"{variant} {where}",
        functools.partial(VARIANTS[variant], label_set=label_set),
        reference=f"reference {checked_by} {where}",
        required=variant in ("ce", "head"),
        anchor=variant in ANCHORS,
        fields={"variant": variant, "labels": None if shared else where, "label_set": label_set},
    )


def references(label_set: LabelSet) -> list[Implementation]:
    """The check's references on ``label_set``'s labels (not timed): the cross-entropy alone,
    NTL alone and the cross-entropy plus 0.3 NTL."""
    where = label_set.name
    return [
        Implementation(
            f"reference {name} {where}",
            functools.partial(reference, label_set=label_set, ce=ce, ntl=ntl),
            timed=False,
        )
        for name, ce, ntl in (("ce", True, False), ("ntl", False, True), ("ce+ntl", True, True))
    ]


def implementations(
    label_sets: list[LabelSet], device: torch.device, args: argparse.Namespace
) -> tuple[list[Implementation], list[str]]:
    """The steps of a case (a shape-level variant runs on the first set's labels), their
    references, and the lines saying what does not run and why."""
    found: list[Implementation] = []
    skipped: dict[str, list[str]] = {}
    for variant in SHAPE_VARIANTS:
        reason = not_run_reason(variant, None, device, args)
        if reason is None:
            found.append(implementation(variant, label_sets[0], shared=True))
        else:
            skipped.setdefault(f"`{variant}`: {reason}", [])
    for label_set in label_sets:
        for variant in LABEL_VARIANTS:
            reason = not_run_reason(variant, label_set, device, args)
            if reason is None:
                found.append(implementation(variant, label_set, shared=False))
            elif "reweigh rows only" not in reason:
                skipped.setdefault(f"`{variant}`: {reason}", []).append(label_set.name)
    notes = [
        f"{key} ({', '.join(names)})" if names and len(names) < len(label_sets) else key
        for key, names in skipped.items()
    ]
    checked = [r for label_set in label_sets for r in references(label_set)]
    return checked + found, notes


def probe_peak(spec: dict[str, Any]) -> int:
    """In a fresh process (runner.in_fresh_process): the variant's peak on CPU (runner.probe; the
    head's lse a constant log V: only its shape matters), after a warm-up on the first 64
    tokens."""
    case, label_set = Case(**spec["case"]), LabelSet.parse(spec["label_set"])
    x = make_inputs(case, [label_set], torch.device("cpu"), lse="log V")
    chosen = implementation(spec["variant"], label_set, spec["shared"])
    return probe(chosen, x, first_tokens(x, WARM_UP_TOKENS))


# ------------------------------------------------------------------ running


def log(started: float, message: str) -> None:
    print(f"[{time.perf_counter() - started:7.0f} s] {message}", file=sys.stderr, flush=True)


def run_case(
    case: Case,
    label_sets: list[LabelSet],
    found: list[Implementation],
    args: argparse.Namespace,
    meta: dict[str, Any],
) -> list[dict[str, Any]]:
    """Check every variant at ``CHECK_SHAPE``, warm up on the case's first 64 tokens, measure
    peaks and time the rounds; one row per variant."""
    device = torch.device(args.device)
    x = make_inputs(case, label_sets, device, lse="exact")
    n, h, v = CHECK_SHAPE
    small = make_inputs(Case(n, h, v, case.dtype, 1), label_sets, device, lse="from logits")
    peak: Callable[[Implementation], int] | None = None
    if args.no_memory:
        peak = None
    elif device.type == "cuda":
        peak = functools.partial(peak_of_step, inputs=x)
    else:
        peak = lambda i: in_fresh_process(  # noqa: E731
            "bench_number_head",
            "probe_peak",
            {
                "case": dataclasses.asdict(case),
                "label_set": i.fields["label_set"].name,
                "variant": i.fields["variant"],
                "shared": i.fields["labels"] is None,
            },
            args.threads,
        )
    measured = run(
        found,
        x,
        tolerance=TOLERANCE[case.torch_dtype],
        rounds=case.rounds,
        check_inputs=small,
        warm=first_tokens(x, WARM_UP_TOKENS),
        peak=peak,
    )
    for name, error in measured.failures.items():
        meta["not_run"].append(f"`{name}`: failed in the check: {error}")
    del x
    return rows_of(case, {i.name: i for i in found}, measured, meta)


def rows_of(
    case: Case, found: dict[str, Implementation], measured: Measured, meta: dict[str, Any]
) -> list[dict[str, Any]]:
    load_at_end = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    samples = measured.samples[torch.get_num_threads()]
    base = samples["ce"]
    base_memory = measured.peaks.get("ce")
    rows = []
    for name, timed in samples.items():
        fields = found[name].fields
        label_set, variant = fields["label_set"], fields["variant"]
        p20, median, p80 = quantiles(timed.full)
        row: dict[str, Any] = {
            **meta,
            "load_average_at_case_end": load_at_end,
            "case": case.name,
            "tokens": case.tokens,
            "hidden_size": case.hidden_size,
            "vocab_size": case.vocab_size,
            "dtype": case.dtype,
            "labels": fields["labels"],
            "labels_used": label_set.name,
            "number_tokens": label_set.number_tokens,
            "number_fraction": label_set.percent / 100,
            "ignored_fraction": IGNORED_FRACTION,
            "reweigh": label_set.reweigh,
            "ntl_weight": NTL_WEIGHT,
            "variant": variant,
            "lse_source": lse_source(variant, label_set),
            "rounds": case.rounds,
            "median_ms": round(median, 2),
            "p20_ms": round(p20, 2),
            "p80_ms": round(p80, 2),
            "forward_median_ms": round(timed.median_ms("forward"), 2),
            "backward_median_ms": round(timed.median_ms("backward"), 2),
            "cpu_median_ms": round(timed.median_ms("cpu"), 2),
            "baseline": "ce",
            "time_ratio": round(median / base.median_ms(), 4),
            "cpu_time_ratio": round(timed.median_ms("cpu") / base.median_ms("cpu"), 4),
            "ratios_to_anchors": measured.ratios(torch.get_num_threads(), name),
            "check_relative_error": measured.errors[name],
            "samples_ms": [round(1e3 * s, 2) for s in timed.full],
        }
        if name in measured.peaks:
            row["peak_extra_mib"] = round(measured.peaks[name] / 2**20, 1)
            if base_memory:
                row["peak_x_ce"] = round(measured.peaks[name] / base_memory, 3)
        if variant == "head":
            target = TARGETS[label_set.number_tokens]
            row["target_x_ce"] = target
            row["meets_target"] = median / base.median_ms() <= target
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
    args = parser.parse_args()
    if args.summarize:
        print(report([json.loads(line) for line in args.summarize.read_text().splitlines()]))
        return
    torch.set_num_threads(args.threads)
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
    found, notes = implementations(label_sets, device, args)
    stamp = meta["date"][:16].replace(":", "")
    base = args.out or (None if args.quick else RESULTS / f"{stamp}-number-head-{device.type}")
    meta |= {"command": command, "not_run": notes}
    rows: list[dict[str, Any]] = []
    for index, case in enumerate(cases):
        log(started, f"{case.name}: checking, warming up, measuring")
        new_rows = run_case(case, label_sets, found, args, meta)
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
