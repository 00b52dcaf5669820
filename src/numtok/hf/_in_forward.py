"""The loss inside a causal LM's own forward, the one mechanism of both Hugging Face routes that
compute it there: :func:`numtok.hf.patch_model` (the labels come with the call) and
:meth:`numtok.hf.NTLossForTrainer.attach` with ``logits_free=True`` (the labels come from the
trainer's ``compute_loss``). The model's instance gets a ``forward`` that runs its own forward,
with the output layer bypassed (:mod:`numtok.hf._head`) in calls that record gradients, so that
the loss reads the layer's weight while the forward runs: where FSDP2 (``fully_shard``) holds it
gathered (tested; FSDP1 gathers the root's parameters for its forward too, untested), and where
DDP sees it used. DeepSpeed ZeRO-3 gathers a layer's weight only within that layer's call: the
loss gathers it again where it reads it (:mod:`numtok.hf._zero3`). Tensor parallelism keeps it
sharded: :func:`run_forward` refuses it when it sees the weight.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from numtok.hf._head import BypassedHead, OutputLayerBypass
from numtok.hf._zero3 import full_shape

__all__ = [
    "check_not_patched",
    "check_whole_weight",
    "install_forward",
    "owner_of",
    "refuse_tensor_parallelism",
    "remove_forward",
    "route_of",
    "run_forward",
    "with_loss",
]

# What patched a model's forward, and which route it is, live on the model under these names.
_OWNER, _ROUTE = "_numtok_patch", "_numtok_route"


def owner_of(model: Any) -> Any:
    """What patched the model's forward (the state its patched forward reads), or None."""
    return vars(model).get(_OWNER)


def route_of(model: Any) -> str | None:
    """Who patched the model's forward (``"patch_model"``, ...), or None."""
    route: str | None = vars(model).get(_ROUTE)
    return route


def install_forward(
    model: Any,
    owner: Any,
    route: str,
    make_forward: Callable[[Callable[..., Any]], Callable[..., Any]],
) -> None:
    """Set ``model.forward`` (on the instance) to ``make_forward(the model's own forward)``,
    with the model's own signature: the Trainer reads it to keep the dataset's columns
    (``remove_unused_columns``) and to pass ``num_items_in_batch``, ``generate()`` to check its
    arguments. ``owner`` is kept for :func:`owner_of`, ``route`` (who patched it) for
    :func:`check_not_patched`."""
    check_not_patched(model)
    forward = functools.wraps(model.forward)(make_forward(model.forward))
    vars(model).update({_OWNER: owner, _ROUTE: route, "forward": forward})


def check_not_patched(model: Any) -> None:
    """Refuse a model whose forward computes numtok's loss already."""
    if owner_of(model) is not None:
        raise ValueError(
            f"this {type(model).__name__} is patched already (its forward computes numtok's loss, "
            f"by {route_of(model)}): use one of patch_model and "
            "NTLossForTrainer(logits_free=True).attach, or call unpatch_model(model) first"
        )


def remove_forward(model: Any) -> None:
    """The model's own forward again."""
    for name in (_OWNER, _ROUTE, "forward"):
        del vars(model)[name]


def run_forward(
    forward: Callable[..., Any],
    bypass: OutputLayerBypass | None,
    vocab_size: int,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[Any, torch.Tensor, BypassedHead | None]:
    """``(outputs, logits, head)`` of the model's own ``forward(*args, **kwargs)``; with a
    ``bypass`` and gradients recorded, ``logits`` are the final hidden states (B, T, H) and
    ``head`` the output layer's parameters, read during the forward (None otherwise)."""
    if bypass is None or not torch.is_grad_enabled():
        outputs = forward(*args, **kwargs)
        head = None
    else:
        with bypass.during_forward():
            outputs = forward(*args, **kwargs)
        head = bypass.take()
    if not isinstance(outputs, dict) or "logits" not in outputs:
        raise ValueError(
            f"numtok reads the model's outputs as a ModelOutput with logits, got "
            f"{type(outputs).__name__}: call the model with return_dict=True"
        )
    if head is not None:
        check_whole_weight(head.weight, vocab_size, "use logits_free=False")
    return outputs, outputs["logits"], head


#: The settings that turn tensor parallelism on, for the messages that refuse it.
_TENSOR_PARALLEL_SETTINGS = (
    "transformers' tp_plan / TrainingArguments' tp_size, accelerate's ParallelismConfig(tp_size=), "
    "DeepSpeed's tensor_parallel.autotp_size"
)


def refuse_tensor_parallelism(tp_size: int, instead: str) -> None:
    """Refuse tensor parallelism (``tp_size`` ranks share each layer) on a route that reads the
    output layer's weight inside the forward: there each rank holds a slice of its rows or
    columns, and no rank the (V, H) weight the loss multiplies; ``instead`` says what to use."""
    if tp_size > 1:
        raise ValueError(
            f"tensor parallelism over {tp_size} ranks ({_TENSOR_PARALLEL_SETTINGS}) splits the "
            "output layer's weight inside the model's forward, where this route reads the whole "
            f"weight: {instead}, or shard with DeepSpeed ZeRO-3 or FSDP2 instead (numtok gathers "
            "the weight there)"
        )


def check_whole_weight(weight: torch.Tensor, vocab_size: int, instead: str) -> None:
    """Refuse an output layer's weight that is sharded inside the model's forward (it must be
    (V, H), a plain tensor, or a ZeRO-3 parameter of that full shape, which is gathered where it
    is read); ``instead`` says what to use then."""
    if type(weight).__name__ == "DTensor" or full_shape(weight)[:1] != (vocab_size,):
        raise ValueError(
            f"the output layer's weight is sharded inside the model's forward (a "
            f"{type(weight).__name__} of shape {full_shape(weight)}, where {vocab_size} rows "
            f"were expected: tensor parallelism, {_TENSOR_PARALLEL_SETTINGS}); numtok's loss "
            f"needs the whole weight: {instead}"
        )


def with_loss(outputs: Any, loss: torch.Tensor, head: BypassedHead | None) -> Any:
    """The model's outputs with ``loss``, and ``logits`` None where they were never computed
    (the output layer bypassed), as Liger-Kernel's skipped logits."""
    fields = {key: value for key, value in outputs.items() if key not in ("loss", "logits")}
    return type(outputs)(loss=loss, logits=outputs["logits"] if head is None else None, **fields)
