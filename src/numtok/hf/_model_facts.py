"""What the Hugging Face routes read from a model, and from the trainer that will call it, before
they change either: read once by :func:`model_facts` into one :class:`ModelFacts`, the record from
which both entry points, :func:`numtok.hf.patch_model` and
:meth:`numtok.hf.NTLossForTrainer.attach`, choose their route and which they then install.

The record is read when it is built: the PEFT base, the output layer and its number of rows
(a ZeRO-3 weight's full shape, :mod:`numtok.hf._zero3`), the soft cap, whether the model is an
encoder-decoder, and from a trainer its tensor parallelism and whether it takes TRL's fused-head
route. The two facts that run the model (a forward of four tokens, in eval mode without
gradients) are checked only when a route asks for them: the bypass of the output layer, exact for
this model (:meth:`ModelFacts.bypass`, :mod:`numtok.hf._head`), and the capture of the final
hidden states that the output layer reads (:meth:`ModelFacts.capture`,
:mod:`numtok.hf._hidden`). Nothing here imports ``transformers``: the model and the trainer are
read by duck typing.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from numtok.hf._head import OutputLayerBypass, causal_lm_of, check_bypass_is_exact, softcap_of
from numtok.hf._hidden import HiddenStatesCapture, check_head_reads_hidden, decoder_of
from numtok.hf._in_forward import check_not_patched
from numtok.hf._zero3 import full_shape

__all__ = ["ModelFacts", "model_facts"]

#: The first TRL release whose SFTTrainer computes its loss from the fused LM head.
_FUSED_HEAD_RELEASE = (1, 16)


@dataclass(frozen=True)
class ModelFacts:
    """One model as the Hugging Face routes see it.

    Attributes:
        model: the model as given: the trainer's ``model``, or the one ``patch_model`` patches.
        causal_lm: its PEFT base (``get_base_model()``), else ``model``.
        on_trl: the trainer is TRL's ``SFTTrainer`` taking its fused-head route
            (:func:`takes_the_trl_route`); False without a trainer.
        tp_size: the ranks that share each layer under tensor parallelism (1 without).
        replicas: the tensor-, context- and sequence-parallel ranks that share each batch (the
            Trainer divides its token count by them).
        head: the output layer, ``get_output_embeddings()`` of :attr:`loss_model` (under PEFT
            the base's layer), or None where there is none.
        columns: the rows of its weight, the number of logits (the full shape of a ZeRO-3
            weight); None where it has no (V, H) weight.
        softcap: the soft cap ``c`` of the logits (``final_logit_softcapping``), or None.
        is_encoder_decoder: the configuration's ``is_encoder_decoder``; None where it does not
            say.
    """

    model: Any
    causal_lm: Any
    on_trl: bool
    tp_size: int
    replicas: int
    head: torch.nn.Module | None
    columns: int | None
    softcap: float | None
    is_encoder_decoder: bool | None

    @property
    def loss_model(self) -> Any:
        """The model whose forward computes the loss, which the route checks and patches: the
        PEFT base on TRL's route (TRL calls it with ``fused_lm_head=True``), else ``model``."""
        return self.causal_lm if self.on_trl else self.model

    def output_layer(self) -> torch.nn.Linear:
        """The output layer, checked: an ``nn.Linear`` with a floating-point weight (V, H). Raises
        a ``ValueError`` that says why the routes that read its weight cannot use the model."""
        name = type(self.loss_model).__name__
        head = self.head
        if head is None:
            raise ValueError(
                f"logits_free=True needs the model's output layer, but "
                f"{name}.get_output_embeddings() returns None (or does not exist): load a causal "
                "LM (AutoModelForCausalLM), or use logits_free=False"
            )
        if (
            not isinstance(head, torch.nn.Linear)
            or not head.weight.is_floating_point()
            or self.columns is None
        ):
            raise ValueError(
                f"logits_free=True needs an output layer that is a plain torch.nn.Linear with a "
                f"floating-point weight; {name}.get_output_embeddings() is "
                f"{type(head).__name__} with weight dtype "
                f"{getattr(getattr(head, 'weight', None), 'dtype', None)} (an adapter or quantised "
                "layer): use logits_free=False"
            )
        return head

    def bypass(self, read_logits: Callable[[Any], torch.Tensor]) -> OutputLayerBypass:
        """The bypass of the output layer, checked exact on the model first (two forwards of four
        tokens, :func:`numtok.hf._head.check_bypass_is_exact`; ``read_logits`` reads the logits
        of its output); the loss applies the soft cap. Refuses a model whose forward computes
        numtok's loss already."""
        check_not_patched(self.loss_model)
        head = self.output_layer()
        check_bypass_is_exact(self.loss_model, head, read_logits)
        return OutputLayerBypass(self.loss_model, head, self.softcap)

    def capture(self) -> HiddenStatesCapture:
        """The capture of the final hidden states at the decoder's output, checked first to be
        what the output layer reads (one forward of four tokens,
        :func:`numtok.hf._hidden.check_head_reads_hidden`)."""
        head = self.output_layer()
        capture = HiddenStatesCapture(decoder_of(self.loss_model))
        check_head_reads_hidden(self.loss_model, head, capture, self.softcap)
        return capture


def _release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string such as ``"1.16.0"`` or ``"1.17.0.dev0"``."""
    major, minor, *_ = [*version.split("."), "0"]
    return int(major), int(re.sub(r"\D.*", "", minor) or 0)


def takes_the_trl_route(trainer: Any) -> bool:
    """Whether ``trainer`` is TRL's ``SFTTrainer`` from 1.16 on, with no ``compute_loss_func``,
    computing its loss from the fused LM head (no label smoothing, which TRL computes from the
    logits), with ``num_items_in_batch`` reaching its loss."""
    trl = sys.modules.get("trl")
    sft_trainer = getattr(trl, "SFTTrainer", None)
    if not isinstance(sft_trainer, type) or not isinstance(trainer, sft_trainer):
        return False
    if _release(importlib.metadata.version("trl")) < _FUSED_HEAD_RELEASE:
        return False
    return (
        getattr(trainer, "compute_loss_func", None) is None
        and getattr(trainer, "label_smoother", None) is None
        and bool(getattr(trainer, "model_accepts_loss_kwargs", False))
    )


def _size(trainer: Any, getter: str) -> int:
    """``trainer.get_tp_size()`` and the like; 1 without a trainer, or where it has no such
    method."""
    get_size = getattr(trainer, getter, None)
    return int(get_size()) if callable(get_size) else 1


def model_facts(model: Any, trainer: Any = None) -> ModelFacts:
    """The record of ``model``, and of the ``trainer`` that will call it (``attach()``; None for
    ``patch_model``): everything but the two probes, which :class:`ModelFacts` runs on demand."""
    on_trl = trainer is not None and takes_the_trl_route(trainer)
    tp_size = _size(trainer, "get_tp_size")
    replicas = tp_size * _size(trainer, "get_cp_size") * _size(trainer, "get_sp_size")
    causal_lm = causal_lm_of(model)
    loss_model = causal_lm if on_trl else model
    softcap = softcap_of(loss_model)
    is_encoder_decoder = getattr(getattr(loss_model, "config", None), "is_encoder_decoder", None)
    get_output_embeddings = getattr(loss_model, "get_output_embeddings", None)
    head = get_output_embeddings() if callable(get_output_embeddings) else None
    weight = getattr(head, "weight", None)
    # The full shape, also of a weight that deepspeed.zero.Init partitioned (shape (0,)).
    shape = full_shape(weight) if isinstance(weight, torch.Tensor) else ()
    return ModelFacts(
        model=model,
        causal_lm=causal_lm,
        on_trl=on_trl,
        tp_size=tp_size,
        replicas=replicas,
        head=head,
        columns=shape[0] if len(shape) == 2 else None,
        softcap=softcap,
        is_encoder_decoder=None if is_encoder_decoder is None else bool(is_encoder_decoder),
    )
