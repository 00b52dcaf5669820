"""numtok with Hugging Face transformers: the Trainer/TRL adapter (:class:`NTLossForTrainer`,
:mod:`numtok.hf.trainer`) and the logits-free bypass of a model's output layer it uses
(:mod:`numtok.hf._head`). Nothing here imports ``transformers``: models and trainers are read by
duck typing."""

from numtok.hf.trainer import NTLossForTrainer

__all__ = ["NTLossForTrainer"]
