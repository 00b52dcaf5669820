"""One arm of a pretrained causal LM fine-tuned on one seed, as the runner of every comparison
(:mod:`numtok_compare.runner.phases`) trains it: built (:func:`build_arm`: the model, trained by
the ``transformers.Trainer`` of :class:`~numtok_compare.runner.trainer.TrainerArm`) and rebuilt
once trained (:func:`load_arm`).

Every arm of a seed starts from the same pretrained weights (with LoRA, the same adapters: their
initialisation is drawn from the seed), and the Trainer, seeded with it, gives every arm the same
batches. The token arms learn the answers only: the prompt's labels are -100, so CE and the number
losses read the answer positions. The ``head`` arm is a
:class:`~numtok_compare.regression_head.RegressionHead` on the model's decoder: the squared error
of its prediction from each prompt's last hidden state to the standardised answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from numtok import NumberVocab
from numtok_compare.finetune.config import FinetuneConfig
from numtok_compare.regression_head import RegressionHead
from numtok_compare.runner.batches import Encoded, answer_scale, regression_batch, training_batch
from numtok_compare.runner.phases import Arm, Job, UntrainedArm
from numtok_compare.runner.run_folder import WEIGHTS, load_trainable_state
from numtok_compare.runner.scoring import causal_lm_of
from numtok_compare.runner.trainer import TrainerArm

__all__ = ["Trained", "build_arm", "load_arm", "load_model"]


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


@dataclass
class Trained:
    """A fine-tuned arm ready to score: the model and, for the ``head`` arm, its layer with the
    training answers' scale (mean, standard deviation)."""

    model: Any
    head: RegressionHead | None
    score_scale: tuple[float, float]


def _with_head(model: Any, arm: str, device: str) -> RegressionHead | None:
    """The ``head`` arm's :class:`RegressionHead` on ``model``'s decoder (None for token arms)."""
    if arm != "head":
        return None
    causal_lm = causal_lm_of(model)
    return RegressionHead(causal_lm.model, causal_lm.config.hidden_size).to(device)


def load_arm(
    config: FinetuneConfig, job: Job, model_dir: Path, examples: Sequence[Encoded], directory: Path
) -> Trained:
    """The arm :func:`build_arm` built and the runner trained into ``directory`` (its
    ``model.pt``: the parameters training changed), rebuilt from the pretrained model on
    ``config.device``, in eval mode; the ``base`` arm: the pretrained model."""
    model = load_model(model_dir, config, job.seed)
    head = _with_head(model, job.arm, config.device)
    if job.arm != "base":
        state = torch.load(directory / WEIGHTS, map_location=config.device, weights_only=True)
        load_trainable_state(head if head is not None else model, state)
    return Trained(model.eval(), head.eval() if head is not None else None, answer_scale(examples))


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
    (the pretrained model, untouched). The head trains at ``head_learning_rate`` when set."""
    model = load_model(model_dir, config, job.seed)
    scale = answer_scale(examples)
    if job.arm == "base":
        return UntrainedArm(Trained(model.eval(), None, scale))
    head = _with_head(model, job.arm, config.device)
    optimizer = None
    if head is not None and config.head_learning_rate is not None:
        groups: list[dict[str, Any]] = [
            {"params": [p for p in head.decoder.parameters() if p.requires_grad]},
            {"params": list(head.head.parameters()), "lr": config.head_learning_rate},
        ]
        optimizer = torch.optim.AdamW(
            groups,
            lr=config.learning_rate, weight_decay=config.weight_decay,
        )  # fmt: skip
    return TrainerArm(
        head if head is not None else model, config, job.seed, job.arm, job.weight, examples,
        partial(regression_batch, pad_id=pad_id, scale=scale) if head is not None
        else partial(training_batch, pad_id=pad_id), vocab,
        answerer=Trained(model, head, scale), optimizer=optimizer,
        training_args=config.training_args,
    )  # fmt: skip
