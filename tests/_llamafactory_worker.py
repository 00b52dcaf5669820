"""Run inside an environment with LLaMA-Factory 0.9.5 (built by tests/test_llamafactory.py): the
launcher of docs/integrations.md (a ``TrainerCallback`` that patches the model, passed to
LLaMA-Factory's ``run_exp``) trains a tiny Llama for three steps of supervised fine-tuning from a
YAML config, in a process of its own as ``llamafactory-cli train`` would; the same three steps in
a plain loop (the same initial weights, batches and optimizer; CE + 0.3·NTL by
``numtok.cross_entropy_with_ntl`` of the unpatched model's logits) must give the same losses and
weights, for full fine-tuning, for two micro-batches per step and for LoRA. Prints ``SCENARIO
<name> ok ...`` with the differences after each scenario; any failure is a traceback and a
non-zero exit.

    python tests/_llamafactory_worker.py WORK_DIR
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _hf_tiny import EQUAL_SHARES, EXAMPLES, build_model, build_tokenizer, collate

TESTS = Path(__file__).resolve().parent

#: The launcher is the docs' block that starts with this line.
LAUNCHER_FIRST_LINE = "# train_ntl.py:"
#: Between the two routes (float32, CPU): each step's loss, absolutely; the trained weights, as
#: max |difference| / max |weight|.
LOSS_TOLERANCE = 1e-5
WEIGHT_TOLERANCE = 1e-5
NTL_WEIGHT = 0.3
STEPS = 3
LEARNING_RATE = 0.01
MAX_GRAD_NORM = 1.0


def launcher_from_the_docs() -> str:
    text = (TESTS.parent / "docs" / "integrations.md").read_text()
    blocks = re.findall(r"^```python[^\n]*\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)
    (launcher,) = [block for block in blocks if block.startswith(LAUNCHER_FIRST_LINE)]
    return launcher


def write_model_and_data(work: Path, examples: list[tuple[str, str]]) -> Path:
    tokenizer = build_tokenizer()
    model_dir = work / "tiny-llama"
    build_model(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    rows = [{"instruction": prompt, "input": "", "output": answer} for prompt, answer in examples]
    (work / "numbers.json").write_text(json.dumps(rows))
    info = {"numbers": {"file_name": "numbers.json"}}  # the Alpaca columns
    (work / "dataset_info.json").write_text(json.dumps(info))
    return model_dir


def write_config(work: Path, name: str, model_dir: Path, **settings: Any) -> Path:
    """LLaMA-Factory's SFT config: full fine-tuning, the template that adds nothing, the data in
    order, AdamW at a constant rate with LLaMA-Factory's gradient clipping, CPU, float32."""
    config: dict[str, Any] = {
        "model_name_or_path": str(model_dir),
        "trust_remote_code": False,
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "full",
        "dataset": "numbers",
        "dataset_dir": str(work),
        "template": "empty",
        "cutoff_len": 64,
        "overwrite_cache": True,
        "preprocessing_num_workers": None,
        "disable_shuffling": True,
        "output_dir": str(work / f"out-{name}"),
        "logging_steps": 1,
        "save_strategy": "no",
        "plot_loss": False,
        "overwrite_output_dir": True,
        "report_to": "none",
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 1,
        "max_steps": STEPS,
        "learning_rate": LEARNING_RATE,
        "lr_scheduler_type": "constant",
        "optim": "adamw_torch",
        "max_grad_norm": MAX_GRAD_NORM,
        "seed": 0,
        "bf16": False,
        "fp16": False,
        "use_cpu": True,
        "dataloader_num_workers": 0,
    }
    config.update(settings)
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


Weights = dict[str, torch.Tensor]


def train_with_llamafactory(work: Path, config: Path) -> tuple[list[float], Weights]:
    """``python train_ntl.py config.yaml`` in a fresh process: its logged losses and the weights
    it saved (the model's, or LoRA's adapter)."""
    from safetensors.torch import load_file

    launcher = work / "train_ntl.py"
    launcher.write_text(launcher_from_the_docs())
    result = subprocess.run(
        [sys.executable, str(launcher), str(config)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    out = Path(yaml.safe_load(config.read_text())["output_dir"])
    state = json.loads((out / "trainer_state.json").read_text())
    losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    (weights,) = [
        out / name
        for name in ("model.safetensors", "adapter_model.safetensors")
        if (out / name).exists()
    ]
    return losses, load_file(str(weights))


def encode(tokenizer: Any, prompt: str, answer: str) -> dict[str, list[int]]:
    """What LLaMA-Factory's ``empty`` template makes of an Alpaca row: the prompt's tokens, then
    the answer's, nothing between or after them; the loss on the answer only."""
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    return {"input_ids": prompt_ids + answer_ids, "labels": [-100] * len(prompt_ids) + answer_ids}


def plain_model(model_dir: Path, lora: bool) -> Any:
    """The model as LLaMA-Factory builds it: its seed, then the weights, then (LoRA) its adapter
    on every linear layer but the output layer (rank 8, alpha 16, no dropout), drawn from the
    same random state."""
    from transformers import LlamaForCausalLM, set_seed

    set_seed(0)
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if lora:
        from peft import LoraConfig, TaskType, get_peft_model

        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        config = LoraConfig(
            task_type=TaskType.CAUSAL_LM,
            r=8,
            lora_alpha=16,
            lora_dropout=0.0,
            target_modules=targets,
        )
        model = get_peft_model(model, config)
    model.train()
    return model


def trained_weights(model: Any) -> Weights:
    """What LLaMA-Factory saves: the model's weights, or the adapter's under PEFT's names."""
    if hasattr(model, "peft_config"):
        from peft import get_peft_model_state_dict

        return {
            key: value.detach().clone() for key, value in get_peft_model_state_dict(model).items()
        }
    return {key: value.detach().clone() for key, value in model.state_dict().items()}


def train_in_a_plain_loop(
    model_dir: Path,
    examples: list[tuple[str, str]],
    batch_size: int,
    accumulation: int,
    lora: bool,
) -> tuple[list[float], Weights, Weights]:
    """The same steps by hand: the examples in order, AdamW on the trainable weights, gradient
    clipping, CE + 0.3·NTL of the unpatched model's logits over each step's whole batch. Returns
    the losses, the weights before and the weights after."""
    from transformers import AutoTokenizer

    from numtok import NumberVocab, cross_entropy_with_ntl

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = plain_model(model_dir, lora)
    initial = trained_weights(model)
    vocab = NumberVocab.from_tokenizer(tokenizer, vocab_size=model.config.vocab_size)
    data = [encode(tokenizer, prompt, answer) for prompt, answer in examples]
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=LEARNING_RATE, weight_decay=0.0)
    step_size = batch_size * accumulation
    losses = []
    for step in range(STEPS):
        start = step * step_size % len(data)
        batch = collate(data[start : start + step_size], pad_id=tokenizer.pad_token_id)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        terms = cross_entropy_with_ntl(
            logits, batch["labels"], vocab, ntl_weight=NTL_WEIGHT, shift=True
        )
        # NTL weighs far above the tolerance: a run without it cannot pass.
        assert NTL_WEIGHT * float(terms.ntl) > 100 * LOSS_TOLERANCE, terms
        terms.loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, MAX_GRAD_NORM)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(terms.loss.detach()))
    return losses, initial, trained_weights(model)


def scenario(work: Path, name: str, examples: list[tuple[str, str]], **settings: Any) -> None:
    """Train by both routes from the same saved model and compare."""
    folder = work / name
    folder.mkdir()
    model_dir = write_model_and_data(folder, examples)
    config = write_config(folder, name, model_dir, **settings)
    losses, weights = train_with_llamafactory(folder, config)
    expected_losses, initial, expected = train_in_a_plain_loop(
        model_dir,
        examples,
        settings.get("per_device_train_batch_size", 4),
        settings.get("gradient_accumulation_steps", 1),
        lora=settings.get("finetuning_type") == "lora",
    )
    assert len(losses) == STEPS, losses
    loss_difference = max(abs(a - b) for a, b in zip(losses, expected_losses, strict=True))
    assert loss_difference <= LOSS_TOLERANCE, (losses, expected_losses)
    assert weights.keys() == expected.keys(), (sorted(weights), sorted(expected))
    scale = max(float(w.abs().max()) for w in expected.values())
    weight_difference = max(float((weights[k] - expected[k]).abs().max()) for k in weights) / scale
    assert weight_difference <= WEIGHT_TOLERANCE, weight_difference
    moved = max(float((expected[k] - initial[k]).abs().max()) for k in expected) / scale
    assert moved > 100 * WEIGHT_TOLERANCE, moved  # the steps changed the weights
    print(
        f"SCENARIO {name} ok: losses {[round(x, 6) for x in losses]}, max loss difference "
        f"{loss_difference:.1e}, max weight difference {weight_difference:.1e} (relative)",
        flush=True,
    )


def main() -> None:
    work = Path(sys.argv[1])
    scenario(work, "full", EXAMPLES)
    # Two micro-batches per step whose number shares are equal: patch_model's per-call NTL mean,
    # weighted by the call's token share, is then the step's.
    scenario(
        work,
        "accumulated",
        EQUAL_SHARES,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
    )
    # LLaMA-Factory's LoRA (a PeftModel in the trainer), its default targets: all linear layers.
    scenario(work, "lora", EXAMPLES, finetuning_type="lora", lora_target="all")


if __name__ == "__main__":
    main()
