"""Which backend computes a loss: ``impl="auto" | "torch" | "triton"``, Cut Cross-Entropy's
convention.

``"auto"`` runs only code that has run on the hardware it targets. On CPU that is numtok's torch
row passes (:mod:`numtok.kernels.torch_rows`, measured faster than ``F.cross_entropy`` alone
there). On a GPU (any device but the CPU) it is PyTorch's own cross-entropy with NTL from the
number head beside it: ``F.cross_entropy`` + :func:`numtok.number_token_loss` on given logits
(:func:`unfused_by_default`), and the chunked torch path for logits-free losses. The Triton
kernels have not run on a GPU yet (no committed hardware run in ``benchmarks/results/``), so they
are opt-in: ``impl="triton"``.

The environment variable ``NUMTOK_IMPL`` (``auto``, ``torch`` or ``triton``) says what
``"auto"`` means, for tests and CI (with ``triton``, tensors on every device take the Triton
kernels, CPU ones under the interpreter; with ``torch``, the row passes on every device).
``"triton"`` on CPU tensors runs under Triton's interpreter when ``TRITON_INTERPRET=1`` is set
(slow: for tests on small shapes) and is refused otherwise. Settings the Triton kernels do not
compute (a callable ``kind``, ``loss_weights`` that require grad) take the torch path under
``$NUMTOK_IMPL=triton`` and are refused under ``impl="triton"``.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Literal

import torch

from numtok._ntl_maths import LossSpec

__all__ = [
    "IMPLS",
    "Impl",
    "check_impl",
    "resolve_impl",
    "triton_importable",
    "triton_unsupported",
    "unfused_by_default",
]

Impl = Literal["auto", "torch", "triton"]
IMPLS = ("auto", "torch", "triton")
#: The environment variable that says what ``impl="auto"`` means.
IMPL_VARIABLE = "NUMTOK_IMPL"


def check_impl(impl: object) -> str:
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    return str(impl)


def _find_triton() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # a module hidden as None in sys.modules has no spec
        return False


_TRITON_FOUND = _find_triton()


def triton_importable() -> bool:
    """Whether ``triton`` is installed (found without importing it)."""
    return _TRITON_FOUND


def triton_unsupported(spec: LossSpec, *, weights_need_grad: bool) -> str | None:
    """What of these settings the Triton kernels do not compute (a phrase for an error), or
    None when they compute all of it."""
    if spec.callable_kind:
        return f"a callable kind ({spec.kind!r})"
    if weights_need_grad:
        return "loss_weights that require grad"
    return None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _auto() -> str:
    chosen = os.environ.get(IMPL_VARIABLE, "auto")
    if chosen not in IMPLS:
        raise ValueError(f"${IMPL_VARIABLE} must be one of {IMPLS} or unset, got {chosen!r}")
    return chosen


def unfused_by_default(impl: str, device: torch.device) -> bool:
    """Whether a loss of given logits on ``device`` computes ``F.cross_entropy`` + NTL from the
    logits' number columns instead of numtok's fused row passes: for ``impl="auto"`` (with
    ``$NUMTOK_IMPL`` unset or ``auto``) on every device but the CPU, where the fused passes have
    not been measured to beat PyTorch's own cross-entropy (on an H200 the torch row passes took
    2.4-11x ``F.cross_entropy``'s time)."""
    return impl == "auto" and _auto() == "auto" and device.type != "cpu"


def resolve_impl(impl: str, device: torch.device, unsupported: str | None = None) -> str:
    """``"torch"`` or ``"triton"``, the backend of numtok's row passes, for a validated ``impl``
    and tensors on ``device``; ``unsupported`` names a setting the Triton kernels do not compute
    (None: every setting is theirs). ``"auto"`` is ``"torch"`` unless ``$NUMTOK_IMPL`` says
    ``triton``. Raises ``ValueError`` (or ``ModuleNotFoundError`` without triton) where Triton is
    asked for and cannot run."""
    if impl == "auto":
        impl = _auto()
        if impl == "triton" and unsupported is not None:
            return "torch"
    if impl in ("auto", "torch"):
        return "torch"
    if unsupported is not None:
        raise ValueError(
            f"impl='triton' does not compute {unsupported}; use impl='auto' (which takes the "
            "torch path for it) or impl='torch'"
        )
    if not triton_importable():
        raise ModuleNotFoundError(
            "impl='triton' needs triton: pip install triton (CUDA builds of torch ship it)",
            name="triton",
        )
    if device.type != "cuda" and not _interpreting():
        raise ValueError(
            f"impl='triton' runs on CUDA tensors, got tensors on {device}; on CPU set "
            "TRITON_INTERPRET=1 (before the first Triton call) to run the kernels in Triton's "
            "interpreter (slow, for tests), or use impl='torch'"
        )
    return "triton"
