"""A tiny randomly initialised Llama-style model, its tokenizer and data, for the Hugging Face
tests (``test_hf.py``, ``test_hf_distributed.py`` and the torchrun worker ``_ddp_worker.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from conftest import build_digit_tokenizer

#: Questions whose answers hold from zero to several digits, so that the share of number
#: positions differs between micro-batches (what makes a per-micro-batch NTL mean inexact).
EXAMPLES = [
    ("a+b=", "12345"),
    ("what is x? ", "7"),
    ("say hi: ", "hi"),
    ("a-c=", "908"),
    ("count: ", "1,2,3,4,5,6"),
    ("zero? ", "no"),
    ("z=", "44"),
    ("pi is ", "3.14159"),
]

#: Questions whose answers are 4 tokens with 3 digits: every example has 5 target positions (the
#: answer and the end of sequence) and 3 number positions, so every micro-batch has the same
#: number share, the case where a mean per micro-batch (patch_model's, a plain loop's) is the
#: step's.
EQUAL_SHARES = [
    ("a+b=", "123x"),
    ("what is x? ", "7 45"),
    ("say: ", "9.01"),
    ("a-c=", "x908"),
    ("count: ", "1,23"),
    ("zero? ", "n445"),
    ("z=", "3 14"),
    ("pi is ", "3.14"),
]


def build_tokenizer() -> Any:
    """The character-level digit tokenizer of ``conftest`` with an end-of-sequence token."""
    tokenizer = build_digit_tokenizer()
    tokenizer.add_special_tokens({"eos_token": "<eos>"})
    return tokenizer


def build_model(tokenizer: Any, *, seed: int = 0, vocab_size: int | None = None) -> Any:
    """A 2-layer Llama with hidden size 16: about 6K parameters (more for a large vocabulary),
    float32; ``vocab_size``: its number of logits when the output layer is padded beyond the
    tokenizer (default ``len(tokenizer)``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer) if vocab_size is None else vocab_size,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def encode(tokenizer: Any, prompt: str, answer: str) -> dict[str, list[int]]:
    """Prompt + answer + end of sequence; the loss is on the answer and the end only."""
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    input_ids = [*prompt_ids, *answer_ids, tokenizer.eos_token_id]
    return {
        "input_ids": input_ids,
        "labels": [-100] * len(prompt_ids) + input_ids[len(prompt_ids) :],
    }


def build_dataset(
    tokenizer: Any, examples: list[tuple[str, str]] | None = None
) -> list[dict[str, Any]]:
    return [encode(tokenizer, p, a) for p, a in (examples or EXAMPLES)]


def collate(features: list[dict[str, list[int]]], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Right padding (causal attention keeps the real positions unchanged); labels -100 there."""
    longest = max(len(f["input_ids"]) for f in features)

    def padded(key: str, fill: int) -> torch.Tensor:
        return torch.tensor([f[key] + [fill] * (longest - len(f[key])) for f in features])

    input_ids = padded("input_ids", pad_id)
    lengths = torch.tensor([len(f["input_ids"]) for f in features])
    attention_mask = (torch.arange(longest)[None, :] < lengths[:, None]).long()
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "labels": padded("labels", -100),
    }


def training_args(output_dir: Path, **overrides: Any) -> Any:
    """One plain SGD step, no clipping, no reporting, CPU: gradients are what the loss gives."""
    from transformers import TrainingArguments

    settings: dict[str, Any] = {
        "output_dir": str(output_dir),
        "per_device_train_batch_size": len(EXAMPLES),
        "gradient_accumulation_steps": 1,
        "max_steps": 1,
        "learning_rate": 0.1,
        "optim": "sgd",
        "lr_scheduler_type": "constant",
        "max_grad_norm": 0.0,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "remove_unused_columns": False,
        "seed": 0,
    }
    settings.update(overrides)
    return TrainingArguments(**settings)


def gradient_recorder() -> Any:
    """A callback that keeps a copy of every parameter's gradient before each optimizer step."""
    from transformers import TrainerCallback

    class GradientRecorder(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.gradients: list[dict[str, torch.Tensor]] = []

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            model = kwargs["model"]
            self.gradients.append(
                {
                    n: p.grad.detach().clone()
                    for n, p in model.named_parameters()
                    if p.grad is not None
                }
            )

    return GradientRecorder()


def max_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """``max |a - b| / max |b|`` over all parameters (the same keys in both)."""
    assert a.keys() == b.keys() and a
    scale = max(float(t.detach().abs().max()) for t in b.values())
    return max(float((a[k] - b[k]).detach().abs().max()) for k in a) / scale
