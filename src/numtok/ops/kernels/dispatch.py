"""Which backend computes a loss: ``impl="auto" | "torch" | "triton"``, Cut Cross-Entropy's
convention.

``"auto"`` runs only code that has run on the hardware it targets. On CPU that is numtok's torch
row passes (:mod:`numtok.ops.kernels.torch_rows`, measured faster than ``F.cross_entropy`` alone
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

Where the Triton kernels cannot run at all (triton missing, or failing to import; on CUDA a
first launch failing: Triton's launcher needs a C compiler, and the device an architecture
Triton compiles for; CPU tensors without the interpreter), ``impl="triton"`` raises an error
that says why, and ``$NUMTOK_IMPL=triton`` takes the torch row passes with one
``RuntimeWarning`` per device. The import and the first launch are tried once per device.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import warnings
from typing import Literal

import torch

from numtok.maths.ntl import LossSpec

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
    ``triton``, and then ``"torch"`` too where the kernels do not compute the settings or cannot
    run on ``device`` (warned once per device). ``impl="triton"`` where they cannot raises:
    ``ValueError`` for the settings or the device, ``ModuleNotFoundError`` without triton,
    ``RuntimeError`` when triton or its first launch fails."""
    chosen_by_auto = impl == "auto"
    if chosen_by_auto:
        impl = _auto()
    if impl in ("auto", "torch"):
        return "torch"
    if unsupported is not None:
        if chosen_by_auto:
            return "torch"
        raise ValueError(
            f"impl='triton' does not compute {unsupported}; use impl='auto' (which takes the "
            "torch path for it) or impl='torch'"
        )
    try:
        _check_triton_runs(device)
    except (ModuleNotFoundError, ValueError, RuntimeError) as error:
        if not chosen_by_auto:
            raise
        if device not in _WARNED:
            _WARNED.add(device)
            warnings.warn(
                f"${IMPL_VARIABLE}=triton, but {error}; computing with the torch row passes "
                f"on {device} instead",
                RuntimeWarning,
                stacklevel=3,
            )
        return "torch"
    return "triton"


#: The devices whose fall-back from ``$NUMTOK_IMPL=triton`` to torch has been warned of.
_WARNED: set[torch.device] = set()


def _check_triton_runs(device: torch.device) -> None:
    """Raises where the Triton kernels cannot run on ``device``, with the reason."""
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
    # torch.compile cannot trace the first try (an import, a launch): a compiled graph's
    # first launch raises where it would fail.
    failure = None if torch.compiler.is_compiling() else _first_failure(device)
    if failure is not None:
        raise RuntimeError(
            f"impl='triton' cannot run on {device}: {type(failure).__name__}: {failure}; use "
            "impl='torch'"
        ) from failure


@functools.cache
def _first_failure(device: torch.device) -> Exception | None:
    """What failed when the Triton kernels were first tried on ``device`` (None: nothing): the
    import of numtok's Triton modules (and so of triton, which can fail past its installation)
    and, on CUDA, one launch (Triton compiles for the device's architecture and builds its
    launcher with the host's C compiler). Tried once per device."""
    try:
        triton_loss = importlib.import_module("numtok.ops.kernels.triton_loss")
        if device.type == "cuda":
            triton_loss.check_launch(device)
    except Exception as error:  # a failure anywhere in triton's stack means: not here
        return error
    return None
