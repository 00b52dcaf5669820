"""numtok with Hugging Face transformers: the Trainer/TRL adapter (:class:`NTLossForTrainer`,
:mod:`numtok.hf.trainer`), the loss inside a model's own forward for every other training loop
(:func:`patch_model`, :mod:`numtok.hf.patch`), a reward for reinforcement learning on numeric
answers (:func:`number_reward`, :mod:`numtok.hf.rewards`), and the logits-free bypass of a
model's output layer the first two use (:mod:`numtok.hf._head`). Nothing here imports
``transformers``: models and trainers are read by duck typing."""

from numtok.hf.patch import last_loss_terms, patch_model, unpatch_model
from numtok.hf.rewards import number_reward
from numtok.hf.trainer import NTLossForTrainer

__all__ = ["NTLossForTrainer", "last_loss_terms", "number_reward", "patch_model", "unpatch_model"]
