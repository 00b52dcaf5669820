"""One process of the DeepSpeed test (``test_hf_deepspeed.py``), launched by torchrun on CPU (gloo,
``DS_ACCELERATOR=cpu``), for one ZeRO stage.

Each process trains one optimizer step of the tiny Llama (untied and tied, saved by the test in
``MODELS_DIR``) through every route, each under DeepSpeed at that stage: 2 processes × 2
micro-batches of 2 examples, the 8 examples of one step, a torch SGD optimizer (DeepSpeed runs
it on its fp32 partitions), float32. It saves the step's loss and every parameter after the step
(gathered whole) to ``<out>/rank<r>.pt``.

Routes (see :data:`ROUTES`): ``NTLossForTrainer.attach`` to the Trainer from the logits and
logits-free, to TRL's SFTTrainer with TRL's and numtok's cross-entropy (on the examples whose
number shares differ between micro-batches, which attach's step-wide counts make exact);
``patch_model`` with numtok's and the model's cross-entropy in the Trainer (no
``compute_loss_func``) and in a plain ``deepspeed.initialize`` loop, and the number head
(``linear_number_token_loss``) beside the model's own loss in a plain loop (on examples whose
micro-batches hold equal counts, the case where a per-micro-batch mean is exact). Under ZeRO-3
the Trainer's models come from ``from_pretrained`` under the live DeepSpeed configuration, so
inside ``deepspeed.zero.Init`` (partitioned before numtok sees them); the loops' models are
partitioned by ``deepspeed.initialize`` after patching.

Usage: ``torchrun --nproc_per_node 2 tests/_deepspeed_worker.py OUT_DIR MODELS_DIR STAGE
NTL_WEIGHT``
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from numtok import NumberVocab, linear_number_token_loss
from numtok.hf import NTLossForTrainer, patch_model

from _hf_tiny import (
    EQUAL_SHARES,
    EXAMPLES,
    build_dataset,
    build_tokenizer,
    collate,
    training_args,
)

MICRO_BATCH, STEPS, LEARNING_RATE = 2, 2, 0.1


def deepspeed_config(stage: int) -> dict[str, Any]:
    """ZeRO at ``stage`` with a torch optimizer, float32, no gradient clipping (DeepSpeed's
    default clips at 1.0); under ZeRO-3 no parameter is kept whole
    (``stage3_param_persistence_threshold`` 0: by default every parameter of the tiny model,
    below 100k elements, would stay gathered and nothing would be partitioned)."""
    zero: dict[str, Any] = {"stage": stage}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0
    return {
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 0.0,
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
    }


def load(models: Path, tied: bool) -> Any:
    """The saved tiny Llama; inside ``deepspeed.zero.Init`` when a ZeRO-3 configuration is live."""
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(models / ("tied" if tied else "untied"))


def whole_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's full values (ZeRO-3 gathers them; a collective on every process)."""
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
        return {name: p.detach().clone() for name, p in model.named_parameters()}


# ---------------------------------------------------------------------------- the Trainer routes
def _trainer_step(
    out: Path, models: Path, stage: int, tied: bool, route: str, weight: float
) -> Any:
    from transformers import Trainer
    from transformers.integrations import unset_hf_deepspeed_config

    tokenizer = build_tokenizer()
    examples = EQUAL_SHARES if route.startswith("patch") else EXAMPLES
    settings = {
        "per_device_train_batch_size": MICRO_BATCH,
        "gradient_accumulation_steps": STEPS,
        "ddp_backend": "gloo",
        "deepspeed": deepspeed_config(stage),
    }
    args = training_args(out / route, **settings)  # ZeRO-3: from_pretrained under zero.Init
    model = load(models, tied)
    partitioned = stage == 3 and all(p.numel() == 0 for p in model.parameters())
    data = build_dataset(tokenizer, examples)
    if route.startswith("trl"):
        import datasets
        import trl

        sft = trl.SFTConfig(**args.to_dict() | {"max_length": 64, "bf16": False})
        trainer = trl.SFTTrainer(
            model=model,
            args=sft,
            train_dataset=datasets.Dataset.from_list(data),
            processing_class=tokenizer,
        )
        cross_entropy = "numtok" if route == "trl-numtok" else "model"
        NTLossForTrainer(tokenizer, ntl_weight=weight, cross_entropy=cross_entropy).attach(trainer)
    else:
        if route.startswith("patch"):
            cross_entropy = route.removeprefix("patch-")
            patch_model(model, tokenizer, ntl_weight=weight, cross_entropy=cross_entropy)
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=data,
            data_collator=lambda features: collate(features, tokenizer.pad_token_id),
        )
        if route.startswith("attach"):
            logits_free = route == "attach-logits-free"
            NTLossForTrainer(tokenizer, ntl_weight=weight, logits_free=logits_free).attach(trainer)
    trainer.train()
    result = {
        "loss": float(trainer.state.log_history[0]["loss"]),
        "parameters": whole_parameters(trainer.model),
        "partitioned_before_numtok": partitioned,
    }
    del trainer, model
    unset_hf_deepspeed_config()  # the next route's model is built without this configuration
    return result


# ------------------------------------------------------------------------------ the plain loops
def _loop_step(out: Path, models: Path, stage: int, tied: bool, route: str, weight: float) -> Any:
    import deepspeed

    tokenizer = build_tokenizer()
    model = load(models, tied)
    vocab = NumberVocab.from_tokenizer(tokenizer)
    loss_of: Callable[[dict[str, torch.Tensor]], torch.Tensor]
    if route == "loop-number-head":
        head = model.get_output_embeddings()

        def loss_of(batch: dict[str, torch.Tensor]) -> torch.Tensor:
            outputs = engine(**batch, output_hidden_states=True)
            hidden = outputs.hidden_states[-1]  # (B, T, H), after the final norm
            # Outside any module's call ZeRO-3 holds the weight partitioned: gather it to read it.
            with deepspeed.zero.GatheredParameters([head.weight], modifier_rank=None):
                ntl = linear_number_token_loss(
                    hidden, head.weight, batch["labels"], vocab, shift=True
                )
            return outputs.loss + weight * ntl

    else:
        cross_entropy = route.removeprefix("loop-patch-")
        patch_model(model, tokenizer, ntl_weight=weight, cross_entropy=cross_entropy)

        def loss_of(batch: dict[str, torch.Tensor]) -> torch.Tensor:
            return engine(**batch).loss  # type: ignore[no-any-return]

    config = deepspeed_config(stage) | {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": STEPS,
        "train_batch_size": MICRO_BATCH * STEPS * dist.get_world_size(),
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    data = build_dataset(tokenizer, EQUAL_SHARES)
    rank_data = data[dist.get_rank() :: dist.get_world_size()]  # this process's 4 examples
    step_loss = torch.zeros(())
    for start in range(0, len(rank_data), MICRO_BATCH):
        batch = collate(rank_data[start : start + MICRO_BATCH], tokenizer.pad_token_id)
        loss = loss_of(batch)
        engine.backward(loss)  # divides by the accumulation steps
        engine.step()  # the optimizer steps at the accumulation boundary only
        step_loss += loss.detach() / STEPS
    dist.all_reduce(step_loss)
    result = {
        "loss": float(step_loss) / dist.get_world_size(),
        "parameters": whole_parameters(engine.module),
        "partitioned_before_numtok": False,
    }
    engine.destroy()
    return result


#: route name -> how its step runs.
ROUTES: dict[str, Callable[[Path, Path, int, bool, str, float], Any]] = {
    "attach": _trainer_step,
    "attach-logits-free": _trainer_step,
    "trl": _trainer_step,
    "trl-numtok": _trainer_step,
    "patch-numtok": _trainer_step,
    "patch-model": _trainer_step,
    "loop-patch-numtok": _loop_step,
    "loop-patch-model": _loop_step,
    "loop-number-head": _loop_step,
}


def main() -> None:
    out, models, stage, weight = (
        Path(sys.argv[1]),
        Path(sys.argv[2]),
        int(sys.argv[3]),
        float(sys.argv[4]),
    )
    torch.set_num_threads(1)
    import deepspeed  # (here: the test imports this module's names without starting DeepSpeed)

    deepspeed.init_distributed("gloo")
    results: dict[str, Any] = {}
    for route, step in ROUTES.items():
        for tied in (False, True):
            name = f"{route}-{'tied' if tied else 'untied'}"
            results[name] = step(out, models, stage, tied, route, weight)
            gc.collect()
    results["world_size"] = dist.get_world_size()
    torch.save(results, out / f"rank{dist.get_rank()}.pt")
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
