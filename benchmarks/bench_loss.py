"""CE + NTL benchmark: time (forward, backward, full) and peak memory of every variant on identical
inputs, as ratios against plain ``F.cross_entropy`` (logits suite) or the materialised output
layer (linear suite) measured in the same run, at one thread and at all cores.

    python benchmarks/bench_loss.py               # default suite, results in benchmarks/results/
    python benchmarks/bench_loss.py --quick       # small shapes, a smoke run of everything
    python benchmarks/bench_loss.py --device cuda --compile   # on a GPU, torch.compile'd
    python benchmarks/bench_loss.py --device cuda --gpu-cases # gpu.sh's: 5 % and 50 % ignored,
                                                              # an upstream gradient of 0.37

Method (see benchmarks/README.md): for each case the first round checks each variant's value and
gradients against the unfused reference and warms up; then, for each thread count in turn
(after the first, with an untimed warm-up round for the logits suite), ``--rounds`` timed rounds
with the variants interleaved (the order rotates each round). Forward is the training forward
(autograd recording), backward is ``loss.backward()``, full is their sum in the same call.
Medians with p20/p80. Peak memory is measured for each variant once per case, at the largest
thread count, in a fresh subprocess on CPU (the rise of VmHWM over VmRSS during one forward +
backward, VmHWM reset by writing "5" to /proc/self/clear_refs right before) and in process on
CUDA (``max_memory_allocated``), reported as a multiple of the logits' size. On CUDA the inputs
are drawn on the device (a CUDA generator, in their dtype: no host-side sampling of 10^9 values)
and kept for the next case of the same shape and dtype, and the forward and backward times are
read off CUDA events.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from bench_common import (
    case_rows,
    proc_status,
    provenance,
    reset_peak_memory,
    summary_table,
    usable_cores,
)
from torch.autograd.function import once_differentiable

from numtok import NumberVocab, number_token_loss
from numtok.losses.fused import cross_entropy_with_ntl
from numtok.losses.linear import linear_cross_entropy_with_ntl
from numtok.ops.kernels.torch_rows import statistics_and_gradient

RESULTS = Path(__file__).resolve().parent / "results"
NTL_WEIGHT = 0.3
FIRST_DIGIT_ID = 100  # "0".."9" are token ids 100..109
SEQUENCE_LENGTH = 512
NUMBER_FRACTION = 0.10
IGNORED_FRACTION = 0.05


@dataclass(frozen=True)
class Case:
    suite: str  # "logits" (given logits) or "linear" (given hidden states and the output layer)
    tokens: int  # N
    vocab_size: int  # V
    hidden_size: int  # H (linear suite), 0 otherwise
    dtype: str  # "float32" or "bfloat16"
    reweigh: bool
    ignored_fraction: float = IGNORED_FRACTION  # of the labels that are ignore_index
    upstream: float = 1.0  # the gradient flowing into the loss: loss.backward(upstream)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)  # type: ignore[no-any-return]

    @property
    def logits_bytes(self) -> int:
        return self.tokens * self.vocab_size * self.torch_dtype.itemsize

    def label(self) -> str:
        shape = f"N={self.tokens} V={self.vocab_size}"
        shape += f" H={self.hidden_size}" if self.hidden_size else ""
        label = f"{self.suite} {shape} {self.dtype} reweigh={'on' if self.reweigh else 'off'}"
        if self.ignored_fraction != IGNORED_FRACTION:
            label += f" ignored={self.ignored_fraction:.0%}"
        if self.upstream != 1:
            label += f" upstream={self.upstream:g}"
        return label


def default_cases(device: torch.device) -> list[Case]:
    """About 45 minutes on 2 CPU cores at 1 and 2 threads (the linear suite is 2/3 of it); on a
    GPU also the logits of a Llama-3-sized vocabulary, N = 8192, V = 128,256, and its output
    layer at H = 4096."""
    shapes = [(4096, 32_768, False), (4096, 32_768, True), (2048, 131_072, False)]
    if device.type == "cuda":
        shapes.append((8192, 128_256, False))
    logits = [
        Case("logits", n, v, 0, dtype, reweigh)
        for n, v, reweigh in shapes
        for dtype in ["float32", "bfloat16"]
    ]
    linear_shapes = [(4096, 131_072, 1024)]
    if device.type == "cuda":
        linear_shapes.append((8192, 128_256, 4096))
    linear = [
        Case("linear", n, v, h, dtype, False)
        for n, v, h in linear_shapes
        for dtype in ["float32", "bfloat16"]
    ]
    return logits + linear


#: (ignored fraction, upstream gradient) of each shape in --gpu-cases: SFT-like masking, and a loss
#: scaled before backward (gradient accumulation, a loss scale).
GPU_LABEL_MIXES = [(IGNORED_FRACTION, 1.0), (0.5, 1.0), (IGNORED_FRACTION, 0.37)]


def gpu_cases(quick: bool = False) -> list[Case]:
    """gpu.sh's: logits N x V = 8192 x 128,256 (Llama 3) and 16,384 x 32,768, bfloat16 before
    float32, the largest first, each with 5 % and 50 % ignored labels and with an upstream
    gradient of 0.37; the logits-free suite at N, H, V = 8192, 4096, 128,256, bfloat16 first.
    Cases of one shape and dtype are consecutive, so that they share their inputs. ``quick``:
    N = 1024, V = 8192 (H = 256), the same mixes."""
    shapes = [(1024, 8192)] if quick else [(8192, 128_256), (16_384, 32_768)]
    logits = [
        Case("logits", n, v, 0, dtype, False, ignored, upstream)
        for n, v in shapes
        for dtype in ["bfloat16", "float32"]
        for ignored, upstream in GPU_LABEL_MIXES
    ]
    n, v, h = (1024, 8192, 256) if quick else (8192, 128_256, 4096)
    linear = [Case("linear", n, v, h, dtype, False) for dtype in ["bfloat16", "float32"]]
    return logits + linear


def quick_cases() -> list[Case]:
    logits = [
        Case("logits", 1024, 8192, 0, dtype, reweigh)
        for dtype in ["float32", "bfloat16"]
        for reweigh in [False, True]
    ]
    linear = [Case("linear", 1024, 8192, 256, dtype, False) for dtype in ["float32", "bfloat16"]]
    return logits + linear


# ------------------------------------------------------------------ inputs


@functools.cache
def tokenizer(vocab_size: int) -> Any:
    """A WordLevel tokenizer whose ids 100..109 are the digits and every other id a word."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = {"<unk>": 0, **{f"w{i}": i for i in range(1, vocab_size)}}
    for digit in range(10):
        del words[f"w{FIRST_DIGIT_ID + digit}"]
        words[str(digit)] = FIRST_DIGIT_ID + digit
    backend = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


@functools.cache
def number_vocab(vocab_size: int) -> NumberVocab:
    """The digits at ids 100..109: what NumberVocab.from_tokenizer(tokenizer(V)) reads, without
    needing transformers (a bare GPU machine may lack it)."""
    digits = {FIRST_DIGIT_ID + d: str(d) for d in range(10)}
    return NumberVocab.from_values(digits, vocab_size=vocab_size)


def make_inputs(case: Case, device: torch.device) -> dict[str, torch.Tensor]:
    """Leaves (``logits`` or ``hidden`` + ``weight``) requiring grad, and ``labels``: 10% digits,
    ``case.ignored_fraction`` ignore_index (5 % by default), the rest other tokens. Deterministic
    for a case. On CUDA the leaves are drawn on the device (:func:`device_leaves`)."""
    generator = torch.Generator().manual_seed(0)
    batch = max(1, case.tokens // SEQUENCE_LENGTH)
    shape = (batch, case.tokens // batch)
    labels = torch.randint(FIRST_DIGIT_ID + 10, case.vocab_size, shape, generator=generator)
    choice = torch.rand(shape, generator=generator)
    digits = FIRST_DIGIT_ID + torch.randint(10, shape, generator=generator)
    labels = torch.where(choice < NUMBER_FRACTION, digits, labels)
    ignored = choice > 1 - case.ignored_fraction
    labels = torch.where(ignored, torch.full_like(labels, -100), labels)
    if device.type == "cuda":
        key = (case.suite, shape, case.vocab_size, case.hidden_size, case.dtype, str(device))
        return {**device_leaves(key), "labels": labels.to(device)}
    if case.suite == "logits":
        logits = 2 * torch.randn(*shape, case.vocab_size, generator=generator)
        return {
            "logits": logits.to(device, case.torch_dtype).requires_grad_(),
            "labels": labels.to(device),
        }
    hidden = torch.randn(*shape, case.hidden_size, generator=generator)
    weight = torch.randn(case.vocab_size, case.hidden_size, generator=generator)
    weight /= case.hidden_size**0.5
    return {
        "hidden": hidden.to(device, case.torch_dtype).requires_grad_(),
        "weight": weight.to(device, case.torch_dtype).requires_grad_(),
        "labels": labels.to(device),
    }


@functools.lru_cache(maxsize=1)
def device_leaves(key: tuple[Any, ...]) -> dict[str, torch.Tensor]:
    """The leaves of a case on its GPU, drawn there by a CUDA generator in their dtype (the logits
    ~ N(0, 4); the hidden states ~ N(0, 1), the weight ~ N(0, 1/H)), and kept for the next case of
    the same shape and dtype (one set at a time)."""
    suite, shape, vocab_size, hidden_size, dtype, device = key
    generator = torch.Generator(device).manual_seed(0)
    draw = functools.partial(
        torch.randn, generator=generator, device=device, dtype=getattr(torch, dtype)
    )
    if suite == "logits":
        return {"logits": draw(*shape, vocab_size).mul_(2).requires_grad_()}
    hidden = draw(*shape, hidden_size)
    weight = draw(vocab_size, hidden_size).div_(hidden_size**0.5)
    return {"hidden": hidden.requires_grad_(), "weight": weight.requires_grad_()}


def leaves(inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    return [t for name, t in inputs.items() if name != "labels"]


# ------------------------------------------------------------------ variants

Variant = Callable[[Case, dict[str, torch.Tensor]], torch.Tensor]


def _cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def _ce_plus_ntl(case: Case, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    ntl = number_token_loss(logits, labels, number_vocab(case.vocab_size), reweigh=case.reweigh)
    return _cross_entropy(logits, labels) + NTL_WEIGHT * ntl


def _fused(
    case: Case, logits: torch.Tensor, labels: torch.Tensor, inplace: bool, impl: str = "auto"
) -> torch.Tensor:
    """``cross_entropy_with_ntl``; ``impl="auto"`` is ``F.cross_entropy`` beside the number head
    on CUDA, the torch row passes on CPU."""
    vocab = number_vocab(case.vocab_size)
    out = cross_entropy_with_ntl(
        logits, labels, vocab, reweigh=case.reweigh, inplace_backward=inplace, impl=impl
    )
    return out.loss


def _fused_in_blocks(case: Case, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The Triton kernels with rows of at most 16,384 columns on chip (the default is 32,768):
    half the registers a program, two programs an SM, and rows above that read twice (private
    knob, benchmark only: the block size was chosen without a GPU at hand)."""
    from numtok.ops.kernels import triton_loss

    widest = triton_loss._MAX_BLOCK_V
    triton_loss._MAX_BLOCK_V = 1 << 14
    try:
        return _fused(case, logits, labels, False, impl="triton")
    finally:
        triton_loss._MAX_BLOCK_V = widest


def _linear(
    case: Case, x: dict[str, torch.Tensor], *, recompute: bool, impl: str = "auto"
) -> torch.Tensor:
    """``linear_cross_entropy_with_ntl``; with ``recompute``, differentiable ``loss_weights`` (all
    1: the same loss) send it to the pass that recomputes the logits in backward (on the torch
    row passes)."""
    labels = x["labels"]
    weights = torch.ones(labels.shape, device=labels.device).requires_grad_() if recompute else None
    vocab = number_vocab(case.vocab_size)
    out = linear_cross_entropy_with_ntl(
        x["hidden"], x["weight"], labels, vocab, reweigh=case.reweigh, loss_weights=weights,
        impl=impl,
    )  # fmt: skip
    return out.loss


@functools.cache
def _ntloss(vocab_size: int, reweigh: bool) -> Any:
    from loguru import logger
    from ntloss import NTLoss

    logger.disable("ntloss")
    return NTLoss(tokenizer(vocab_size), vocab_size=vocab_size, reweigh=reweigh)


class _FusedCrossEntropyOnly(torch.autograd.Function):
    """numtok's fused pass with the cross-entropy term alone (mean over non-ignored labels): the
    baseline of NTL's marginal cost inside the fused path (private API, benchmark only)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        flat, targets = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
        is_target = targets != -100
        targets = torch.where(is_target, targets, 0)
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        count = is_target.sum().clamp_min(1)
        weight = is_target.to(dtype) / count  # (M,) ∂loss/∂lse
        no_numbers = targets.new_empty(0)

        def row_gradients(
            rows: slice, _: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            return weight[rows], -weight[rows], weight.new_empty(len(weight[rows]), 0)

        target_logit = flat.gather(1, targets[:, None]).squeeze(1).to(dtype)
        ctx.gradient = torch.empty_like(flat)
        lse = statistics_and_gradient(flat, ctx.gradient, targets, no_numbers, dtype, row_gradients)
        ctx.shape = logits.shape
        return torch.where(is_target, lse - target_logit, 0).sum() / count

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if not (grad.device.type == "cpu" and bool(grad == 1)):  # as cross_entropy_with_ntl
            ctx.gradient.mul_(grad)
        return ctx.gradient.view(ctx.shape), None


def _liger_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    from liger_kernel.transformers import LigerCrossEntropyLoss

    flat = logits.reshape(-1, logits.shape[-1])
    return LigerCrossEntropyLoss()(flat, labels.reshape(-1))  # type: ignore[no-any-return]


def _liger_linear_cross_entropy(x: dict[str, torch.Tensor]) -> torch.Tensor:
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    hidden = x["hidden"].reshape(-1, x["hidden"].shape[-1])
    loss = LigerFusedLinearCrossEntropyLoss()(x["weight"], hidden, x["labels"].reshape(-1))
    return loss  # type: ignore[no-any-return]


LOGITS_VARIANTS: dict[str, Variant] = {
    "F.cross_entropy": lambda case, x: _cross_entropy(x["logits"], x["labels"]),
    "CE + number_token_loss": lambda case, x: _ce_plus_ntl(case, x["logits"], x["labels"]),
    "cross_entropy_with_ntl": lambda case, x: _fused(case, x["logits"], x["labels"], False),
    "cross_entropy_with_ntl inplace": lambda case, x: _fused(case, x["logits"], x["labels"], True),
    "fused CE only": lambda case, x: _FusedCrossEntropyOnly.apply(x["logits"], x["labels"]),
    "CE + ntloss 0.3.2": lambda case, x: (
        _cross_entropy(x["logits"], x["labels"])
        + NTL_WEIGHT * _ntloss(case.vocab_size, case.reweigh)(x["logits"], x["labels"])
    ),
}
LINEAR_VARIANTS: dict[str, Variant] = {
    "materialised + CE + number_token_loss": lambda case, x: _ce_plus_ntl(
        case, x["hidden"] @ x["weight"].T, x["labels"]
    ),
    "materialised + cross_entropy_with_ntl": lambda case, x: _fused(
        case, x["hidden"] @ x["weight"].T, x["labels"], False
    ),
    "materialised + cross_entropy_with_ntl inplace": lambda case, x: _fused(
        case, x["hidden"] @ x["weight"].T, x["labels"], True
    ),
    "linear_cross_entropy_with_ntl": lambda case, x: _linear(case, x, recompute=False),
    "linear_cross_entropy_with_ntl (recompute in backward)": lambda case, x: _linear(
        case, x, recompute=True
    ),
}
# On CUDA the default (impl="auto") is F.cross_entropy beside the number head from the logits, and
# the torch row passes logits-free; the Triton kernels (opt-in) and the torch row passes beside it.
CUDA_VARIANTS: dict[str, dict[str, Variant]] = {
    "logits": {
        "cross_entropy_with_ntl impl=triton": lambda case, x: _fused(
            case, x["logits"], x["labels"], False, impl="triton"
        ),
        "cross_entropy_with_ntl inplace impl=triton": lambda case, x: _fused(
            case, x["logits"], x["labels"], True, impl="triton"
        ),
        "cross_entropy_with_ntl impl=torch": lambda case, x: _fused(
            case, x["logits"], x["labels"], False, impl="torch"
        ),
        "cross_entropy_with_ntl inplace impl=torch": lambda case, x: _fused(
            case, x["logits"], x["labels"], True, impl="torch"
        ),
        "cross_entropy_with_ntl blocks of 16k": lambda case, x: _fused_in_blocks(
            case, x["logits"], x["labels"]
        ),
    },
    "linear": {
        "linear_cross_entropy_with_ntl impl=triton": lambda case, x: _linear(
            case, x, recompute=False, impl="triton"
        ),
    },
}
# Liger-Kernel (Triton, GPUs only) computes cross-entropy alone: checked against PyTorch's.
LIGER_VARIANTS: dict[str, dict[str, Variant]] = {
    "logits": {
        "Liger CE (no NTL)": lambda case, x: _liger_cross_entropy(x["logits"], x["labels"]),
    },
    "linear": {
        "materialised + F.cross_entropy": lambda case, x: _cross_entropy(
            x["hidden"] @ x["weight"].T, x["labels"]
        ),
        "Liger fused linear CE (no NTL)": lambda case, x: _liger_linear_cross_entropy(x),
    },
}
# Variants that overwrite their input logits: each call gets a fresh copy, made before the timer.
CONSUMES_LOGITS = {
    "cross_entropy_with_ntl inplace",
    "cross_entropy_with_ntl inplace impl=torch",
    "cross_entropy_with_ntl inplace impl=triton",
}
# The reference each variant is checked against, and the baseline of the time/memory ratios.
REFERENCE = {"logits": "CE + number_token_loss", "linear": "materialised + CE + number_token_loss"}
CE_REFERENCE = {"logits": "F.cross_entropy", "linear": "materialised + F.cross_entropy"}
CE_ONLY = {"F.cross_entropy", "fused CE only", *(v for d in LIGER_VARIANTS.values() for v in d)}
BASELINE = {"logits": "F.cross_entropy", "linear": "materialised + CE + number_token_loss"}


def importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def variants(case: Case, device: torch.device) -> dict[str, Variant]:
    """The variants of the case's suite that can run here: ntloss where it and transformers
    are installed; on CUDA the torch backend beside the default Triton one, and Liger-Kernel's
    where it is installed."""
    found = dict(LOGITS_VARIANTS if case.suite == "logits" else LINEAR_VARIANTS)
    if not (importable("ntloss") and importable("transformers")):
        found = {name: v for name, v in found.items() if "ntloss" not in name}
    if device.type == "cuda":
        found |= CUDA_VARIANTS[case.suite]
    if device.type == "cuda" and importable("liger_kernel.transformers"):
        found |= LIGER_VARIANTS[case.suite]
    return found


def selected(case: Case, found: dict[str, Variant], names: list[str] | None) -> dict[str, Variant]:
    """``found`` restricted to ``names`` (all when None), always with the case's baseline and
    the references the kept variants are checked against."""
    if names is None:
        return found
    keep = {*names, BASELINE[case.suite], *(reference_of(case, name) for name in names)}
    return {name: variant for name, variant in found.items() if name in keep}


def reference_of(case: Case, name: str) -> str:
    return CE_REFERENCE[case.suite] if name in CE_ONLY else REFERENCE[case.suite]


def compiled_variants(found: dict[str, Variant], names: set[str]) -> dict[str, Variant]:
    """The variants ``names`` through ``torch.compile`` (default backend), compiled on their
    first call; the rest as they are (the unfused references need no compiling to check the
    others)."""
    return {
        name: torch.compile(variant) if name in names else variant
        for name, variant in found.items()
    }


# ------------------------------------------------------------------ correctness, timing


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Clock:
    """Seconds between marks: CUDA events on a CUDA device (read once, after the last mark; the
    stream is synchronised at the start), ``time.perf_counter`` elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        synchronize(device)
        self.marks: list[Any] = []
        self.mark()

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def intervals(self) -> list[float]:
        """Seconds from each mark to the next (waits for the last CUDA event)."""
        if self.cuda:
            self.marks[-1].synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in itertools.pairwise(self.marks)]
        return [b - a for a, b in itertools.pairwise(self.marks)]


def copy_bandwidth(tensor: torch.Tensor, repeats: int = 10) -> int:
    """GB/s of the device's own copy of ``tensor`` (one read and one write), the median of
    ``repeats`` copies after a warm-up, timed with CUDA events: the practical peak a row pass can
    approach."""
    target = torch.empty_like(tensor)
    times = []
    for index in range(repeats + 2):
        clock = Clock(tensor.device)
        target.copy_(tensor)
        clock.mark()
        if index >= 2:
            times.append(clock.intervals()[0])
    times.sort()
    return round(2 * tensor.nbytes / times[len(times) // 2] / 1e9)


def backward(case: Case, loss: torch.Tensor) -> None:
    """``loss.backward()``, with the case's upstream gradient when it is not 1."""
    if case.upstream == 1:
        loss.backward()
    else:
        loss.backward(torch.full_like(loss, case.upstream))


def call_inputs(name: str, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inputs of one call: a fresh copy of the logits for a variant that overwrites them."""
    if name not in CONSUMES_LOGITS:
        return inputs
    return {**inputs, "logits": inputs["logits"].detach().clone().requires_grad_()}


def run_once(
    case: Case, variant: Variant, inputs: dict[str, torch.Tensor]
) -> tuple[float, float, float]:
    """(forward, backward) seconds of one training step of the loss (on CUDA from events, on the
    device's clock; elsewhere wall-clock, with a synchronisation before each reading), and the
    CPU seconds of the whole step (user + system: robust to other processes on a shared
    machine). Gradients land in .grad."""
    device = inputs["labels"].device
    for leaf in leaves(inputs):
        leaf.grad = None
    cpu_start = time.process_time()
    clock = Clock(device)
    loss = variant(case, inputs)
    if not clock.cuda:
        synchronize(device)
    clock.mark()
    backward(case, loss)
    clock.mark()
    forward_seconds, backward_seconds = clock.intervals()
    return forward_seconds, backward_seconds, time.process_time() - cpu_start


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """||value - reference|| / ||reference|| over row chunks (no full-size float32 temporaries)."""
    rows_value, rows_reference = (
        value.reshape(-1, value.shape[-1]),
        reference.reshape(-1, value.shape[-1]),
    )
    difference = total = 0.0
    for start in range(0, rows_value.shape[0], 256):
        a = rows_value[start : start + 256].double()
        b = rows_reference[start : start + 256].double()
        difference += float((a - b).square().sum())
        total += float(b.square().sum())
    return (difference / max(total, 1e-300)) ** 0.5


TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2}  # relative error of value and of each gradient


def check_variants(
    case: Case, found: dict[str, Variant], inputs: dict[str, torch.Tensor]
) -> dict[str, float]:
    """Run every variant once (also the warm-up and, with --compile, the compilation) and
    compare value and gradients with its reference; raises if a variant is off. Returns the
    largest relative error per variant; a variant other than the baseline and the references
    that fails to run is reported and left out."""
    results: dict[str, tuple[torch.Tensor, list[torch.Tensor]]] = {}
    references = {REFERENCE[case.suite], CE_REFERENCE[case.suite]}
    errors = {}
    for name in sorted(found, key=lambda n: n not in references):
        call = call_inputs(name, inputs)
        for leaf in leaves(call):
            leaf.grad = None
        try:
            loss = found[name](case, call)
            backward(case, loss)
        except Exception as error:  # a variant that cannot run here (a GPU library, compile)
            if name in references or name == BASELINE[case.suite]:
                raise
            print(f"{case.label()}: {name} skipped: {error!r}"[:500], file=sys.stderr)
            continue
        grads = [leaf.grad for leaf in leaves(call)]
        assert all(g is not None for g in grads)
        if name in references:
            results[name] = (loss.detach().float(), grads)  # type: ignore[assignment]
        reference_value, reference_grads = results[reference_of(case, name)]
        error = max(
            [abs(float(loss.detach().float() - reference_value)) / abs(float(reference_value))]
            + [relative_error(g, r) for g, r in zip(grads, reference_grads, strict=True)]  # type: ignore[arg-type]
        )
        if error > TOLERANCE[case.dtype]:
            raise AssertionError(f"{case.label()}: {name} is off by {error:.2e} relative")
        errors[name] = error
    for leaf in leaves(inputs):
        leaf.grad = None
    return errors


def time_rounds(
    case: Case,
    found: dict[str, Variant],
    inputs: dict[str, torch.Tensor],
    rounds: int,
    warm_up: bool,
) -> dict[str, dict[str, list[float]]]:
    """With ``warm_up`` one untimed round, then ``rounds`` timed ones with the variants
    interleaved."""
    names = list(found)
    samples: dict[str, dict[str, list[float]]] = {
        n: {"forward": [], "backward": [], "full": [], "cpu": []} for n in names
    }
    for round_index in range(-1 if warm_up else 0, rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            forward, backward, cpu = run_once(case, found[name], call_inputs(name, inputs))
            if round_index >= 0:
                samples[name]["forward"].append(forward)
                samples[name]["backward"].append(backward)
                samples[name]["full"].append(forward + backward)
                samples[name]["cpu"].append(cpu)
    return samples


# ------------------------------------------------------------------ memory


def probe_memory(case: Case, name: str) -> int:
    """In this (fresh) process: peak resident memory added by one forward + backward."""
    cpu = torch.device("cpu")
    inputs = call_inputs(name, make_inputs(case, cpu))
    variant = variants(case, cpu)[name]
    # Warm up lazily initialised machinery (thread pools, dispatch, ntloss caches) on four
    # positions per sequence, so that only the measured call's own buffers are counted.
    small = {
        k: v if k == "weight" else v.detach()[:, :4].clone().requires_grad_(v.requires_grad)
        for k, v in inputs.items()
    }
    run_once(case, variant, small)
    del small
    baseline = reset_peak_memory()
    run_once(case, variant, inputs)
    return proc_status("VmHWM") - baseline


def measure_memory(
    case: Case,
    name: str,
    variant: Variant,
    threads: int,
    device: torch.device,
    inputs: dict[str, torch.Tensor],
) -> int:
    """Peak extra memory of one step: in a fresh subprocess on CPU (eager), in process on CUDA
    (``variant`` as timed, on the timed ``inputs``)."""
    if device.type == "cuda":
        inputs = call_inputs(name, inputs)
        for leaf in leaves(inputs):
            leaf.grad = None
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        baseline = torch.cuda.memory_allocated(device)
        run_once(case, variant, inputs)
        return torch.cuda.max_memory_allocated(device) - baseline
    command = [
        sys.executable,
        __file__,
        "--probe-memory",
        json.dumps([dataclasses.asdict(case), name]),
        "--threads",
        str(threads),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    output = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    return int(output.strip().splitlines()[-1])


# ------------------------------------------------------------------ main


def thread_counts(text: str) -> list[int]:
    """``"1,max"`` -> [1, usable cores]; duplicates dropped, order kept."""
    counts = [usable_cores() if part == "max" else int(part) for part in text.split(",")]
    return list(dict.fromkeys(counts))


def label_of(row: dict[str, Any]) -> str:
    """The case label of a row (rows written before a field existed take its default)."""
    return Case(**{f.name: row.get(f.name, f.default) for f in dataclasses.fields(Case)}).label()


def run_case(
    case: Case, args: argparse.Namespace, threads: list[int], meta: dict[str, Any]
) -> list[dict[str, Any]]:
    device = torch.device(args.device)
    found = selected(case, variants(case, device), args.variants)
    compiled = set(found if args.variants is None else args.variants) if args.compile else set()
    found = compiled_variants(found, compiled)
    inputs = make_inputs(case, device)
    on_gpu_logits = device.type == "cuda" and case.suite == "logits"
    if on_gpu_logits:
        meta = {**meta, "device_copy_gbps": copy_bandwidth(inputs["logits"].detach())}
    errors = check_variants(case, found, inputs)
    found = {name: variant for name, variant in found.items() if name in errors}
    rounds = args.rounds if case.suite == "logits" else args.linear_rounds
    memory = (
        {}
        if args.no_memory
        else {
            name: measure_memory(case, name, variant, threads[-1], device, inputs)
            for name, variant in found.items()
        }
    )
    rows = []
    for count in threads:
        torch.set_num_threads(count)
        print(f"== {case.label()}: {count} thread(s), {rounds} rounds", file=sys.stderr, flush=True)
        # The check round warmed up the first thread count; a linear step takes seconds, so
        # thread pools are warm after its first kernel anyway.
        warm_up = count != threads[0] and case.suite == "logits"
        samples = time_rounds(case, found, inputs, rounds, warm_up)
        case_fields = {
            **dataclasses.asdict(case),
            "number_fraction": NUMBER_FRACTION,
            "ntl_weight": NTL_WEIGHT,
        }
        rows += case_rows(
            case_fields,
            case.logits_bytes,
            samples,
            errors,
            memory if count == threads[-1] else {},
            BASELINE[case.suite],
            {**meta, "threads": count},
            moved_bytes=2 * case.logits_bytes if on_gpu_logits else None,
        )
    for row in rows:
        row["compiled"] = row["variant"] in compiled
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes: a smoke run")
    parser.add_argument(
        "--gpu-cases",
        action="store_true",
        help="gpu.sh's cases (gpu_cases): 5 %% and 50 %% ignored labels, an upstream gradient of "
        "0.37, bfloat16 first; with --quick at the quick shapes",
    )
    parser.add_argument(
        "--threads",
        default="1,max",
        help="comma-separated torch thread counts, 'max' = all usable cores (default 1,max)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds, logits suite")
    parser.add_argument("--linear-rounds", type=int, default=3, help="timed rounds, linear suite")
    parser.add_argument("--suite", choices=["logits", "linear", "all"], default="all")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "all"], default="all")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the variants (those of --variants when given)",
    )
    parser.add_argument(
        "--variants",
        type=lambda text: text.split(","),
        help="comma-separated variant names to run (the baseline and the references come too)",
    )
    parser.add_argument(
        "--cases",
        type=lambda text: text.split(","),
        help="comma-separated substrings: run the cases whose label contains one of them",
    )
    parser.add_argument(
        "--summarize",
        type=Path,
        help="print the Markdown summary of a results JSONL file and exit",
    )
    parser.add_argument(
        "--no-memory", action="store_true", help="skip the peak-memory measurements"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="JSONL file (default: results/<date>T<time>-<device>-t<threads>.jsonl; none for "
        "--quick); a Markdown summary is written beside it",
    )
    parser.add_argument("--probe-memory", help=argparse.SUPPRESS)
    args = parser.parse_args()
    threads = thread_counts(args.threads)
    if args.summarize:
        rows = [json.loads(line) for line in args.summarize.read_text().splitlines() if line]
        print(summary_table(rows, label_of))
        return

    if args.probe_memory:
        torch.set_num_threads(threads[-1])
        case_fields, name = json.loads(args.probe_memory)
        print(probe_memory(Case(**case_fields), name))
        return

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    if args.gpu_cases:
        cases = gpu_cases(args.quick)
    else:
        cases = quick_cases() if args.quick else default_cases(device)
    cases = [c for c in cases if args.suite in ("all", c.suite) and args.dtype in ("all", c.dtype)]
    if args.cases:
        cases = [c for c in cases if any(part in c.label() for part in args.cases)]
    meta = provenance(device, args.compile)
    out = args.out
    if out is None and not args.quick:
        stamp = meta["date"][:16].replace(":", "")  # 2026-11-29T2215
        out = RESULTS / f"{stamp}-{device.type}-t{'+'.join(map(str, threads))}.jsonl"
    rows: list[dict[str, Any]] = []
    for case in cases:
        new_rows = run_case(case, args, threads, meta)
        rows += new_rows
        print(summary_table(new_rows, label_of), file=sys.stderr, flush=True)
        if out is not None:  # after every case: a run stopped at a time limit keeps its cases
            out.parent.mkdir(parents=True, exist_ok=True)
            with out.open("a") as file:
                file.writelines(json.dumps(row) + "\n" for row in new_rows)
            out.with_suffix(".md").write_text(summary_table(rows, label_of) + "\n")
    print(summary_table(rows, label_of))
    if out is not None:
        print(f"results: {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
