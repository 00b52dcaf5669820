"""numtok inside a causal LM's own forward: ``patch_model(model, tokenizer)`` makes
``model(input_ids=..., labels=labels)`` return ``outputs.loss = CE + ntl_weight · NTL``, so that
any training loop that calls the model and back-propagates ``outputs.loss`` trains with NTL: the
Hugging Face Trainer without a ``compute_loss_func``, accelerate or torchrun loops, Lightning,
Axolotl, LLaMA-Factory. Not TRL's ``SFTTrainer`` from 1.16 on: without a ``compute_loss_func``
it computes its own loss from a fused LM head (``fused_lm_head=True``) and never reads
``outputs.loss``; there :meth:`~numtok.hf.NTLossForTrainer.attach` is the route.

The loss follows the model's own conventions: the causal shift (the logits at ``t`` predict the
label at ``t + 1``), ``ignore_index = -100`` and ``num_items_in_batch`` when a trainer passes it:
``Σ ce / num_items_in_batch`` as transformers computes its cross-entropy (exact under gradient
accumulation), and NTL's mean over the call's number positions weighted by the call's share of
the step's target tokens, ``Σ ntl / |P| · |T| / num_items_in_batch`` (as
:class:`~numtok.hf.NTLossForTrainer` without ``attach()``): exact for one micro-batch, and for
several only where their number shares are equal; ``attach()`` counts the step's number
positions for the exact mean.

What computes the cross-entropy (``cross_entropy``): numtok's pass, or the model's own loss with
NTL from the number head beside it; the default ``"auto"`` chooses, at each call, numtok's on CPU
(where it was measured at 0.63× the time and 0.18× the step's peak memory of the unpatched
model) and the model's own elsewhere, so that no GPU default runs a pass that was never measured
fast on a GPU (:func:`numtok.hf._loss.auto_cross_entropy`, the rule of every entry point that
chooses).

With numtok's pass and ``logits_free=True`` (the default) a forward that records gradients
computes the loss from the final hidden states and the output layer's weight inside the forward
(:func:`numtok.losses.linear.linear_cross_entropy_with_ntl`, through the bypass of
:mod:`numtok.hf._head`): the (B, T, V) logits never exist, and ``outputs.logits`` is None, as
Liger-Kernel's skipped logits. The output layer's weight is read while the model's forward runs,
where FSDP2 (``fully_shard``) holds it gathered; DeepSpeed ZeRO-3 partitions it outside the
layer's own call, and the loss gathers it for its pass (:mod:`numtok.hf._zero3`), also in a model
built inside ``deepspeed.zero.Init`` (``from_pretrained`` under a ZeRO-3 configuration), whose
sizes numtok reads from ``ds_shape``. Evaluation, ``generate()`` and every forward
under ``torch.no_grad()`` compute the logits as usual (and the loss from them when labels are
given). A soft cap on the logits (Gemma 2) is applied by the loss.

Nothing here imports ``transformers``: the model is read by duck typing (``forward``,
``get_output_embeddings()``, ``config``), its outputs as a ``ModelOutput`` (a dict with
``logits``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from numtok._common.validation import check_bool, check_ntl_weight
from numtok.hf._head import OutputLayerBypass
from numtok.hf._hidden import HiddenStatesCapture
from numtok.hf._in_forward import (
    check_not_patched,
    check_whole_weight,
    install_forward,
    owner_of,
    remove_forward,
    route_of,
    run_forward,
    with_loss,
)
from numtok.hf._loss import (
    NUMBER_LEVEL_INSTEAD,
    auto_cross_entropy,
    ce_plus_ntl,
    check_cross_entropy,
    count_targets,
    denominator_dtype,
    number_head_mean,
    token_share_denominators,
)
from numtok.hf._model_facts import model_facts
from numtok.losses.fused import CEWithNTLOutput
from numtok.maths.ntl import Kind, LossSpec, refuse_number_level
from numtok.numbers.vocab import NumberVocab
from numtok.ops.kernels.dispatch import check_impl

__all__ = ["last_loss_terms", "patch_model", "unpatch_model"]


@dataclass
class _Patch:
    """What a patched forward needs: the vocabulary and the settings (``head_spec``: those of
    the logits-free loss and the number head, with the model's soft cap), the output layer, what
    computes the cross-entropy (``cross_entropy``, as given), the bypass of the output layer for
    numtok's logits-free pass (None from the logits), the capture of the final hidden states for
    the model's own cross-entropy (None where it is not chosen, or ``model_refused``: why this
    model cannot take it, for ``"auto"``), and the last terms."""

    vocab: NumberVocab
    spec: LossSpec
    head_spec: LossSpec
    ntl_weight: float
    impl: str
    head: torch.nn.Linear
    cross_entropy: str
    bypass: OutputLayerBypass | None = None
    capture: HiddenStatesCapture | None = None
    model_refused: str | None = None
    last: CEWithNTLOutput | None = None

    def chosen(self) -> str:
        """``"numtok"`` or ``"model"`` for this call: ``"auto"`` decides by the output layer's
        device (the model may have moved since it was patched); ``reweigh`` needs numtok's."""
        if self.cross_entropy != "auto":
            return self.cross_entropy
        device = self.head.weight.device
        if self.spec.reweigh or auto_cross_entropy(device) == "numtok":
            return "numtok"
        if self.model_refused is not None:
            raise ValueError(
                f"cross_entropy='auto' computes the cross-entropy with the model's own loss off "
                f"the CPU (here {device}), which this model cannot take: "
                f"{self.model_refused}. Pass cross_entropy='numtok' to use numtok's on every "
                "device"
            )
        return "model"


def _vocab_for(model: Any, vocab_or_tokenizer: Any, columns: int) -> NumberVocab:
    """The NumberVocab of the model's ``columns`` logits: built from a tokenizer for that size,
    or checked when given."""
    if not isinstance(vocab_or_tokenizer, NumberVocab):
        return NumberVocab.from_tokenizer(vocab_or_tokenizer, vocab_size=columns)
    if vocab_or_tokenizer.vocab_size != columns:
        raise ValueError(
            f"{type(model).__name__} produces {columns} logits per position but the NumberVocab "
            f"was built for vocab_size={vocab_or_tokenizer.vocab_size}: build it with "
            f"NumberVocab.from_tokenizer(tokenizer, vocab_size={columns})"
        )
    return vocab_or_tokenizer


def patch_model(
    model: Any,
    vocab_or_tokenizer: NumberVocab | Any,
    *,
    ntl_weight: float = 0.3,
    kind: Kind = "was",
    reweigh: bool = False,
    squash_factor: float | None = None,
    logits_free: bool = True,
    cross_entropy: str = "auto",
    impl: str = "auto",
    capturable: bool = False,
) -> Any:
    """Make ``model(..., labels=labels)`` return ``outputs.loss = CE + ntl_weight · NTL``.

    ``CE + ntl_weight · NTL`` is :func:`numtok.cross_entropy_with_ntl` of the model's logits
    (B, T, V) and ``labels`` (B, T) with ``shift=True`` and ``ignore_index=-100`` (the causal
    LM's convention); with ``num_items_in_batch`` (the Trainer passes it) CE's sum is divided by
    it and NTL's mean weighted by the call's share of it (see the module docstring; for NTL's
    exact mean over a step of several micro-batches use
    :meth:`~numtok.hf.NTLossForTrainer.attach`). Calls without ``labels`` are the model's own.
    The model is patched in place (its instance's ``forward``) and returned;
    :func:`unpatch_model` restores it; :func:`last_loss_terms` gives the CE and NTL terms of the
    last call with labels, for logging.

    Args:
        model: a causal LM of transformers (``AutoModelForCausalLM``), or any module with a
            ``forward`` returning a ``ModelOutput`` with ``logits`` and an output layer
            (``get_output_embeddings()``, an ``nn.Linear``). Patch it before wrapping it
            (``fully_shard``, DDP, ``accelerator.prepare``).
        vocab_or_tokenizer: a :class:`~numtok.NumberVocab` of the model's number of logits, or
            a tokenizer to build one from (for the output layer's size).
        ntl_weight: as in :func:`numtok.cross_entropy_with_ntl`.
        kind: as in :func:`numtok.cross_entropy_with_ntl`.
        reweigh: as in :func:`numtok.cross_entropy_with_ntl`.
        squash_factor: as in :func:`numtok.cross_entropy_with_ntl`.
        logits_free: in forwards that record gradients, compute the loss from the final hidden
            states and the output layer's weight (the logits never exist; ``outputs.logits`` is
            None). Checked on the model first (see :func:`numtok.hf._head.check_bypass_is_exact`).
            For numtok's cross-entropy; with the model's own the model decides.
        cross_entropy: what computes CE. ``"auto"`` (default): ``"numtok"`` when the output
            layer's weight is on the CPU (decided at each call: the model may move after
            patching) or with ``reweigh``, ``"model"`` elsewhere; both routes are checked on the
            model when it is patched (a refusal of the numtok route raises then, one of the
            model's own when a call off the CPU would take it). ``"numtok"``: numtok's fused
            passes, as above. ``"model"``: the model's own loss, whatever computes it (transformers'
            cross-entropy, a forward patched by Liger-Kernel's ``apply_liger_kernel_to_*(
            fused_linear_cross_entropy=True)``, Cut Cross-Entropy), and ``ntl_weight`` times NTL
            from the number head (:func:`numtok.linear_number_token_loss`) on the final hidden
            states, captured inside the forward: ``outputs.loss`` is the model's loss plus
            ``ntl_weight · Σ ntl / |P|`` (weighted by the call's token share with
            ``num_items_in_batch``, as above), ``outputs.logits`` whatever the model returns
            (None under Liger). Checked on the model first
            (:func:`numtok.hf._hidden.check_head_reads_hidden`); ``reweigh`` is refused (the
            model's loss does not hand out its log-sum-exp).
        impl: the backend of the row passes, as in :func:`numtok.cross_entropy_with_ntl`.
        capturable: numtok's part of the loss reads nothing back from the device, as in
            :func:`numtok.cross_entropy_with_ntl` (the model's own code may still).

    Raises:
        ValueError: the model is not a causal LM (no output layer, an encoder-decoder) or is
            patched already; a NumberVocab of another size than the model's logits; with
            numtok's cross-entropy and ``logits_free=True``, a model whose logits are not its
            output layer's product (:mod:`numtok.hf._head`); with ``cross_entropy="model"``, a
            model whose logits are not its output layer applied to its decoder's last hidden
            states (:mod:`numtok.hf._hidden`), which ``"auto"`` raises at a call off the CPU;
            and, when called, an output layer sharded inside the forward (tensor parallelism:
            ``tp_plan``, DeepSpeed's ``autotp_size``). DeepSpeed ZeRO-2 and ZeRO-3 (also a
            model partitioned by ``deepspeed.zero.Init``) and FSDP2 are tested exact with two
            processes; FSDP1 is not tested.
    """
    facts = model_facts(model)
    if facts.is_encoder_decoder:
        raise ValueError(
            f"patch_model computes a causal LM's loss (labels shifted by one position), and "
            f"{type(model).__name__} is an encoder-decoder: use NTLossForTrainer(..., "
            "shift=False) with it"
        )
    check_not_patched(model)
    head = facts.output_layer()
    assert facts.columns is not None, "the checked output layer has a (V, H) weight"
    vocab = _vocab_for(model, vocab_or_tokenizer, facts.columns)
    refuse_number_level(kind, "patch_model", NUMBER_LEVEL_INSTEAD)
    spec = LossSpec.build(
        vocab,
        kind=kind,
        reweigh=reweigh,
        squash_factor=squash_factor,
        ignore_index=-100,
        reduction="mean",
        shift=True,
        capturable=capturable,
    )
    weight = check_ntl_weight(ntl_weight)
    backend = check_impl(impl)
    free = check_bool("logits_free", logits_free)
    check_cross_entropy(cross_entropy)
    if cross_entropy == "model" and reweigh:
        raise ValueError(
            "reweigh=True needs each number position's full log-sum-exp, which the model's "
            "own loss does not hand out: use cross_entropy='numtok' with reweigh"
        )
    head_spec = dataclasses.replace(spec, logit_softcap=facts.softcap)
    patch = _Patch(vocab, spec, head_spec, weight, backend, head, cross_entropy)
    if cross_entropy != "model" and free:
        patch.bypass = facts.bypass(lambda outputs: outputs["logits"])
    if cross_entropy == "model" or (cross_entropy == "auto" and not reweigh):
        try:
            patch.capture = facts.capture()
        except ValueError as error:
            if cross_entropy == "model":
                raise
            patch.model_refused = str(error)  # "auto" raises it where it would choose "model"

    def make_forward(own_forward: Callable[..., Any]) -> Callable[..., Any]:
        def forward(*args: Any, **kwargs: Any) -> Any:
            return _patched_forward(patch, own_forward, *args, **kwargs)

        return forward

    install_forward(model, patch, "patch_model", make_forward)
    return model


def _patch_of(model: Any) -> _Patch:
    patch = owner_of(model)
    if not isinstance(patch, _Patch):
        by = route_of(model)
        raise ValueError(
            f"this {type(model).__name__} is not patched (patch_model)"
            + ("" if by is None else f"; its forward was patched by {by}")
        )
    return patch


def unpatch_model(model: Any) -> Any:
    """Undo :func:`patch_model`: the model's own forward again. Returns the model."""
    _patch_of(model)
    remove_forward(model)
    return model


def last_loss_terms(model: Any) -> CEWithNTLOutput | None:
    """``(loss, ce, ntl)`` (detached) of the patched model's last forward with labels, or None
    before the first: the terms to log beside the loss (``loss = ce + ntl_weight · ntl``)."""
    return _patch_of(model).last


def _patched_forward(
    patch: _Patch, own_forward: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    if kwargs.get("labels") is None:
        return own_forward(*args, **kwargs)
    if patch.chosen() == "model":
        return _beside_the_models_loss(patch, own_forward, *args, **kwargs)
    labels = kwargs.pop("labels")
    num_items_in_batch = kwargs.pop("num_items_in_batch", None)
    outputs, logits, head = run_forward(
        own_forward, patch.bypass, patch.vocab.vocab_size, args, kwargs
    )
    tables = patch.vocab.tables(logits.device)
    counts = count_targets(labels, tables.position_of_id, patch.spec)
    tokens, numbers = token_share_denominators(
        counts, num_items_in_batch, denominator_dtype(logits)
    )
    out = ce_plus_ntl(
        logits, labels, tables, tokens, numbers, head, spec=patch.spec,
        head_spec=patch.head_spec, ntl_weight=patch.ntl_weight, impl=patch.impl,
    )  # fmt: skip
    patch.last = CEWithNTLOutput(loss=out.loss.detach(), ce=out.ce, ntl=out.ntl)
    return with_loss(outputs, out.loss, head)


def _beside_the_models_loss(
    patch: _Patch, own_forward: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    """The model's own forward, labels and ``num_items_in_batch`` included, with
    ``ntl_weight · NTL`` of the number head on its captured final hidden states added to its
    loss."""
    labels = kwargs["labels"]
    assert patch.capture is not None
    with patch.capture.during_forward():
        outputs = own_forward(*args, **kwargs)
    hidden = patch.capture.take()  # (B, T, H)
    own_loss = outputs.get("loss") if isinstance(outputs, dict) else None
    if not isinstance(own_loss, torch.Tensor):
        raise ValueError(
            f"the model's forward returned no loss with labels (outputs: "
            f"{type(outputs).__name__}), so there is no cross-entropy to add NTL to: call it with "
            "return_dict=True, or use cross_entropy='numtok'"
        )
    weight, bias = patch.head.weight, patch.head.bias  # gathered here under FSDP2
    check_whole_weight(weight, patch.vocab.vocab_size, "use cross_entropy='numtok'")
    labels = labels.to(hidden.device)
    tables = patch.vocab.tables(hidden.device)
    counts = count_targets(labels, tables.position_of_id, patch.spec)
    dtype = denominator_dtype(hidden)
    tokens, numbers = token_share_denominators(counts, kwargs.get("num_items_in_batch"), dtype)
    ntl = number_head_mean(
        hidden, weight, bias, labels, patch.vocab, tables, patch.head_spec, tokens, numbers
    )
    loss = own_loss + patch.ntl_weight * ntl.to(own_loss.dtype)
    patch.last = CEWithNTLOutput(loss=loss.detach(), ce=own_loss.detach(), ntl=ntl.detach())
    fields = {key: value for key, value in outputs.items() if key != "loss"}
    return type(outputs)(loss=loss, **fields)
