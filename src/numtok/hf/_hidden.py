"""The final hidden states of a causal LM's forward, captured whatever computes its loss: for the
number head beside the model's own cross-entropy (``patch_model(..., cross_entropy="model")``).

Every causal LM in transformers runs its decoder (``model.base_model``: ``model.model`` for Llama,
Qwen, Mistral, Gemma; ``model.transformer`` for GPT-2) and reads its last hidden state ``h``
(``outputs[0]``, after the final norm) into the output layer, ``logits = P(h @ W.T + b)``, or
hands ``h`` and ``W`` to a fused loss (Liger-Kernel's patched forwards, Cut Cross-Entropy's), which
never builds the logits. A forward hook on the decoder sees ``h`` in either case.
:func:`check_head_reads_hidden` verifies on the model itself, before training, that the logits are
the output layer applied to what the hook sees (``P`` a soft cap at most, which the number head
applies too), and refuses a model where they are not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from numtok.hf._head import logit_settings_of
from numtok.hf._zero3 import each_module_gathered, full_shape, gathered

__all__ = ["HiddenStatesCapture", "check_head_reads_hidden", "decoder_of"]


def decoder_of(model: Any) -> torch.nn.Module:
    """``model.base_model``, the decoder whose output the output layer reads; a ``ValueError``
    where the model has none of its own (it is a decoder itself, or not a transformers model)."""
    decoder = getattr(model, "base_model", None)
    if not isinstance(decoder, torch.nn.Module) or decoder is model:
        raise ValueError(
            f"cross_entropy='model' reads the final hidden states from the model's decoder "
            f"(model.base_model), but {type(model).__name__} has none of its own: load a causal "
            "LM (AutoModelForCausalLM), or use cross_entropy='numtok'"
        )
    return decoder


def _last_hidden_state(output: Any) -> torch.Tensor | None:
    """``output[0]`` of a decoder: a ``BaseModelOutput``'s ``last_hidden_state``, or a tuple's
    first element."""
    if isinstance(output, torch.Tensor):
        return output
    first = output.get("last_hidden_state") if isinstance(output, dict) else None
    if first is None and isinstance(output, (tuple, list)) and output:
        first = output[0]
    return first if isinstance(first, torch.Tensor) else None


class HiddenStatesCapture:
    """Keeps the decoder's last hidden states (B, T, H) of the forwards run within
    :meth:`during_forward`."""

    def __init__(self, decoder: torch.nn.Module) -> None:
        self.decoder = decoder
        self._seen: list[torch.Tensor] = []

    @contextlib.contextmanager
    def during_forward(self) -> Iterator[None]:
        def keep(module: torch.nn.Module, args: Any, output: Any) -> None:
            hidden = _last_hidden_state(output)
            if hidden is not None:
                self._seen.append(hidden)

        self._seen.clear()
        handle = self.decoder.register_forward_hook(keep)
        try:
            yield
        finally:
            handle.remove()

    def take(self) -> torch.Tensor:
        """The hidden states of the one decoder call of the forward; a ``ValueError`` when the
        decoder ran more or less than once (they would not be the logits' hidden states)."""
        seen, self._seen = self._seen, []
        if len(seen) != 1:
            raise ValueError(
                f"the model's forward ran its decoder {len(seen)} times (once expected: the "
                "final hidden states the output layer reads); cross_entropy='model' cannot tell "
                "which hidden states the loss read: use cross_entropy='numtok'"
            )
        return seen[0]


def _logits_and_hidden(
    model: Any, head: torch.nn.Linear, capture: HiddenStatesCapture
) -> tuple[Any, torch.Tensor]:
    """The logits (1, 4, V) of four tokens, in eval mode without gradients, and the hidden
    states (1, 4, H) ``capture`` saw."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    device = getattr(getattr(embeddings, "weight", head.weight), "device", head.weight.device)
    input_ids = torch.arange(min(4, full_shape(head.weight)[0]), device=device)[None]  # (1, 4)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), capture.during_forward():
            logits = model(input_ids=input_ids)["logits"]
        hidden = capture.take()
    finally:
        model.train(was_training)
    return logits, hidden


def check_head_reads_hidden(
    model: Any, head: torch.nn.Linear, capture: HiddenStatesCapture, softcap: float | None
) -> None:
    """Refuse a model whose logits are not ``softcap(h @ W.T + b)`` with ``h`` what ``capture``
    sees (a logit scale, a head computed from something else); ``softcap`` is the model's soft
    cap (None without one), which the number head then applies.

    One forward of four tokens, in eval mode without gradients (where fused losses such as
    Liger-Kernel's still return the logits): the logits must equal the output layer applied to
    the captured hidden states up to rounding (1e-3 of the largest logit in float32, 3e-2 in
    16-bit dtypes). A model built inside ``deepspeed.zero.Init`` runs it with each module's
    weights gathered for its call (:func:`numtok.hf._zero3.each_module_gathered`)."""
    with each_module_gathered(model), gathered([head.weight, head.bias]):
        logits, hidden = _logits_and_hidden(model, head, capture)
        weight = head.weight.detach()
        bias = None if head.bias is None else head.bias.detach()
        exact = isinstance(logits, torch.Tensor) and hidden.shape[-1] == weight.shape[1]
        if exact:
            expected = F.linear(hidden.to(weight.dtype), weight, bias).float()
            if softcap is not None:
                expected = softcap * torch.tanh(expected / softcap)
            tolerance = 1e-3 if weight.dtype in (torch.float32, torch.float64) else 3e-2
            exact = tuple(logits.shape) == tuple(expected.shape)
            if exact:
                error = (logits.float() - expected).abs().max()
                exact = float(error / expected.abs().max().clamp_min(1e-30)) <= tolerance
    if not exact:
        named = ", ".join(f"{key}={value}" for key, value in logit_settings_of(model).items())
        because = f"its configuration sets {named}" if named else "it transforms them otherwise"
        raise ValueError(
            f"{type(model).__name__}'s logits are not its output layer applied to its decoder's "
            f"last hidden states ({because}), so the number head beside its own loss would read "
            "other logits than that loss: use cross_entropy='numtok'"
        )
