"""One process of the FSDP2/DDP test (``test_hf_fsdp.py``), launched by torchrun on CPU (gloo).

Each process builds the tiny Llama (untied and tied) and patches it before wrapping it: with
``patch_model`` (logits-free, or beside the model's own cross-entropy), by attaching
``NTLossForTrainer(logits_free=True)`` to a Trainer of it, or by attaching ``NTLossForTrainer``
to TRL's SFTTrainer of it (TRL's fused head or numtok's cross-entropy). It shards the model
with FSDP2 (``fully_shard`` on every decoder layer and on the root, what accelerate's
``fsdp_version: 2`` does, which refuses a CPU) or wraps it in DDP, runs one forward and backward
of the whole batch (the same on every process; for the attached loss through
``trainer.compute_loss``, as a training step calls it) and saves the loss and every parameter's
full gradient to ``<out>/rank<r>.pt``.

Usage: ``torchrun --nproc_per_node 2 tests/_fsdp_worker.py OUT_DIR NTL_WEIGHT``
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from numtok.hf import NTLossForTrainer, patch_model

from _hf_tiny import build_dataset, build_model, build_tokenizer, collate, training_args

#: Every route run under FSDP2 (and patch_model's under DDP too).
WRAPPERS = ("fsdp2", "ddp", "model-ce-fsdp2", "attached-fsdp2", "trl-fsdp2", "trl-numtok-fsdp2")


def build(tokenizer: Any, tied: bool) -> Any:
    model = build_model(tokenizer)
    if tied:
        model.config.tie_word_embeddings = True
        model.tie_weights()
    return model


def _sft_trainer(tokenizer: Any, model: Any, out_dir: Path) -> Any:
    import datasets
    import trl

    data = datasets.Dataset.from_list([{"text": "1+1=2"}])
    settings = training_args(out_dir / "sft", ddp_backend="gloo").to_dict()
    args = trl.SFTConfig(**settings | {"max_length": 64, "bf16": False})
    return trl.SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)


def run(out_dir: Path, wrapper: str, tied: bool, ntl_weight: float) -> dict[str, Any]:
    """``wrapper``: "fsdp2" or "ddp" (``patch_model``), "model-ce-fsdp2" (``patch_model(...,
    cross_entropy="model")``), "attached-fsdp2" (the Trainer's loss), "trl-fsdp2" and
    "trl-numtok-fsdp2" (attached to TRL's SFTTrainer, TRL's or numtok's cross-entropy)."""
    from transformers import Trainer

    tokenizer = build_tokenizer()
    batch = collate(build_dataset(tokenizer), tokenizer.pad_token_id)
    trainer = None
    if wrapper == "attached-fsdp2":
        trainer = Trainer(
            model=build(tokenizer, tied),
            args=training_args(out_dir / "trainer", ddp_backend="gloo"),
        )
        NTLossForTrainer(tokenizer, ntl_weight=ntl_weight, logits_free=True).attach(trainer)
        model = trainer.model
    elif wrapper.startswith("trl"):
        trainer = _sft_trainer(tokenizer, build(tokenizer, tied), out_dir)
        cross_entropy = "numtok" if wrapper.startswith("trl-numtok") else "model"
        NTLossForTrainer(tokenizer, ntl_weight=ntl_weight, cross_entropy=cross_entropy).attach(
            trainer
        )
        model = trainer.model
    else:
        cross_entropy = "model" if wrapper.startswith("model-ce") else "numtok"
        model = patch_model(
            build(tokenizer, tied), tokenizer, ntl_weight=ntl_weight, cross_entropy=cross_entropy
        )
    if wrapper.endswith("fsdp2"):
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    else:
        model = DistributedDataParallel(model)
    if trainer is None:
        outputs = model(**batch)
        loss = outputs.loss
    elif wrapper.startswith("trl"):
        loss, outputs = trainer.compute_loss(model, dict(batch), return_outputs=False), None
    else:
        loss, outputs = trainer.compute_loss(model, dict(batch), return_outputs=True)
    loss.backward()
    module = model.module if wrapper == "ddp" else model
    sharded = [hasattr(p.grad, "full_tensor") for p in module.parameters() if p.grad is not None]
    gradients = {
        name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
        for name, p in module.named_parameters()
        if p.grad is not None
    }
    return {
        "loss": loss.detach(),
        "logits": None if outputs is None else outputs.logits,
        "gradients": gradients,
        "sharded": all(sharded),
    }


def main() -> None:
    out_dir = Path(sys.argv[1])
    ntl_weight = float(sys.argv[2])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    results: dict[str, Any] = {
        f"{wrapper}-{'tied' if tied else 'untied'}": run(out_dir, wrapper, tied, ntl_weight)
        for wrapper in WRAPPERS
        for tied in (False, True)
    }
    results["world_size"] = dist.get_world_size()
    torch.save(results, out_dir / f"rank{dist.get_rank()}.pt")
    shut_down_gloo()


def shut_down_gloo() -> None:
    """Destroy the process group and with it gloo's worker threads, joined, while the interpreter
    is whole (why: ``_ddp_worker.shut_down_gloo``).

    ``destroy_process_group()`` alone leaves the group alive here: each of FSDP2's device meshes
    holds its process groups (``_pg_registry``), and torch keeps the meshes alive after the
    models (DTensor's caches of sharding propagation and redistribution plans, among others, hold
    specs that name them), so gloo's worker threads outlived ``main()`` and could still free a
    collective's tensors, under the GIL, once the interpreter had begun to finalize: SIGABRT at
    exit. The meshes are not used again: they let go of their groups, so that destroying frees
    them.
    """
    gc.collect()
    for mesh in [o for o in gc.get_objects() if isinstance(o, DeviceMesh)]:
        mesh._pg_registry.clear()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
