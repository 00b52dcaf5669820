"""DeepSpeed ZeRO-3's partitioned parameters, where numtok reads the output layer outside that
layer's own call.

Under ZeRO-3 (and in a model built inside ``deepspeed.zero.Init``, as ``from_pretrained`` does
under a ZeRO-3 configuration) every parameter is a placeholder of shape ``(0,)`` outside the call
of the module that owns it: each process keeps a slice of it (``param.ds_tensor``), its full shape
is ``param.ds_shape``, and the engine's hooks gather it (``param.ds_status`` ``AVAILABLE``) for
the owner's forward and backward only. numtok reads the output layer's weight after that layer's
call: the logits-free pass and the number head inside the model's forward, the exactness checks
of :mod:`numtok.hf._head` and :mod:`numtok.hf._hidden` before training. There
:func:`gathered` gathers it with ``deepspeed.zero.GatheredParameters(params,
modifier_rank=None)`` and partitions it again on exit.

Why that is exact, and how the gradient reaches the partitioned weight: every read of the
weight inside :func:`gathered` is by an operation whose backward needs none of the weight's
values — the logits-free pass computes the weight's gradient in its forward
(:mod:`numtok.ops.linear_in_forward`) and only hands it out in backward; the number head's
``weight[ids]`` keeps the indices and shape alone, its product keeps the gathered rows (a copy).
So backward never reads the released placeholder, and autograd adds the (V, H) gradient to the
parameter as for any other use of it: ZeRO-3 registered its gradient hook on the parameter while
gathered, with its full shape, and that hook reduces the gradient and keeps this process's
partition, as it does after the layer's own backward. Registering the weight as an external
parameter of the model (``deepspeed.zero.register_external_parameter``) would be exact too, but
keeps the (V, H) weight gathered for the whole forward and backward of the model; here it is
gathered for the loss's pass alone (the chunked pass's (c, V) buffer and the weight's gradient
(V, H) are what the pass allocates, as without ZeRO).

Nothing here imports ``deepspeed`` unless a parameter is a ZeRO-3 one (it has ``ds_id``, which
only DeepSpeed sets): the rest of numtok runs without it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch

__all__ = ["each_module_gathered", "full_shape", "gathered", "is_partitioned"]


def is_partitioned(param: torch.Tensor | None) -> bool:
    """Whether ``param`` is a ZeRO-3 parameter whose values are not on this process now."""
    status = getattr(param, "ds_status", None)
    return status is not None and getattr(status, "name", None) != "AVAILABLE"


def full_shape(param: torch.Tensor) -> tuple[int, ...]:
    """The parameter's shape; a ZeRO-3 parameter's full shape (``ds_shape``), whether gathered
    or not."""
    shape = getattr(param, "ds_shape", None)
    return tuple(param.shape if shape is None else shape)


@contextlib.contextmanager
def gathered(params: Iterable[torch.Tensor | None]) -> Iterator[None]:
    """Within this context the ZeRO-3 parameters among ``params`` that are partitioned now hold
    their full values on every process, and are partitioned again on exit (see the module
    docstring for why reading them inside is exact). Every process must enter it (the gather is
    a collective); parameters that are not ZeRO-3's, or gathered already (by their module's
    call, or persistent), are left as they are. A no-op without DeepSpeed."""
    # Once each: a tied weight may be named twice.
    partitioned = list({id(p): p for p in params if p is not None and is_partitioned(p)}.values())
    if not partitioned:
        yield
        return
    import deepspeed  # there is a ZeRO-3 parameter: DeepSpeed made it

    with deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None):
        yield


@contextlib.contextmanager
def each_module_gathered(model: torch.nn.Module) -> Iterator[None]:
    """Within this context every module of ``model`` holds its own ZeRO-3 parameters gathered
    during its call (forward hooks), as the DeepSpeed engine does, for a forward of a model that
    no engine wraps yet (built inside ``deepspeed.zero.Init``): at most one module's parameters
    are gathered at a time beside what the caller gathered. Without ZeRO-3 parameters it
    installs nothing."""
    modules = [
        module
        for module in model.modules()
        if any(is_partitioned(p) for p in module.parameters(recurse=False))
    ]
    if not modules:
        yield
        return
    open_contexts: dict[int, list[contextlib.ExitStack]] = {}

    def gather(module: torch.nn.Module, args: Any) -> None:
        stack = contextlib.ExitStack()
        stack.enter_context(gathered(module.parameters(recurse=False)))
        open_contexts.setdefault(id(module), []).append(stack)

    def release(module: torch.nn.Module, args: Any, output: Any) -> None:
        open_contexts[id(module)].pop().close()

    handles = []
    try:
        for module in modules:
            handles.append(module.register_forward_pre_hook(gather))
            handles.append(module.register_forward_hook(release, always_call=True))
        yield
    finally:
        for handle in handles:
            handle.remove()
        for stacks in open_contexts.values():
            for stack in stacks:
                stack.close()
