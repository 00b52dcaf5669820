"""Argument checks shared by every loss entry point: clear errors that name the argument, what was
expected and what came, raised before any computation."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

REDUCTIONS = ("mean", "sum", "none")


def check_reduction(reduction: object) -> str:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    return str(reduction)


def check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    return value


def check_number(
    name: str,
    value: object,
    *,
    minimum: float,
    inclusive: bool,
    why: str = "",
    or_none: bool = False,
) -> float:
    """``value`` as a float: a finite int or float (not a bool) ``>= minimum`` (``inclusive``) or
    ``> minimum``. The errors name the argument, the bound, ``why`` (a parenthesis for the value
    error) and, with ``or_none``, that None is accepted too (the caller handles None)."""
    bound = f"{'>=' if inclusive else '>'} {minimum:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        alternative = " or None" if or_none else ""
        raise TypeError(f"{name} must be a number {bound}{alternative}, got {value!r}")
    in_range = value >= minimum if inclusive else value > minimum
    if not (math.isfinite(value) and in_range):
        raise ValueError(f"{name} must be a finite number {bound}{why}, got {value!r}")
    return float(value)


def check_squash_factor(squash_factor: object) -> float | None:
    if squash_factor is None:
        return None
    why = " (the farthest wrong number costs that many times the nearest one)"
    return check_number(
        "squash_factor", squash_factor, minimum=1, inclusive=False, why=why, or_none=True
    )


def check_logit_softcap(logit_softcap: object) -> float | None:
    if logit_softcap is None:
        return None
    why = " (the logits become c·tanh(logits/c))"
    return check_number(
        "logit_softcap", logit_softcap, minimum=0, inclusive=False, why=why, or_none=True
    )


def check_logits(logits: object, *, vocab_size: int) -> torch.Tensor:
    """Logits (..., V), floating point, with V == vocab_size."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if not logits.is_floating_point():
        raise TypeError(
            f"logits must be floating point (float32, bfloat16, float16 or float64), "
            f"got {logits.dtype}"
        )
    if logits.dim() < 1:
        raise ValueError(f"logits must have shape (..., vocab_size={vocab_size}), got a scalar")
    if logits.shape[-1] != vocab_size:
        raise ValueError(
            f"logits have {logits.shape[-1]} columns but the NumberVocab was built for "
            f"vocab_size={vocab_size}; if the model's output layer is padded beyond the tokenizer, "
            f"build the vocabulary with NumberVocab.from_tokenizer(tokenizer, "
            f"vocab_size={logits.shape[-1]})"
        )
    return logits


def check_token_ids(
    name: str,
    token_ids: object,
    *,
    vocab_size: int,
    ignore_index: int,
    check_values: bool = True,
    on_device: bool = False,
) -> torch.Tensor:
    """Integer token ids in [0, vocab_size) or ``ignore_index``, returned as int64. The range check
    reads one boolean back from the device; inside ``torch.compile`` and with ``on_device`` (a
    capturable loss) the device asserts instead (``torch._assert_async``: on a GPU the error
    surfaces at a later synchronisation, as a device-side assert); ``check_values=False`` leaves
    it to the caller (a kernel that checks on the device)."""
    if not isinstance(token_ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(token_ids).__name__}")
    if token_ids.is_floating_point() or token_ids.is_complex() or token_ids.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor of token ids, got {token_ids.dtype}")
    token_ids = token_ids.long()
    if not check_values:
        return token_ids
    out_of_range = (token_ids != ignore_index) & ((token_ids < 0) | (token_ids >= vocab_size))
    if on_device or torch.compiler.is_compiling():
        # No host read-back inside a compiled graph or a capturable loss: the device asserts.
        torch._assert_async(~out_of_range.any(), f"{name} must be token ids in [0, {vocab_size})")
    elif bool(out_of_range.any()):
        bad = int(token_ids[out_of_range][0])
        raise ValueError(
            f"{name} must be token ids in [0, {vocab_size}) or ignore_index={ignore_index}, "
            f"got {bad}"
        )
    return token_ids


def check_ntl_weight(ntl_weight: object) -> float:
    return check_number("ntl_weight", ntl_weight, minimum=0, inclusive=True)


def check_logits_and_labels(
    logits: object,
    labels: object,
    *,
    vocab_size: int,
    ignore_index: int,
    check_values: bool = True,
    on_device: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (..., V) floating point with V == vocab_size; labels (...) integer ids in [0, V)
    or ``ignore_index`` (their range unchecked with ``check_values=False``, asserted on the
    device with ``on_device``), on the logits' device."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if not isinstance(labels, torch.Tensor):
        raise TypeError(f"labels must be a torch.Tensor, got {type(labels).__name__}")
    check_one_device(logits=logits, labels=labels)
    if logits.dim() < 1 or tuple(logits.shape[:-1]) != tuple(labels.shape):
        raise ValueError(
            f"logits must have shape (*labels.shape, vocab_size): labels have shape "
            f"{tuple(labels.shape)}, logits have shape {tuple(logits.shape)}"
        )
    logits = check_logits(logits, vocab_size=vocab_size)
    labels = check_token_ids(
        "labels",
        labels,
        vocab_size=vocab_size,
        ignore_index=ignore_index,
        check_values=check_values,
        on_device=on_device,
    )
    return logits, labels


def check_loss_weights(
    loss_weights: object,
    labels: torch.Tensor,
    *,
    check_values: bool = True,
    on_device: bool = False,
) -> torch.Tensor | None:
    """Real weights of the labels' shape on their device, ``>= 0`` (a check that reads one
    boolean back from the device, asserted on the device with ``on_device`` and inside
    ``torch.compile``, left to the caller with ``check_values=False``)."""
    if loss_weights is None:
        return None
    if not isinstance(loss_weights, torch.Tensor):
        raise TypeError(f"loss_weights must be a torch.Tensor or None, got {type(loss_weights)}")
    if loss_weights.is_complex():
        raise TypeError(f"loss_weights must be real, got {loss_weights.dtype}")
    if tuple(loss_weights.shape) != tuple(labels.shape):
        raise ValueError(
            f"loss_weights must have the labels' shape {tuple(labels.shape)}, "
            f"got {tuple(loss_weights.shape)}"
        )
    check_one_device(labels=labels, loss_weights=loss_weights)
    if not check_values:
        return loss_weights
    if on_device or torch.compiler.is_compiling():
        torch._assert_async(~(loss_weights < 0).any(), "loss_weights must be >= 0")
    elif bool((loss_weights < 0).any()):
        raise ValueError(
            f"loss_weights must be >= 0, got a minimum of {float(loss_weights.min()):g}"
        )
    return loss_weights


def check_num_items(
    num_items_in_batch: object, capturable_on: torch.device | None = None
) -> torch.Tensor | int | None:
    """None, an int > 0, or a one-element tensor; for a capturable loss on ``capturable_on`` a
    tensor must be on that device (a CPU scalar would be copied to the GPU, a synchronisation,
    or kept in a CUDA graph with the value it was captured with)."""
    if num_items_in_batch is None:
        return None
    if isinstance(num_items_in_batch, torch.Tensor):
        if num_items_in_batch.numel() != 1:
            raise ValueError(
                f"num_items_in_batch must be a single number, got a tensor of shape "
                f"{tuple(num_items_in_batch.shape)}"
            )
        if capturable_on is not None and num_items_in_batch.device != capturable_on:
            raise ValueError(
                f"num_items_in_batch must be an int or a tensor on the labels' device "
                f"({capturable_on}) with capturable=True, got a tensor on "
                f"{num_items_in_batch.device}"
            )
        return num_items_in_batch
    if isinstance(num_items_in_batch, bool) or not isinstance(num_items_in_batch, int):
        raise TypeError(
            f"num_items_in_batch must be an int or a tensor, got {num_items_in_batch!r}"
        )
    if num_items_in_batch <= 0:
        raise ValueError(f"num_items_in_batch must be > 0, got {num_items_in_batch}")
    return num_items_in_batch


def check_elementwise_callable(name: str, fn: Callable[..., Any]) -> None:
    """A user loss ``fn(prediction, target)`` must return one value per element."""
    probe = fn(torch.zeros(3), torch.ones(3))
    if not isinstance(probe, torch.Tensor) or tuple(probe.shape) != (3,):
        shape = tuple(probe.shape) if isinstance(probe, torch.Tensor) else type(probe).__name__
        raise ValueError(
            f"{name} must be a callable (prediction, target) -> elementwise loss of the same "
            f"shape; for inputs of shape (3,) it returned {shape}"
        )


def require_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def check_one_device(**tensors: torch.Tensor | None) -> None:
    """The given tensors (None skipped) on one device, else a ``ValueError`` that names each
    argument's device: a loss's launches follow its labels' device and its lookup tables the
    logits', so tensors on two devices would compute on the wrong one or fail deep inside."""
    devices = {name: tensor.device for name, tensor in tensors.items() if tensor is not None}
    if len(set(devices.values())) > 1:
        names = list(devices)
        together = ", ".join(names[:-1]) + f" and {names[-1]}"
        each = ", ".join(f"{name} on {device}" for name, device in devices.items())
        raise ValueError(f"{together} must be on one device, got {each}")


def check_linear_inputs(
    hidden: object, weight: object, bias: object, labels: object, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """hidden (..., H) and weight (V, H) of one floating dtype, bias (V,) or None, V equal to
    the vocabulary's size, labels of shape (...), all on one device; the labels' dtype and range
    are checked by
    :func:`~numtok._common.validation.check_logits_and_labels`."""
    hidden = require_tensor("hidden", hidden)
    weight = require_tensor("weight", weight)
    labels = require_tensor("labels", labels)
    bias = None if bias is None else require_tensor("bias", bias)
    check_one_device(hidden=hidden, weight=weight, bias=bias, labels=labels)
    if not hidden.is_floating_point():
        raise TypeError(f"hidden must be floating point, got {hidden.dtype}")
    full_shape = getattr(weight, "ds_shape", None)  # set by DeepSpeed ZeRO-3 on its parameters
    if full_shape is not None and tuple(weight.shape) != tuple(full_shape):
        raise ValueError(
            f"weight is a DeepSpeed ZeRO-3 parameter read outside its module's call, where it is "
            f"partitioned (shape {tuple(weight.shape)}, full shape {tuple(full_shape)}): read it "
            "inside `with deepspeed.zero.GatheredParameters([weight, bias]):` (exact: the "
            "gradient still reaches it), or let patch_model / NTLossForTrainer.attach gather it"
        )
    if weight.dtype != hidden.dtype:
        raise TypeError(
            f"weight must have the hidden states' dtype {hidden.dtype}, got {weight.dtype}"
        )
    if hidden.dim() < 1 or weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"weight must have shape (vocab_size, hidden_size) with hidden_size = "
            f"hidden.shape[-1]: hidden has shape {tuple(hidden.shape)}, weight has shape "
            f"{tuple(weight.shape)}"
        )
    if weight.shape[0] != vocab_size:
        raise ValueError(
            f"weight has {weight.shape[0]} rows (one per logit) but the NumberVocab was built "
            f"for vocab_size={vocab_size}; build it with vocab_size={weight.shape[0]}"
        )
    if bias is not None and (bias.dtype != hidden.dtype or tuple(bias.shape) != (vocab_size,)):
        raise ValueError(
            f"bias must have shape ({vocab_size},) and dtype {hidden.dtype}, got shape "
            f"{tuple(bias.shape)} and dtype {bias.dtype}"
        )
    if tuple(labels.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(
            f"labels must have shape hidden.shape[:-1] = {tuple(hidden.shape[:-1])}, "
            f"got {tuple(labels.shape)}"
        )
    return hidden, weight, bias, labels


def check_position_values(name: str, value: object, labels: torch.Tensor) -> torch.Tensor | None:
    """None, or one real number per position: a floating tensor of the labels' shape on their
    device, such as each position's log-sum-exp or its label's log-probability."""
    if value is None:
        return None
    tensor = require_tensor(name, value)
    if not tensor.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {tensor.dtype}")
    shape = tuple(labels.shape)
    if tuple(tensor.shape) != shape:
        raise ValueError(
            f"{name} must have the labels' shape {shape} (one value per position), got "
            f"{tuple(tensor.shape)}"
        )
    check_one_device(labels=labels, **{name: tensor})
    return tensor
