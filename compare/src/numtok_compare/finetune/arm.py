"""One arm of a pretrained causal LM fine-tuned on one seed, as the runner of every comparison
(:mod:`numtok_compare.runner.phases`) trains it: built (:func:`build_arm`) and rebuilt once
trained (:func:`load_arm`).

Every arm of a seed starts from the same pretrained weights (with LoRA, the same adapters: their
initialisation is drawn from the seed) and takes the same batches (a permutation of the training
examples drawn from the seed). The token arms compute their loss on the answer positions only: the
decoder runs over the whole batch (the tokens every row begins with once,
:mod:`numtok_compare.finetune.prefix`), the output layer only at the positions whose next label
is part of an answer, and :class:`numtok_compare.objectives.Objective` (CE, CE + λ·NTL-WAS,
NTL-MSE, DEL, or Gaussian-label-smoothed CE) reads those logits. The ``head`` arm (rJokes) reads
the hidden state of each prompt's last token into a linear layer and minimises the squared error to
the standardised score. The training loop is every comparison's
(:func:`numtok_compare.runner.phases.train`: AdamW, linear warm-up then cosine decay, gradient
clipping, logged loss averages, checkpoints an interrupted arm resumes from).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from numtok import NumberVocab
from numtok_compare.finetune.config import FinetuneConfig
from numtok_compare.finetune.examples import IGNORE_INDEX, Encoded, training_batch
from numtok_compare.finetune.models import causal_lm_of
from numtok_compare.finetune.prefix import decoder_states
from numtok_compare.objectives import Objective
from numtok_compare.runner.loop import load_trainable_state, optimizer_step
from numtok_compare.runner.phases import Arm, Job
from numtok_compare.runner.run_folder import WEIGHTS

__all__ = [
    "Trained",
    "answer_logits",
    "build_arm",
    "load_arm",
    "load_model",
    "prompt_states",
]


def load_model(model_dir: Path, config: FinetuneConfig, seed: int) -> Any:
    """The pretrained model in float32, in training mode; with LoRA wrapped in adapters on the
    q and v projections (rank ``lora_rank``, α = 2·rank, initialised from ``seed``)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as transformers_logging

    # The harness loads the model once per arm and phase: no loading bar each time.
    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if config.adaptation == "lora":
        import peft

        torch.manual_seed(seed)
        lora = peft.LoraConfig(
            r=config.lora_rank, lora_alpha=2 * config.lora_rank, lora_dropout=0.0,
            target_modules=["q_proj", "v_proj"],
        )  # fmt: skip
        model = peft.get_peft_model(model, lora)
    return model.to(config.device)


def answer_logits(model: Any, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits (P, V), labels (P,))`` at the P positions whose next label is not ignored: the
    decoder over the whole batch (the rows' shared beginning once,
    :func:`~numtok_compare.finetune.prefix.decoder_states`), the output layer at those
    positions only. The labels run in
    the batch's order, so a number's digits stay consecutive (an answer's end-of-turn token
    separates it from the next example's)."""
    causal_lm = causal_lm_of(model)
    hidden, shared = decoder_states(causal_lm.model, batch["input_ids"], batch["attention_mask"])
    # hidden[:, t] is position shared + t, which predicts the label at shared + t + 1 (the
    # prefix's own positions predict prompt tokens, never an answer).
    next_labels = batch["labels"][:, shared + 1 :]  # (B, T - shared - 1)
    where = next_labels != IGNORE_INDEX
    logits = causal_lm.lm_head(hidden[:, :-1][where])  # (P, V)
    return logits, next_labels[where]


def prompt_states(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B, H): each right-padded row's hidden state at its prompt's last token (where the
    answer is predicted from)."""
    causal_lm = causal_lm_of(model)
    hidden, shared = decoder_states(causal_lm.model, batch["input_ids"], batch["attention_mask"])
    answers = batch["labels"] != IGNORE_INDEX
    last_prompt = answers.int().argmax(dim=1) - 1  # the first answer token's position, less 1
    states: torch.Tensor = hidden[torch.arange(hidden.shape[0]), last_prompt - shared]
    return states


@dataclass
class Trained:
    """A fine-tuned arm ready to score: the model and, for the ``head`` arm, its layer with the
    training answers' scale (mean, standard deviation)."""

    model: Any
    head: nn.Linear | None
    score_scale: tuple[float, float]


def _answer_scale(examples: Sequence[Encoded]) -> tuple[float, float]:
    """The training answers' mean and standard deviation (the head's targets are standardised)."""
    values = torch.tensor([e.value for e in examples], dtype=torch.float64)
    return float(values.mean()), float(values.std().clamp_min(1e-6))


def _new_head(model: Any, arm: str, seed: int, device: str) -> nn.Linear | None:
    if arm != "head":
        return None
    torch.manual_seed(seed)
    return nn.Linear(causal_lm_of(model).config.hidden_size, 1).to(device)


def _trainable(model: Any, head: nn.Linear | None) -> nn.ModuleList:
    """What the training loop updates and stores: the model (with LoRA, its adapters require a
    gradient, the pretrained weights do not) and the head."""
    return nn.ModuleList([model] + ([head] if head is not None else []))


def load_arm(
    config: FinetuneConfig, job: Job, model_dir: Path, examples: Sequence[Encoded], directory: Path
) -> Trained:
    """The arm :func:`build_arm` built and the runner trained into ``directory`` (its
    ``model.pt``: the parameters training changed), rebuilt from the pretrained model on
    ``config.device``, in eval mode; the ``base`` arm: the pretrained model."""
    model = load_model(model_dir, config, job.seed)
    head = _new_head(model, job.arm, job.seed, config.device)
    if job.arm != "base":
        state = torch.load(directory / WEIGHTS, map_location=config.device, weights_only=True)
        load_trainable_state(_trainable(model, head), state)
    return Trained(model.eval(), head, _answer_scale(examples))


def build_arm(
    config: FinetuneConfig,
    job: Job,
    model_dir: Path,
    examples: Sequence[Encoded],
    vocab: NumberVocab,
    pad_id: int,
) -> Arm:
    """``job``'s arm (at λ = ``job.weight`` for a number-loss arm), ready to fine-tune for
    ``config.steps`` steps of ``config.batch_size`` ``examples``; the ``base`` arm does not train
    (the pretrained model, untouched)."""
    seed, arm = job.seed, job.arm
    model = load_model(model_dir, config, seed)
    scale = _answer_scale(examples)
    if arm == "base":
        return Arm(model, None, None, False, False, Trained(model.eval(), None, scale))
    head = _new_head(model, arm, seed, config.device)
    torch.manual_seed(seed)
    objective = None if head is not None else Objective(arm, vocab, ntl_weight=job.weight)
    groups: list[dict[str, Any]] = [{"params": [p for p in model.parameters() if p.requires_grad]}]
    if head is not None:
        head_rate = config.head_learning_rate or config.learning_rate
        groups.append(
            {"params": list(head.parameters()), "lr_scale": head_rate / config.learning_rate}
        )
    trainable = _trainable(model, head)
    optimizer = torch.optim.AdamW(groups, lr=config.learning_rate, weight_decay=config.weight_decay)
    order = torch.randperm(
        len(examples), generator=torch.Generator().manual_seed(1000 + seed)
    ).tolist()

    def step(index: int, learning_rate: float) -> Any:
        start = (index * config.batch_size) % len(order)
        picked = [examples[order[(start + i) % len(order)]] for i in range(config.batch_size)]
        batch = {k: v.to(config.device) for k, v in training_batch(picked, pad_id).items()}
        ce = ntl = None
        if head is not None:
            targets = torch.tensor([(e.value - scale[0]) / scale[1] for e in picked])
            predicted = head(prompt_states(model, batch)).squeeze(-1)
            loss = nn.functional.mse_loss(predicted, targets.to(predicted))
        else:
            assert objective is not None
            loss, ce, ntl = objective(*answer_logits(model, batch))
        optimizer_step(trainable, optimizer, loss, config, learning_rate)
        return loss, ce, ntl

    return Arm(
        trainable, optimizer, step,
        has_ce=objective is not None, has_ntl=objective is not None and objective.ntl is not None,
        answerer=Trained(model, head, scale),
    )  # fmt: skip
