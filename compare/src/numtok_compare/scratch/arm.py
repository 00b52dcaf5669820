"""The arms of every comparison trained from scratch (arithmetic, rJokes): a small Llama built
from ``LlamaConfig`` for a seed (:func:`llama_config`), trained by the ``transformers.Trainer`` of
:class:`~numtok_compare.runner.trainer.TrainerArm` like every arm of every comparison, and rebuilt
as training left it (:class:`TransformerModels`, what a task's models share).

The initial weights come from ``torch.manual_seed(seed)`` and the Trainer, seeded with the seed,
draws the batches; there is no dropout. So every arm of a seed starts from the same trunk weights
and sees the same batches. The arms differ in the loss:

* token arms (``ce``, ``was``, ``mse``, ``gls``, ...): the arm's loss on the answer tokens, from
  batches of :func:`~numtok_compare.runner.batches.answer_batch` (the logits of the answer
  columns only: the prompt carries no loss);
* ``head``: :class:`~numtok_compare.regression_head.RegressionHead` on the model's decoder, the
  squared error of its prediction from the hidden state at ``<answer>`` to the standardised
  answer (:func:`~numtok_compare.runner.batches.regression_batch`); no token loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from numtok import NumberVocab
from numtok_compare.regression_head import RegressionHead
from numtok_compare.runner.batches import Encoded, answer_batch, answer_scale, regression_batch
from numtok_compare.runner.phases import Job
from numtok_compare.runner.run_folder import WEIGHTS, load_trainable_state
from numtok_compare.runner.trainer import TrainerArm
from numtok_compare.scratch.config import TrainingConfig

__all__ = ["TransformerModels", "llama_config", "number_vocab"]

#: The longest sequence a from-scratch model reads: a prompt and its answer.
MAX_POSITIONS = 512


def llama_config(config: TrainingConfig, tokenizer: Any) -> LlamaConfig:
    """A Llama of ``config.n_layers`` layers of width ``config.d_model`` with ``config.n_heads``
    heads (RoPE, RMSNorm pre-norm, a SwiGLU MLP of width ⌊8·d/3⌋, which has the parameters of a
    4·d GELU MLP; tied input and output embeddings) over ``tokenizer``'s vocabulary."""
    return LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=config.d_model,
        intermediate_size=8 * config.d_model // 3, num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads, num_key_value_heads=config.n_heads,
        max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip


def number_vocab(tokenizer: Any) -> NumberVocab:
    """The ten digit tokens of a from-scratch tokenizer as a :class:`~numtok.NumberVocab`."""
    return NumberVocab.from_tokenizer(tokenizer, multi_digit=False, prefixed=False)


class TransformerModels:
    """The small Llama's arms of one seed, as the runner of every comparison builds and rebuilds
    them (:class:`~numtok_compare.runner.phases.Models`); a task sets ``config``, ``tokenizer``
    and the training ``examples`` and adds how an arm is scored on a split."""

    config: TrainingConfig
    tokenizer: Any
    examples: Sequence[Encoded]

    def _model(self, job: Job) -> nn.Module:
        """``job``'s model with the seed's initial weights on ``config.device``: the Llama, or
        the head on its decoder."""
        torch.manual_seed(job.seed)
        llama = LlamaForCausalLM(llama_config(self.config, self.tokenizer))
        model: nn.Module = llama
        if job.arm == "head":
            model = RegressionHead(llama.model, self.config.d_model)
        return model.to(self.config.device)

    def build(self, job: Job) -> TrainerArm:
        """``job``'s arm ready to train for ``config.steps`` steps of ``config.batch_size``
        training examples."""
        model = self._model(job)
        pad_id = self.tokenizer.pad_token_id
        collate = (
            partial(regression_batch, pad_id=pad_id, scale=self.scale)
            if job.arm == "head"
            else partial(answer_batch, pad_id=pad_id)
        )
        return TrainerArm(
            model, self.config, job.seed, job.arm, job.weight, self.examples, collate,
            number_vocab(self.tokenizer), answerer=model, training_args=self.config.training_args,
        )  # fmt: skip

    @property
    def scale(self) -> tuple[float, float]:
        """The training answers' mean and standard deviation (the head's standardisation)."""
        return answer_scale(self.examples)

    def load(self, job: Job, directory: Path) -> nn.Module:
        """``job``'s model with the weights training left in ``directory`` (its ``model.pt``),
        in eval mode."""
        model = self._model(job)
        state = torch.load(directory / WEIGHTS, map_location=self.config.device, weights_only=True)
        load_trainable_state(model, state)
        return model.eval()
