"""Logits-free training for the Hugging Face routes: in a forward that computes the loss, the
causal LM's output layer hands its input through instead of computing the (B, T, V) logits, and
the loss computes CE + NTL from those hidden states and the layer's weight
(:func:`numtok.losses.linear.linear_cross_entropy_with_ntl`), never holding the logits.

Every causal LM in transformers computes ``logits = P(lm_head(h))`` with ``lm_head =
model.get_output_embeddings()`` an ``nn.Linear`` (weight (V, H), bias (V,) or None) and ``P`` what
the model does to the logits afterwards: nothing for most (Llama, Qwen, Mistral, GPT-2, Gemma,
Phi, SmolLM), a scale for some (Granite divides by ``logits_scaling``, Cohere multiplies by
``logit_scale``), a soft cap ``c·tanh(x/c)`` for Gemma 2 (``final_logit_softcapping``). With the
layer bypassed, the model returns ``P(h)`` where it returned the logits, so the loss reads
``P(h) @ W.T + b``: equal to ``P(h @ W.T + b)`` when ``P`` is the identity, or a scale and the
layer has no bias. A soft cap is switched off in the configuration while the layer is bypassed
and applied by the loss instead (its ``logit_softcap``). :func:`check_bypass_is_exact` verifies
all this on the model itself before training (two forwards of four tokens) and refuses a model
where it does not hold, naming the configuration setting responsible when it knows one.

The bypass is installed on the layer's instance for the duration of one forward of the model
that computes the loss (:mod:`numtok.hf._in_forward`) only, and only acts on calls that record
gradients: evaluation, ``generate()`` and any forward under
``torch.no_grad()`` still get the logits. Nothing here imports ``transformers``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from numtok.hf._zero3 import each_module_gathered, full_shape, gathered

__all__ = [
    "BypassedHead",
    "OutputLayerBypass",
    "causal_lm_of",
    "check_bypass_is_exact",
    "logit_settings_of",
    "softcap_of",
]


def causal_lm_of(model: Any) -> Any:
    """The causal LM itself: the base model under PEFT (``get_base_model()``), else ``model``."""
    get_base_model = getattr(model, "get_base_model", None)
    return get_base_model() if callable(get_base_model) else model


#: The configuration setting of a soft cap on the logits, ``c·tanh(logits/c)``.
SOFTCAP_SETTING = "final_logit_softcapping"
#: Configuration settings besides the soft cap (which is switched off and left to the loss) that
#: change the logits after the output layer, with the value that leaves them unchanged (None: the
#: setting is off). The scales are computed from ``P(h) @ W.T``, unless the layer has a bias.
_LOGIT_SETTINGS = {
    "logits_scaling": 1.0,
    "logit_scale": 1.0,
    "output_multiplier": 1.0,
    "lm_head_multiplier": 1.0,
    "unpadded_vocab_size": None,
}


class _PassHiddenStates(torch.autograd.Function):
    """The identity on the hidden states (..., H) that also takes the output layer's weight (and
    bias) as inputs, with no gradient for them: the model's output then depends on them in the
    autograd graph, as the logits did, so that DDP with ``find_unused_parameters=True`` (the
    Trainer's default) does not take them for unused; their gradient comes from the loss."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, *parameters: torch.Tensor) -> torch.Tensor:
        ctx.num_parameters = len(parameters)
        return hidden.view_as(hidden)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return (grad, *[None] * ctx.num_parameters)


@contextlib.contextmanager
def _forward_replaced(
    module: torch.nn.Module, forward: Callable[[torch.Tensor], torch.Tensor]
) -> Iterator[None]:
    """``module(x)`` calls ``forward(x)`` within the context (an attribute of the instance, which
    ``nn.Module.__call__`` reads, hooks included); the module's own forward afterwards."""
    own = vars(module)
    previous = own.get("forward")
    own["forward"] = forward
    try:
        yield
    finally:
        if previous is None:
            del own["forward"]
        else:
            own["forward"] = previous


@dataclass(frozen=True)
class BypassedHead:
    """What the loss needs besides the model's output ``P(h)``: the layer's parameters and the
    dtype its product would have run in (the autocast dtype when autocast was on)."""

    weight: torch.Tensor  # (V, H)
    bias: torch.Tensor | None  # (V,)
    dtype: torch.dtype


def _configs_of(model: Any) -> list[Any]:
    """The model's configuration and its text configuration (multimodal models), once each."""
    config = getattr(model, "config", None)
    configs = [] if config is None else [config]
    get_text_config = getattr(config, "get_text_config", None)
    text_config = get_text_config() if callable(get_text_config) else None
    if text_config is not None and text_config is not config:
        configs.append(text_config)
    return configs


def softcap_of(model: Any) -> float | None:
    """The soft cap ``c`` of the model's logits (``final_logit_softcapping``), or None."""
    caps = [getattr(config, SOFTCAP_SETTING, None) for config in _configs_of(model)]
    return next((float(cap) for cap in caps if cap is not None), None)


@contextlib.contextmanager
def _softcap_switched_off(model: Any) -> Iterator[None]:
    """Within this context the model's configurations set no soft cap (the loss applies it)."""
    changed = [
        (config, getattr(config, SOFTCAP_SETTING))
        for config in _configs_of(model)
        if getattr(config, SOFTCAP_SETTING, None) is not None
    ]
    for config, _ in changed:
        setattr(config, SOFTCAP_SETTING, None)
    try:
        yield
    finally:
        for config, cap in changed:
            setattr(config, SOFTCAP_SETTING, cap)


class OutputLayerBypass:
    """Installs and removes the bypass on one output layer of ``model``, and hands the loss what
    it needs; ``softcap`` is the model's soft cap (None without), which the loss applies."""

    def __init__(self, model: Any, head: torch.nn.Linear, softcap: float | None) -> None:
        self.model, self.head, self.softcap = model, head, softcap
        self._passed: list[BypassedHead] = []

    @contextlib.contextmanager
    def during_forward(self) -> Iterator[None]:
        """Within this context the layer returns its input on calls that record gradients, and
        the model's soft cap is off."""
        head = self.head
        original = head.forward

        def forward(hidden: torch.Tensor) -> torch.Tensor:
            if not torch.is_grad_enabled():
                return original(hidden)
            device = hidden.device.type
            dtype = (
                torch.get_autocast_dtype(device)
                if torch.is_autocast_enabled(device)
                else head.weight.dtype
            )
            self._passed.append(BypassedHead(head.weight, head.bias, dtype))
            parameters = [p for p in (head.weight, head.bias) if p is not None]
            result: torch.Tensor = _PassHiddenStates.apply(hidden, *parameters)  # type: ignore[no-untyped-call]
            return result

        self._passed.clear()
        with _forward_replaced(head, forward), _softcap_switched_off(self.model):
            yield

    def take(self) -> BypassedHead | None:
        """The bypassed call of the forward that produced the outputs now given to the loss, or
        None when the layer computed logits (evaluation). Raises when one forward called the
        layer more than once (its outputs would not be the hidden states of one call)."""
        passed, self._passed = self._passed, []
        if len(passed) > 1:
            raise ValueError(
                f"the model called its output layer {len(passed)} times in one forward pass; "
                "logits_free=True supports one call (the final hidden states): use "
                "logits_free=False"
            )
        return passed[0] if passed else None


def logit_settings_of(model: Any) -> dict[str, Any]:
    """The logit settings of the model's configurations that are switched on."""
    found: dict[str, Any] = {}
    for each in _configs_of(model):
        for name, neutral in _LOGIT_SETTINGS.items():
            value = getattr(each, name, None)
            if value is not None and value != neutral:
                found.setdefault(name, value)
    return found


def _two_forwards(
    model: Any, head: torch.nn.Linear, read_logits: Callable[[Any], torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """``(k·logits, P(h), [k])`` of four tokens, the soft cap off, in eval mode without
    gradients: the layer's output magnified by ``k = 1000 / max|logits|``, then bypassed."""
    weight = head.weight
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    device = getattr(getattr(embeddings, "weight", weight), "device", weight.device)
    input_ids = torch.arange(min(4, full_shape(weight)[0]), device=device)[None]  # (1, 4)
    original = head.forward
    scale: list[torch.Tensor] = []

    def magnified(hidden: torch.Tensor) -> torch.Tensor:
        logits = original(hidden)
        largest = logits.detach().abs().max().float()
        scale.append(torch.where(largest > 0, 1e3 / largest, torch.ones_like(largest)))
        return logits * scale[-1].to(logits.dtype)

    def bypassed(hidden: torch.Tensor) -> torch.Tensor:
        return hidden

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), _softcap_switched_off(model):
            with _forward_replaced(head, magnified):
                logits = read_logits(model(input_ids=input_ids)).float()  # (1, 4, V')
            with _forward_replaced(head, bypassed):
                passed = read_logits(model(input_ids=input_ids))  # (1, 4, H) when exact
    finally:
        model.train(was_training)
    return logits, passed, scale


def check_bypass_is_exact(
    model: Any, head: torch.nn.Linear, read_logits: Callable[[Any], torch.Tensor]
) -> None:
    """Refuse a model whose logits, its soft cap switched off, are not ``P(h) @ W.T + b`` with
    ``P(h)`` what it returns when its output layer is bypassed (the loss applies the soft cap).

    Two forwards of four tokens with the soft cap off, in eval mode without gradients: one with
    the layer's output multiplied by ``k = 1000 / max|logits|`` (large logits, where any other
    non-linearity shows), one with the layer bypassed. The first must equal ``k·(P(h) @ W.T +
    b)`` up to rounding (1e-3 of the largest logit in float32, 3e-2 in 16-bit dtypes). A model
    built inside ``deepspeed.zero.Init`` runs them with each module's weights gathered for its
    call (:func:`numtok.hf._zero3.each_module_gathered`).
    """
    with each_module_gathered(model), gathered([head.weight, head.bias]):
        logits, passed, scale = _two_forwards(model, head, read_logits)
        weight = head.weight.detach()
        bias = None if head.bias is None else head.bias.detach()
        exact = (
            len(scale) == 1
            and passed.shape[-1] == weight.shape[1]
            and tuple(logits.shape) == (*passed.shape[:-1], weight.shape[0])
        )
        if exact:
            expected = F.linear(passed.to(weight.dtype), weight, bias).float() * scale[0]
            tolerance = 1e-3 if weight.dtype in (torch.float32, torch.float64) else 3e-2
            error = float((logits - expected).abs().max() / expected.abs().max().clamp_min(1e-30))
            exact = error <= tolerance
    if not exact:
        named = ", ".join(f"{key}={value}" for key, value in logit_settings_of(model).items())
        because = (
            f"its configuration sets {named}"
            if named
            else "it transforms the output layer's result, or computes the logits without it"
        )
        raise ValueError(
            f"{type(model).__name__}'s logits are not its output layer applied to what the model "
            f"returns when the layer is bypassed ({because}; with a bias, a logit scale also "
            "breaks this), so logits_free=True cannot compute its loss exactly: use "
            "logits_free=False"
        )
