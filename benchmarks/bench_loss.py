"""CE + NTL benchmark: time (forward, backward, full) and peak memory of every variant on identical
inputs, as ratios against plain ``F.cross_entropy`` (logits suite) or the materialised output
layer (linear suite) measured in the same run, at one thread and at all cores.

    python benchmarks/bench_loss.py               # default suite, results in benchmarks/results/
    python benchmarks/bench_loss.py --quick       # small shapes, a smoke run of everything
    python benchmarks/bench_loss.py --device cuda --compile   # on a GPU, torch.compile'd
    python benchmarks/bench_loss.py --device cuda --gpu-cases # gpu.sh's: 5 % and 50 % ignored,
                                                              # an upstream gradient of 0.37

Method (see benchmarks/README.md; the check, the clock and the memory probe are
benchmarks/runner.py's): for each case the first round checks each variant's value and
gradients against the unfused reference and warms up; then, for each thread count in turn
(after the first, with an untimed warm-up round for the logits suite), ``--rounds`` timed rounds
with the variants interleaved (the order rotates each round). Medians with p20/p80; each row
also holds its ratios to the anchors that ran (``F.cross_entropy``, Liger's cross-entropy,
``F.cross_entropy`` + ntloss). Peak memory is measured for each variant once per case, at the
largest thread count (in a fresh process on CPU, in process on CUDA), reported as a multiple of
the logits' size. On CUDA the inputs are drawn on the device (a CUDA generator, in their dtype:
no host-side sampling of 10^9 values) and kept for the next case of the same shape and dtype.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from anchors import (
    DIGITS,
    FIRST_NUMBER_ID,
    cross_entropy,
    liger_available,
    liger_cross_entropy,
    liger_linear_cross_entropy,
    ntloss,
    ntloss_available,
    vocabularies,
)
from bench_common import provenance, summary_table, usable_cores
from runner import (
    Clock,
    Implementation,
    Inputs,
    case_rows,
    in_fresh_process,
    peak_of_step,
    probe,
    run,
)
from torch.autograd.function import once_differentiable

from numtok import NumberVocab, number_token_loss
from numtok.losses.fused import cross_entropy_with_ntl
from numtok.losses.linear import linear_cross_entropy_with_ntl
from numtok.ops.kernels.torch_rows import statistics_and_gradient

RESULTS = Path(__file__).resolve().parent / "results"
NTL_WEIGHT = 0.3
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


def number_vocab(vocab_size: int) -> NumberVocab:
    """The digits at ids 100..109 (what ntloss's tokenizer of anchors.ntloss_of holds)."""
    return vocabularies(vocab_size)[DIGITS]


def make_inputs(case: Case, device: torch.device) -> dict[str, torch.Tensor]:
    """Leaves (``logits`` or ``hidden`` + ``weight``) requiring grad, and ``labels``: 10% digits,
    ``case.ignored_fraction`` ignore_index (5 % by default), the rest other tokens. Deterministic
    for a case. On CUDA the leaves are drawn on the device (:func:`device_leaves`)."""
    generator = torch.Generator().manual_seed(0)
    batch = max(1, case.tokens // SEQUENCE_LENGTH)
    shape = (batch, case.tokens // batch)
    labels = torch.randint(FIRST_NUMBER_ID + 10, case.vocab_size, shape, generator=generator)
    choice = torch.rand(shape, generator=generator)
    digits = FIRST_NUMBER_ID + torch.randint(10, shape, generator=generator)
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


# ------------------------------------------------------------------ implementations

Loss = Callable[[Case, Inputs], torch.Tensor]


def _ce_plus_ntl(case: Case, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    ntl = number_token_loss(logits, labels, number_vocab(case.vocab_size), reweigh=case.reweigh)
    return cross_entropy(logits, labels) + NTL_WEIGHT * ntl


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


def _linear(case: Case, x: Inputs, *, recompute: bool, impl: str = "auto") -> torch.Tensor:
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


LOGITS_VARIANTS: dict[str, Loss] = {
    "F.cross_entropy": lambda case, x: cross_entropy(x["logits"], x["labels"]),
    "CE + number_token_loss": lambda case, x: _ce_plus_ntl(case, x["logits"], x["labels"]),
    "cross_entropy_with_ntl": lambda case, x: _fused(case, x["logits"], x["labels"], False),
    "cross_entropy_with_ntl inplace": lambda case, x: _fused(case, x["logits"], x["labels"], True),
    "fused CE only": lambda case, x: _FusedCrossEntropyOnly.apply(x["logits"], x["labels"]),
}
# ntloss 0.3.2 (the authors' package) where it and transformers are installed.
NTLOSS_VARIANTS: dict[str, Loss] = {
    "CE + ntloss 0.3.2": lambda case, x: (
        cross_entropy(x["logits"], x["labels"])
        + NTL_WEIGHT * ntloss(x["logits"], x["labels"], case.reweigh)
    ),
}
LINEAR_VARIANTS: dict[str, Loss] = {
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
CUDA_VARIANTS: dict[str, dict[str, Loss]] = {
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
LIGER_VARIANTS: dict[str, dict[str, Loss]] = {
    "logits": {
        "Liger CE (no NTL)": lambda case, x: liger_cross_entropy(x["logits"], x["labels"]),
    },
    "linear": {
        "materialised + F.cross_entropy": lambda case, x: cross_entropy(
            x["hidden"] @ x["weight"].T, x["labels"]
        ),
        "Liger fused linear CE (no NTL)": lambda case, x: liger_linear_cross_entropy(
            x["hidden"], x["weight"], x["labels"]
        ),
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
# The comparison points every row's ratios_to_anchors holds.
ANCHORS = {
    *CE_REFERENCE.values(),
    *NTLOSS_VARIANTS,
    *(v for d in LIGER_VARIANTS.values() for v in d),
}
TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2}  # relative error of value and of each gradient


def reference_of(case: Case, name: str) -> str | None:
    """The implementation ``name`` is checked against (None: it is a reference)."""
    if name in (REFERENCE[case.suite], CE_REFERENCE[case.suite]):
        return None
    return CE_REFERENCE[case.suite] if name in CE_ONLY else REFERENCE[case.suite]


def implementations(case: Case, device: torch.device) -> list[Implementation]:
    """The variants of the case's suite that can run here: ntloss where it and transformers
    are installed; on CUDA the torch backend beside the default Triton one, and Liger-Kernel's
    where it is installed."""
    found = dict(LOGITS_VARIANTS if case.suite == "logits" else LINEAR_VARIANTS)
    if case.suite == "logits" and ntloss_available():
        found |= NTLOSS_VARIANTS
    if device.type == "cuda":
        found |= CUDA_VARIANTS[case.suite]
    if device.type == "cuda" and liger_available():
        found |= LIGER_VARIANTS[case.suite]
    return [
        Implementation(
            name,
            functools.partial(loss, case),
            reference=reference_of(case, name),
            required=name == BASELINE[case.suite],
            consumes=("logits",) if name in CONSUMES_LOGITS else (),
            anchor=name in ANCHORS,
        )
        for name, loss in found.items()
    ]


def selected(
    case: Case, found: list[Implementation], names: list[str] | None
) -> list[Implementation]:
    """``found`` restricted to ``names`` (all when None), always with the case's baseline and
    the references the kept variants are checked against."""
    if names is None:
        return found
    keep = {*names, BASELINE[case.suite], *(reference_of(case, name) for name in names)}
    return [implementation for implementation in found if implementation.name in keep]


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


def probe_peak(spec: dict[str, Any]) -> int:
    """In a fresh process (runner.in_fresh_process): the variant's peak on the case's inputs on
    CPU (runner.probe), after a warm-up on four positions of each sequence."""
    case, cpu = Case(**spec["case"]), torch.device("cpu")
    inputs = make_inputs(case, cpu)
    implementation = next(i for i in implementations(case, cpu) if i.name == spec["variant"])
    warm = {
        k: v if k == "weight" else v.detach()[:, :4].clone().requires_grad_(v.requires_grad)
        for k, v in inputs.items()
    }
    return probe(implementation, inputs, warm, case.upstream)


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
    found = selected(case, implementations(case, device), args.variants)
    names = {i.name for i in found} if args.variants is None else set(args.variants)
    compiled = names if args.compile else set()
    # The unfused references need no compiling to check the others.
    found = [
        dataclasses.replace(i, loss=torch.compile(i.loss)) if i.name in compiled else i
        for i in found
    ]
    inputs = make_inputs(case, device)
    on_gpu_logits = device.type == "cuda" and case.suite == "logits"
    if on_gpu_logits:
        meta = {**meta, "device_copy_gbps": copy_bandwidth(inputs["logits"].detach())}
    peak: Callable[[Implementation], int] | None = None
    if args.no_memory:
        peak = None
    elif device.type == "cuda":
        peak = functools.partial(peak_of_step, inputs=inputs, upstream=case.upstream)
    else:
        spec = dataclasses.asdict(case)
        peak = lambda i: in_fresh_process(  # noqa: E731
            "bench_loss", "probe_peak", {"case": spec, "variant": i.name}, threads[-1]
        )
    print(f"== {case.label()}", file=sys.stderr, flush=True)
    measured = run(
        found,
        inputs,
        tolerance=TOLERANCE[case.dtype],
        rounds=args.rounds if case.suite == "logits" else args.linear_rounds,
        threads=threads,
        peak=peak,
        upstream=case.upstream,
        # The check round warmed up the first thread count; a linear step takes seconds, so
        # thread pools are warm after its first kernel anyway.
        warm_up_each_thread_count=case.suite == "logits",
    )
    case_fields = {
        **dataclasses.asdict(case),
        "number_fraction": NUMBER_FRACTION,
        "ntl_weight": NTL_WEIGHT,
    }
    rows = []
    for count in threads:
        rows += case_rows(
            case_fields,
            case.logits_bytes,
            measured,
            count,
            BASELINE[case.suite],
            {**meta, "threads": count},
            with_memory=count == threads[-1],
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
    args = parser.parse_args()
    threads = thread_counts(args.threads)
    if args.summarize:
        rows = [json.loads(line) for line in args.summarize.read_text().splitlines() if line]
        print(summary_table(rows, label_of))
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
