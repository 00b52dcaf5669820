"""Cross-entropy + NTL for the Hugging Face ``Trainer`` and TRL, exact under gradient accumulation
and data parallelism.

One line on an existing trainer::

    trainer = Trainer(model=model, args=args, train_dataset=train, data_collator=collator)
    NTLossForTrainer(tokenizer, ntl_weight=0.3).attach(trainer)

or, without the exact accumulation and the CE/NTL logs (see below),
``Trainer(..., compute_loss_func=NTLossForTrainer(tokenizer))``.

**Logits-free training.** ``NTLossForTrainer(tokenizer, logits_free=True).attach(trainer)``: the
loss is computed inside the model's own forward, the mechanism of :func:`numtok.hf.patch_model`
(:mod:`numtok.hf._in_forward`). In each training call of ``compute_loss`` the model's forward gets
the batch's labels, its output layer (``get_output_embeddings()``) hands its input through, and
CE + NTL are computed from the final hidden states (B, T, H) and the layer's weight with
:func:`numtok.losses.linear.linear_cross_entropy_with_ntl` while the forward runs — where FSDP holds
the weight gathered, and DeepSpeed ZeRO-3's gathered again for the pass (:mod:`numtok.hf._zero3`)
— never holding the (B, T, V) logits or their gradient; the model returns no
logits and this loss returns that value. Same value, gradients, exactness and logs as from the
logits; evaluation and ``generate()`` still compute logits; a soft cap on the logits (Gemma 2's
``final_logit_softcapping``) is applied by the loss. What it checks and refuses (a logit scale with
an output bias, tensor parallelism, ...) is in :mod:`numtok.hf._head` and
:meth:`NTLossForTrainer.attach`.

**What is minimised.** Over the positions of one optimizer step (all micro-batches of the
accumulation, on all processes), with ``T`` the positions that have a label (not ``ignore_index``)
and ``P ⊆ T`` those whose label is a number token:

    loss = Σ_{t∈T} ce_t / |T|  +  ntl_weight · Σ_{t∈P} ntl_t / |P|

the same value and gradients as one batch holding the whole step. The Trainer divides the loss of
each micro-batch by ``num_items_in_batch``, which it counts over the step's labels, so
cross-entropy alone is exact. NTL's mean is over ``|P|``, which the Trainer does not count, and
``|P|/|T|`` varies between micro-batches (one holds a long number, the next none), so dividing each
micro-batch's NTL by its own number positions over-weights micro-batches with few numbers.

**How it is made exact.** The Trainer fetches all micro-batches of a step before the first
forward pass (``Trainer.get_batch_samples``). :meth:`NTLossForTrainer.attach` wraps that method:
it counts ``|T|`` and ``|P|`` over the fetched labels (after the causal shift) and, where the
Trainer sums its token count over processes (``average_tokens_across_devices``, the default, under
DDP/FSDP/DeepSpeed through accelerate or torchrun), sums both counts over processes with one
``gather``. Each micro-batch then returns ``Σ_micro ce / |T| + ntl_weight · Σ_micro ntl / |P|``.
The Trainer adds the micro-batches' gradients without rescaling them, multiplies the loss by the
number of processes, and DDP averages the gradients over processes: the sum of the pieces is the
step's loss above. The Trainer's own ``num_items_in_batch`` is replaced by the same ``|T|``
(counted with this loss's shift), so that the value passed on identifies the step's counts.

Without :meth:`~NTLossForTrainer.attach`, each micro-batch's NTL mean is weighted by its share of
the step's target tokens, ``Σ_micro ntl / |P_micro| · |T_micro| / num_items_in_batch``: exact for a
single micro-batch on a single process, approximate otherwise, with a warning the first time.

Evaluation (``trainer.evaluate()``) adds ``eval_ce`` and ``eval_ntl`` (``Σ ce / |T|`` and
``Σ ntl / |P|`` over the whole evaluation set) to the metrics; training logs get ``ce`` and
``ntl`` beside ``loss`` (averaged over the optimizer steps since the last log, like ``loss``, so
``loss = ce + ntl_weight · ntl``). They reach ``trainer.state.log_history``, the progress bar and
every reporting integration (TensorBoard, W&B, ...).

Nothing here imports ``transformers``: the trainer is read by duck typing, and ``import numtok``
works without it. Building an :class:`NTLossForTrainer` without the ``hf`` extra (transformers,
accelerate) raises a ``ModuleNotFoundError`` that says ``pip install ".[hf]"`` (in a checkout).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from numtok._common.extras import require_extra
from numtok._common.validation import check_bool, check_ntl_weight
from numtok.hf._head import BypassedHead, OutputLayerBypass
from numtok.hf._in_forward import (
    install_forward,
    refuse_tensor_parallelism,
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
    token_share_denominators,
)
from numtok.hf._model_facts import ModelFacts, model_facts
from numtok.hf._step_counts import StepCounts, StepLink
from numtok.hf._trl import trl_route
from numtok.hf._zero3 import full_shape
from numtok.losses.fused import CEWithNTLOutput
from numtok.maths.ntl import Kind, LossSpec, refuse_number_level
from numtok.numbers.vocab import NumberVocab
from numtok.ops.kernels.dispatch import check_impl

__all__ = ["NTLossForTrainer"]


def _logits_of(outputs: Any) -> torch.Tensor:
    """The logits of a model output: a ``ModelOutput``/dict with ``logits``, a tuple whose first
    element is the logits (``return_dict=False`` without labels), or a tensor."""
    logits: Any
    if isinstance(outputs, torch.Tensor):
        logits = outputs
    elif isinstance(outputs, Mapping):
        logits = outputs.get("logits")
        if logits is None:
            raise ValueError(
                "the model's output has no logits (it has "
                f"{', '.join(map(repr, outputs.keys())) or 'no fields'}): NTLossForTrainer needs "
                "the language-modelling head's logits. Load the model with "
                "AutoModelForCausalLM (or AutoModelForSeq2SeqLM with shift=False), not AutoModel, "
                "and do not enable use_liger_kernel, which skips the logits"
            )
    elif isinstance(outputs, (tuple, list)) and outputs and isinstance(outputs[0], torch.Tensor):
        logits = outputs[0]
    else:
        raise TypeError(
            "outputs must be a model output with logits (a ModelOutput or dict with 'logits', a "
            f"tuple starting with the logits, or a tensor), got {type(outputs).__name__}"
        )
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"the model's logits must be a tensor, got {type(logits).__name__}")
    return logits


def _is_encoder_decoder_output(outputs: Any) -> bool:
    """Seq2seq outputs (``Seq2SeqLMOutput``) carry the encoder's last hidden state."""
    fields = getattr(type(outputs), "__dataclass_fields__", {})
    return "encoder_last_hidden_state" in fields or (
        isinstance(outputs, Mapping) and "encoder_last_hidden_state" in outputs
    )


@dataclass
class _StepInForward:
    """The micro-batch whose ``compute_loss`` is running: its labels (B, T) and the trainer's
    ``num_items_in_batch``, handed to the model's forward, which leaves the loss here."""

    labels: torch.Tensor
    num_items_in_batch: torch.Tensor | int | None
    loss: torch.Tensor | None = None


@dataclass
class _LossInForward:
    """The logits-free route of :meth:`NTLossForTrainer.attach`: the bypass of the model's
    output layer, and the training micro-batch being computed (None outside ``compute_loss``)."""

    bypass: OutputLayerBypass
    step: _StepInForward | None = None
    warned: bool = False


def _labels_to_the_forward(trainer: Any, in_forward: _LossInForward) -> None:
    """Wrap ``trainer.compute_loss`` (on the instance) so that, in calls that record gradients,
    the model's forward gets the batch's labels, which the trainer keeps from it when it has a
    ``compute_loss_func`` (it calls ``model(**inputs)`` without them, then the loss)."""
    compute_loss = trainer.compute_loss
    signature = inspect.signature(compute_loss)
    inputs_name = list(signature.parameters)[1]  # (model, inputs, ...)

    @functools.wraps(compute_loss)
    def compute_loss_in_forward(*args: Any, **kwargs: Any) -> Any:
        arguments = signature.bind(*args, **kwargs).arguments
        inputs = arguments.get(inputs_name)
        labels = inputs.get("labels") if isinstance(inputs, Mapping) else None
        if not isinstance(labels, torch.Tensor) or not torch.is_grad_enabled():
            return compute_loss(*args, **kwargs)
        in_forward.step = _StepInForward(labels, arguments.get("num_items_in_batch"))
        try:
            return compute_loss(*args, **kwargs)
        finally:
            in_forward.step = None

    trainer.compute_loss = compute_loss_in_forward


class NTLossForTrainer:
    """Cross-entropy + ``ntl_weight`` · NTL as a Hugging Face ``compute_loss_func``.

    ``loss_fn(outputs, labels, num_items_in_batch=None)`` returns
    ``Σ ce / |T| + ntl_weight · Σ ntl / |P|`` (see the module docstring for ``T``, ``P`` and the
    exact accumulation), computed by :func:`numtok.losses.fused.cross_entropy_with_ntl` from
    ``outputs.logits`` (B, T, V) and ``labels`` (B, T). Use :meth:`attach` (one line) for exact
    gradient accumulation and data parallelism and for ``ce``/``ntl`` in the logs.

    Args:
        vocab_or_tokenizer: a :class:`~numtok.NumberVocab`, or a Hugging Face tokenizer from which
            one is built with ``NumberVocab.from_tokenizer(tokenizer, vocab_size=vocab_size)``.
        ntl_weight: the factor of NTL (the paper's λ, 0.3).
        kind: as in :func:`numtok.number_token_loss`, but for ``"number"`` (a ``ValueError``
            names what computes it).
        reweigh: as in :func:`numtok.number_token_loss`.
        squash_factor: as in :func:`numtok.number_token_loss`.
        ignore_index: as in :func:`numtok.number_token_loss`.
        shift: compare the logits at ``t`` with the label at ``t + 1``: right for causal LMs, whose
            labels are their inputs (the Trainer's convention). Encoder-decoder models feed
            right-shifted labels to the decoder and need ``shift=False``.
        vocab_size: the number of logits the model produces, when building from a tokenizer and
            the output layer is padded beyond it (``model.config.vocab_size``). Not needed with
            :meth:`attach`, which reads it from the model's output layer, as
            :func:`numtok.hf.patch_model` does.
        compile: ``torch.compile`` the loss. ``None`` (default): compile when attached to a
            trainer whose ``args.torch_compile`` is set, with its backend and mode.
        logits_free: in training steps, compute the loss from the final hidden states and the
            output layer's weight instead of the logits (see the module docstring); takes effect
            through :meth:`attach`, which checks that the model allows it. The loss's dtype is
            the one the output layer would have used (the autocast dtype under mixed
            precision).
        impl: the backend, from the logits and logits-free: ``"auto"`` (numtok's torch row
            passes on CPU; on a GPU ``F.cross_entropy`` beside the number head from the logits,
            the torch row passes logits-free), ``"torch"`` or ``"triton"`` (the Triton kernels,
            opt-in); see :func:`numtok.cross_entropy_with_ntl` and
            :func:`numtok.losses.linear.linear_cross_entropy_with_ntl`.
        cross_entropy: on TRL's ``SFTTrainer`` (1.16 on, without ``compute_loss_func``), what
            computes the cross-entropy beside NTL (:mod:`numtok.hf._trl`): ``"model"``, TRL's fused
            LM head (NTL from the number head beside it); ``"numtok"``, numtok's logits-free
            pass; ``"auto"`` (default), numtok's on CPU, where it is the faster one, and TRL's on
            GPUs, where TRL's has run and numtok's has not been measured. Both compute no logits
            (``logits_free`` has no effect there) and run the model once per micro-batch. Other
            trainers take only ``"auto"``.
        capturable: the loss reads nothing back from the device, as in
            :func:`numtok.cross_entropy_with_ntl` (for ``compile``: one graph; the Trainer
            itself still synchronises, to log).

    Raises:
        ModuleNotFoundError: transformers or accelerate is not installed; the message says
            ``pip install ".[hf]"`` (in a checkout).

    Example::

        loss_fn = NTLossForTrainer(tokenizer, ntl_weight=0.3)
        trainer = loss_fn.attach(Trainer(model=model, args=args, train_dataset=train))
        trainer.train()  # logs loss, ce and ntl
    """

    def __init__(
        self,
        vocab_or_tokenizer: NumberVocab | Any,
        *,
        ntl_weight: float = 0.3,
        kind: Kind = "was",
        reweigh: bool = False,
        squash_factor: float | None = None,
        ignore_index: int = -100,
        shift: bool = True,
        vocab_size: int | None = None,
        compile: bool | None = None,
        logits_free: bool = False,
        impl: str = "auto",
        cross_entropy: str = "auto",
        capturable: bool = False,
    ) -> None:
        require_extra("hf", "NTLossForTrainer (the Hugging Face Trainer adapter)")
        if isinstance(vocab_or_tokenizer, NumberVocab):
            if vocab_size is not None and vocab_size != vocab_or_tokenizer.vocab_size:
                raise ValueError(
                    f"vocab_size={vocab_size} differs from the NumberVocab's vocab_size="
                    f"{vocab_or_tokenizer.vocab_size}; pass vocab_size only with a tokenizer"
                )
            self.vocab = vocab_or_tokenizer
        else:
            self.vocab = NumberVocab.from_tokenizer(vocab_or_tokenizer, vocab_size=vocab_size)
        # A tokenizer without vocab_size: attach() reads the number of logits from the model's
        # output layer, as patch_model does, and rebuilds the vocabulary for it.
        self._tokenizer = (
            vocab_or_tokenizer
            if vocab_size is None and not isinstance(vocab_or_tokenizer, NumberVocab)
            else None
        )
        refuse_number_level(kind, "NTLossForTrainer", NUMBER_LEVEL_INSTEAD)
        self.spec = LossSpec.build(
            self.vocab,
            kind=kind,
            reweigh=reweigh,
            squash_factor=squash_factor,
            ignore_index=ignore_index,
            reduction="mean",
            shift=shift,
            capturable=capturable,
        )
        self.ntl_weight = check_ntl_weight(ntl_weight)
        if compile is not None:
            check_bool("compile", compile)
        self._compile = compile
        self.logits_free = check_bool("logits_free", logits_free)
        self.impl = check_impl(impl)
        self.cross_entropy = check_cross_entropy(cross_entropy)
        self._head_spec = self.spec  # the logits-free loss's settings (attach adds a soft cap)
        self._terms = self._loss_terms(compile=bool(compile))
        self._link: StepLink | None = None
        self._in_forward: _LossInForward | None = None
        self._exactness_checked = False

    def _loss_terms(
        self, *, compile: bool, **compile_options: Any
    ) -> Callable[..., CEWithNTLOutput]:
        terms = functools.partial(
            ce_plus_ntl,
            spec=self.spec,
            head_spec=self._head_spec,
            ntl_weight=self.ntl_weight,
            impl=self.impl,
        )
        if not compile:
            return terms
        compiled: Callable[..., CEWithNTLOutput] = torch.compile(terms, **compile_options)
        return compiled

    def __repr__(self) -> str:
        spec = self.spec
        return (
            f"NTLossForTrainer(ntl_weight={self.ntl_weight}, kind={spec.kind!r}, "
            f"reweigh={spec.reweigh}, squash_factor={spec.squash_factor}, "
            f"ignore_index={spec.ignore_index}, shift={spec.shift}, "
            f"logits_free={self.logits_free}, impl={self.impl!r}, {self.vocab!r})"
        )

    # ------------------------------------------------------------------ the loss
    def __call__(
        self,
        outputs: Any,
        labels: torch.Tensor | None,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        """The loss of one micro-batch; ``outputs.logits`` (B, T, V), ``labels`` (B, T). In a
        logits-free training step the model's forward computed it already (from the final
        hidden states and the output layer's weight) and ``outputs.logits`` is None."""
        in_forward = self._in_forward
        step = None if in_forward is None else in_forward.step
        if step is not None and step.loss is not None and labels is step.labels:
            return step.loss
        if in_forward is not None and step is not None and not in_forward.warned:
            in_forward.warned = True
            warnings.warn(
                "logits_free=True: the model the trainer called did not compute the loss in its "
                "forward (its forward was replaced after attach(), e.g. by "
                "use_liger_kernel): the loss is computed from the logits",
                stacklevel=2,
            )
        return self._loss(outputs, _logits_of(outputs), labels, num_items_in_batch)

    def _forward_computing_the_loss(
        self, own_forward: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """The attached model's forward: the model's own, which in the trainer's training calls
        (see :func:`_labels_to_the_forward`) computes the loss logits-free while it runs."""
        in_forward = self._in_forward
        assert in_forward is not None
        step = in_forward.step
        if step is None or step.loss is not None or not torch.is_grad_enabled():
            return own_forward(*args, **kwargs)
        outputs, hidden, head = run_forward(
            own_forward, in_forward.bypass, self.vocab.vocab_size, args, kwargs
        )
        step.loss = self._loss(outputs, hidden, step.labels, step.num_items_in_batch, head)
        return with_loss(outputs, step.loss, head)

    def _loss(
        self,
        outputs: Any,
        logits: torch.Tensor,
        labels: torch.Tensor | None,
        num_items_in_batch: torch.Tensor | int | None,
        head: BypassedHead | None = None,
    ) -> torch.Tensor:
        """``Σ ce / |T| + ntl_weight · Σ ntl / |P|`` of the logits (B, T, V), or of the hidden
        states (B, T, H) and the bypassed ``head``, with the step's counts where they are known,
        recorded for the logs."""
        if labels is None:
            raise ValueError(
                "labels are missing: the batch has no 'labels' entry. Use a data collator that "
                "adds them (DataCollatorForLanguageModeling(tokenizer, mlm=False), or copy "
                "input_ids with -100 on padding and prompt tokens), and keep 'labels' in the "
                "dataset (remove_unused_columns drops columns the model's forward does not name)"
            )
        if self.spec.shift and _is_encoder_decoder_output(outputs):
            raise ValueError(
                "the model is an encoder-decoder (its output has encoder_last_hidden_state) and "
                "shift=True: its decoder already reads right-shifted labels, so the logits at t "
                "predict the label at t. Use NTLossForTrainer(..., shift=False)"
            )
        columns = logits.shape[-1] if logits.dim() else 0
        self._check_vocab_size(columns if head is None else full_shape(head.weight)[0])
        tables = self.vocab.tables(logits.device)
        link = self._link
        dtype = denominator_dtype(logits)
        if link is None:
            local_counts = count_targets(labels, tables.position_of_id, self.spec)
            tokens, numbers = token_share_denominators(local_counts, num_items_in_batch, dtype)
            counts = StepCounts(tokens, numbers, local_counts)
        else:
            counts = link.counts(labels, num_items_in_batch, tables.position_of_id, dtype)
        if counts.local is not None and num_items_in_batch is not None:
            self._warn_if_inexact(counts.local[0], counts.tokens)
        out = self._terms(logits, labels, tables, counts.tokens, counts.numbers, head)
        if link is not None:
            link.record(out.ce, out.ntl, counts)
        return out.loss

    def _check_vocab_size(self, columns: int) -> None:
        """Refuse ``columns`` logits per position other than the vocabulary's size."""
        expected = self.vocab.vocab_size
        if columns == expected:
            return
        hint = (
            f"the output layer is larger than the tokenizer: build the loss with "
            f"NTLossForTrainer(tokenizer, vocab_size={columns}) (model.config.vocab_size)"
            if columns > expected
            else "the tokenizer has tokens the model lacks: call "
            "model.resize_token_embeddings(len(tokenizer)) before training, or build the loss "
            "from the model's own tokenizer"
        )
        raise ValueError(
            f"the model produces {columns} logits per position but the NumberVocab was built for "
            f"vocab_size={expected} (the tokenizer and the model do not match): {hint}"
        )

    def _warn_if_inexact(self, local_tokens: torch.Tensor, tokens: torch.Tensor) -> None:
        # Checked on the first training micro-batch only: the comparison reads a boolean back
        # from the device, which on a GPU would stall every step. Accumulation and several
        # processes already show in the first micro-batch of the first step.
        if self._exactness_checked or not torch.is_grad_enabled():
            return
        self._exactness_checked = True
        if bool(local_tokens.to(tokens.device) != tokens):
            warnings.warn(
                "num_items_in_batch counts more tokens than this micro-batch holds (gradient "
                "accumulation or several processes): NTL's mean over number positions is "
                "approximated by weighing each micro-batch by its share of tokens. Call "
                "loss_fn.attach(trainer) to make it exact",
                stacklevel=3,
            )

    # ------------------------------------------------------------------ the trainer
    def attach(self, trainer: Any) -> Any:
        """Make this loss the trainer's loss, exact over accumulated micro-batches and processes,
        with ``ce`` and ``ntl`` in its logs. Returns the trainer.

        Works with ``transformers.Trainer`` and its subclasses (TRL's ``SFTTrainer``,
        ``Seq2SeqTrainer``). On TRL's ``SFTTrainer`` from 1.16 on without a
        ``compute_loss_func`` (no label smoothing) it keeps TRL's own loss computation and
        metrics and adds NTL to them, without the ``compute_loss_func`` that TRL deprecates
        (:mod:`numtok.hf._trl`, ``cross_entropy``): one forward per micro-batch, no logits.
        Everywhere else it sets ``trainer.compute_loss_func`` to this loss when it is unset
        and wraps three of the trainer's methods on the instance: ``get_batch_samples`` (counts
        the step's target and number positions), ``log`` (adds ``ce`` and ``ntl``) and
        ``evaluation_loop`` (adds ``eval_ce`` and ``eval_ntl``). With ``logits_free=True`` it
        also patches the model's forward (on the instance, before the trainer wraps the model)
        and wraps ``compute_loss``, which hands the batch's labels to it: in training calls the
        model's forward computes the loss from its final hidden states and the output layer's
        weight while it runs (the mechanism of :func:`numtok.hf.patch_model`, see
        :mod:`numtok.hf._in_forward`), where FSDP holds the weight gathered, and returns no
        logits; this loss returns that value.

        Raises:
            ValueError: the trainer has another ``compute_loss_func``; this loss is already
                attached; the model's output layer does not match the vocabulary; an
                encoder-decoder model with ``shift=True``; ``torch.nn.DataParallel`` (several
                GPUs in one process; use DDP through torchrun or accelerate). With
                ``logits_free=True``: a model whose logits are not its output layer's product,
                soft-capped or not (a logit scale together with a bias), an output layer that is
                not a plain ``nn.Linear``, a model patched by ``patch_model`` already. With
                ``logits_free=True`` or on TRL's route: tensor parallelism (``tp_plan``,
                DeepSpeed's ``tensor_parallel.autotp_size``: the layer's weight is split inside
                the model's forward). FSDP2 and DeepSpeed ZeRO-2/3 are tested exact (two
                processes, every route); FSDP1 is not.
        """
        methods = ("get_batch_samples", "log", "evaluation_loop")
        for method in (*methods, "compute_loss") if self.logits_free else methods:
            if not callable(getattr(trainer, method, None)):
                raise TypeError(
                    f"trainer must be a transformers.Trainer (it has no {method}() method), "
                    f"got {type(trainer).__name__}"
                )
        if self._link is not None:
            raise ValueError("this NTLossForTrainer is already attached to a trainer")
        current = getattr(trainer, "compute_loss_func", None)
        if current is not None and current is not self:
            raise ValueError(
                f"the trainer already has another compute_loss_func ({current!r}); pass "
                "compute_loss_func=loss_fn to the Trainer or leave it unset"
            )
        args = trainer.args
        if getattr(args, "n_gpu", 1) > 1:
            raise ValueError(
                f"the trainer uses torch.nn.DataParallel over {args.n_gpu} GPUs in one process, "
                "which NTLossForTrainer does not support: launch one process per GPU with "
                "torchrun or accelerate launch (DDP)"
            )
        facts = model_facts(trainer.model, trainer)
        self._check_model(facts)
        link = self._step_link(trainer, facts)
        install = self._route(trainer, facts, link)
        self._link = link
        link.wrap(trainer)
        install(trainer)
        return trainer

    def _route(self, trainer: Any, facts: ModelFacts, link: StepLink) -> Callable[[Any], None]:
        """The route for this trainer and its model, chosen from ``facts`` and checked (what it
        refuses, the probes it runs on the model) before anything is changed: what installs it
        on the trainer."""
        if self.cross_entropy != "auto" and not facts.on_trl:
            raise ValueError(
                f"cross_entropy={self.cross_entropy!r} chooses the cross-entropy on TRL's "
                f"SFTTrainer (from 1.16 on, without compute_loss_func, label smoothing or "
                f"sequence parallelism), got a {type(trainer).__name__}: leave "
                "cross_entropy='auto'"
            )
        if facts.on_trl or self.logits_free:  # the routes that read the weight in the forward
            refuse_tensor_parallelism(
                facts.tp_size,
                "pass compute_loss_func=loss_fn to the SFTTrainer (the loss from the logits)"
                if facts.on_trl
                else "use logits_free=False",
            )
        if facts.on_trl:
            chosen = self.cross_entropy
            if chosen == "auto":
                chosen = auto_cross_entropy(trainer.args.device)
            route = trl_route(trainer, facts, self.vocab, self.spec, self.ntl_weight, link, chosen)
            return route.install
        bypass = facts.bypass(_logits_of) if self.logits_free else None
        return lambda trainer: self._install(trainer, facts.loss_model, bypass)

    def _install(self, trainer: Any, model: Any, bypass: OutputLayerBypass | None) -> None:
        """Make this loss the trainer's ``compute_loss_func``, compiled where the trainer
        compiles; with a ``bypass`` (logits-free), patch the ``model``'s forward to compute it
        and hand it the batch's labels."""
        args = trainer.args
        trainer.compute_loss_func = self
        if bypass is not None and bypass.softcap is not None:
            # The model's soft cap, switched off during bypassed steps, applied by the loss.
            self._head_spec = dataclasses.replace(self.spec, logit_softcap=bypass.softcap)
        if self._compile is None and getattr(args, "torch_compile", False):
            self._terms = self._loss_terms(
                compile=True,
                backend=args.torch_compile_backend or "inductor",
                mode=args.torch_compile_mode,
            )
        else:
            self._terms = self._loss_terms(compile=bool(self._compile))
        if bypass is not None:
            self._in_forward = in_forward = _LossInForward(bypass)
            install_forward(
                model,
                self,
                "NTLossForTrainer(logits_free=True).attach",
                lambda own_forward: functools.partial(
                    self._forward_computing_the_loss, own_forward
                ),
            )
            _labels_to_the_forward(trainer, in_forward)

    def _step_link(self, trainer: Any, facts: ModelFacts) -> StepLink:
        """How this loss counts the trainer's steps and sums over its processes."""
        args = trainer.args
        return StepLink(
            vocab=self.vocab,
            spec=self.spec,
            gather=trainer.accelerator.gather,
            sum_over_processes=bool(getattr(args, "average_tokens_across_devices", False))
            and args.world_size > 1,
            replicas=facts.replicas,
        )

    def _check_model(self, facts: ModelFacts) -> None:
        """Refuse an encoder-decoder with ``shift=True`` (warn of a causal LM with
        ``shift=False``), and an output layer of another size than the vocabulary, after
        rebuilding a tokenizer's vocabulary for a layer padded beyond it."""
        name = type(facts.model).__name__
        if self.spec.shift and facts.is_encoder_decoder:
            raise ValueError(
                f"{name} is an encoder-decoder model and shift=True: its decoder "
                "already reads right-shifted labels, so the logits at t predict the label at t. "
                "Use NTLossForTrainer(..., shift=False)"
            )
        if not self.spec.shift and facts.is_encoder_decoder is False:
            warnings.warn(
                f"{name} is a causal LM and shift=False: the logits at t will be "
                "trained to predict the label at t, their own input. Keep shift=True unless the "
                "labels are already shifted",
                stacklevel=3,
            )
        if facts.columns is not None:
            self._fit_output_layer(facts.columns)
            self._check_vocab_size(facts.columns)

    def _fit_output_layer(self, columns: int) -> None:
        """Built from a tokenizer without ``vocab_size`` and the model's output layer is padded
        beyond it (GPT-2's 50,257 tokens in 50,304 logits): the vocabulary of ``columns`` logits,
        the padding columns no number tokens, as :func:`numtok.hf.patch_model` builds it."""
        if self._tokenizer is None or columns <= self.vocab.vocab_size:
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # missing digits: warned when this loss was built
            self.vocab = NumberVocab.from_tokenizer(self._tokenizer, vocab_size=columns)
        self.spec = dataclasses.replace(self.spec, vocab_size=columns)
        self._head_spec = dataclasses.replace(self._head_spec, vocab_size=columns)
        self._terms = self._loss_terms(compile=bool(self._compile))
