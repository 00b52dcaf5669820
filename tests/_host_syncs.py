"""Counting, on CPU tensors, the operations that would make a GPU wait: what
``torch.cuda.set_sync_debug_mode`` reports on CUDA, seen where no GPU is.

On a GPU a host synchronisation is any operation whose result the host needs before it can go
on: a value read back (``.item()``, ``bool(t)``, ``int(t)``, ``float(t)``: the op
``aten._local_scalar_dense``; ``torch.equal``, ``is_nonzero``) and every operation whose output
shape depends on the values (``nonzero``, boolean-mask indexing, ``masked_select``, ``unique``,
``repeat_interleave`` without ``output_size``), which copies a count back. :class:`HostSyncs`
records each such call at PyTorch's dispatcher, where forward and backward both pass (the
autograd engine runs a CPU backward in the calling thread), with the innermost frame of the
Python stack that made it.

What it cannot see: host-to-device copies (on CPU there is no second device), reads inside
``torch.library`` custom ops (the dispatcher hands them to their own kernel), and numpy or
``tolist`` conversions, which bypass the dispatcher; ``benchmarks/gpu.sh``'s ``sync`` step
measures those on CUDA. ``torch._assert_async`` is not counted: on a GPU it asserts on the
device, asynchronously.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HOST_ONLY", "HostSyncs", "Site"]

_aten = torch.ops.aten
#: Operations that read a value back or have a shape that depends on the values.
_SYNCING = {
    _aten._local_scalar_dense,
    _aten.nonzero,
    _aten.masked_select,
    _aten.equal,
    _aten.is_nonzero,
    _aten._unique,
    _aten._unique2,
    _aten.unique_consecutive,
    _aten.unique_dim,
}
_NUMTOK = str(Path(__import__("numtok").__file__).parent)


#: numtok's functions whose reads stay on the host on a GPU too, (file, function): the settings'
#: checks read the vocabulary's own tables, which live on the CPU (``LossSpec.build``), and the
#: torch row passes skip a pass for an upstream gradient of 1 only when it is a CPU tensor.
HOST_ONLY = {("maths/ntl.py", "build"), ("ops/kernels/torch_rows.py", "scale_rows_in_place")}


class Site(NamedTuple):
    """One synchronising call: the operation, ``file:line (function)`` of the innermost numtok
    frame that made it (else of the innermost frame outside torch), whether numtok made it."""

    operation: str
    where: str
    in_numtok: bool


class HostSyncs(TorchDispatchMode):
    """A dispatch mode that records every operation that would synchronise a GPU as a
    :class:`Site` in ``sites``; reads made by :data:`HOST_ONLY` are left out."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: list[Site] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if _syncs(func, args, kwargs):
            file, line, function, in_numtok = _where()
            if (file, function) not in HOST_ONLY:
                where = f"{file}:{line} ({function})"
                self.sites.append(Site(func.overloadpacket.__name__, where, in_numtok))
        return func(*args, **kwargs)

    def __len__(self) -> int:
        return len(self.sites)


def _syncs(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    packet = func.overloadpacket
    if packet in _SYNCING:
        return True
    if packet in (_aten.index, _aten.index_put, _aten.index_put_):  # a boolean mask as index
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)
    if func in (_aten.repeat_interleave.Tensor, _aten.repeat_interleave.self_Tensor):
        return kwargs.get("output_size") is None  # the output's length: the repeats' sum
    return False


def _where() -> tuple[str, int | None, str, bool]:
    """``(file, line, function, in numtok)`` of the innermost numtok frame of the stack (its path
    inside the package), else of the innermost frame outside torch and this file (its name)."""
    frames = [f for f in traceback.extract_stack() if f.filename != __file__]
    ours = [f for f in frames if f.filename.startswith(_NUMTOK)]
    outside = [f for f in frames if "/torch/" not in f.filename]
    frame = (ours or outside or frames)[-1]
    file = Path(frame.filename)
    name = file.relative_to(_NUMTOK).as_posix() if ours else file.name
    return name, frame.lineno, frame.name, bool(ours)
