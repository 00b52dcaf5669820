"""Fine-tune a local Hugging Face causal LM with cross-entropy + NTL through the Trainer.

Data: JSONL files, one ``{"prompt": ..., "answer": ...}`` object per line. The loss is on the
answer (and the end-of-sequence token) only; with a chat model the prompt is wrapped in its chat
template. Before and after training the model answers the evaluation prompts greedily, and the
last number of each answer is scored with :func:`numtok.readout.metrics.numeric_metrics` (exact
accuracy, MAE, R², ...). Training logs show ``loss``, ``ce`` and ``ntl``; evaluation adds
``eval_ce`` and ``eval_ntl``. The model, its tokenizer and ``results.json`` (settings, metrics, log
history) are saved under ``--output``.

    python examples/finetune_causal_lm.py --model path/to/model --train train.jsonl \\
        --eval eval.jsonl --output runs/ntl --ntl-weight 0.3

``--ntl-weight 0`` trains with cross-entropy alone (the baseline, same everything else).
Nothing is downloaded: ``--model`` is a folder written by ``save_pretrained``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

from numtok.hf import NTLossForTrainer
from numtok.readout.metrics import numeric_metrics

Example = tuple[str, str]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path, help="local model folder")
    parser.add_argument("--train", required=True, type=Path, help="JSONL of prompt/answer")
    parser.add_argument("--eval", type=Path, help="JSONL of prompt/answer for evaluation")
    parser.add_argument("--output", required=True, type=Path, help="folder for model and results")
    parser.add_argument("--ntl-weight", type=float, default=0.3, help="λ of CE + λ·NTL")
    parser.add_argument("--kind", default="was", choices=["was", "mse", "mae", "huber"])
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--max-steps", type=int, default=-1, help="overrides --epochs if > 0")
    parser.add_argument("--batch-size", type=int, default=8, help="per device and micro-batch")
    parser.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--warmup-steps", type=int, default=0)
    parser.add_argument("--max-length", type=int, default=256, help="tokens per example")
    parser.add_argument("--logging-steps", type=int, default=10)
    parser.add_argument("--eval-steps", type=int, default=0, help="teacher-forced eval every N")
    parser.add_argument("--eval-samples", type=int, default=200, help="answers generated")
    parser.add_argument("--eval-before", action="store_true", help="also score the start model")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--chat-template", choices=["auto", "on", "off"], default="auto")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def read_jsonl(path: Path) -> list[Example]:
    examples = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            record = json.loads(line)
            if not isinstance(record, dict) or not {"prompt", "answer"} <= record.keys():
                raise ValueError(f"{path}:{number}: expected an object with 'prompt' and 'answer'")
            examples.append((str(record["prompt"]), str(record["answer"])))
    if not examples:
        raise ValueError(f"{path} holds no examples")
    return examples


class PromptFormat:
    """The text before the answer: the prompt, or the chat template's user turn + assistant
    header; the answer ends with the tokenizer's end-of-sequence token."""

    def __init__(self, tokenizer: Any, chat_template: str) -> None:
        has_template = getattr(tokenizer, "chat_template", None) is not None
        if chat_template == "on" and not has_template:
            raise ValueError("--chat-template on, but the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.use_chat = chat_template == "on" or (chat_template == "auto" and has_template)

    def prompt_text(self, prompt: str) -> str:
        if not self.use_chat:
            return prompt
        messages = [{"role": "user", "content": prompt}]
        text: str = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        return text

    def encode(self, prompt: str, answer: str, max_length: int) -> dict[str, list[int]]:
        """Token ids with labels -100 on the prompt: the loss is on the answer only."""
        tokenizer = self.tokenizer
        prompt_ids = tokenizer(self.prompt_text(prompt), add_special_tokens=not self.use_chat)
        answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
        prompt_ids = prompt_ids["input_ids"]
        input_ids = [*prompt_ids, *answer_ids, tokenizer.eos_token_id][:max_length]
        labels = ([-100] * len(prompt_ids) + input_ids[len(prompt_ids) :])[:max_length]
        return {"input_ids": input_ids, "labels": labels}


class RightPaddingCollator:
    """Pads a list of encoded examples on the right: attention mask 0 and label -100 there."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, features: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        longest = max(len(f["input_ids"]) for f in features)
        batch: dict[str, list[list[int]]] = {"input_ids": [], "attention_mask": [], "labels": []}
        for f in features:
            padding = longest - len(f["input_ids"])
            batch["input_ids"].append(f["input_ids"] + [self.pad_token_id] * padding)
            batch["attention_mask"].append([1] * len(f["input_ids"]) + [0] * padding)
            batch["labels"].append(f["labels"] + [-100] * padding)
        return {key: torch.tensor(rows) for key, rows in batch.items()}


@torch.no_grad()
def generate_answers(
    model: Any, fmt: PromptFormat, prompts: list[str], *, batch_size: int, max_new_tokens: int
) -> list[str]:
    """Greedy answers, decoded without the prompt (left padding, as generation needs)."""
    tokenizer = fmt.tokenizer
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    model.eval()
    answers: list[str] = []
    try:
        for start in tqdm(range(0, len(prompts), batch_size), desc="generating", leave=False):
            texts = [fmt.prompt_text(p) for p in prompts[start : start + batch_size]]
            # No token_type_ids: a tokenizer that returns them (as one saved from a bare
            # PreTrainedTokenizerFast does) makes generate() refuse them (transformers 4.56.0).
            batch = tokenizer(
                texts,
                return_tensors="pt",
                padding=True,
                add_special_tokens=not fmt.use_chat,
                return_token_type_ids=False,
            ).to(model.device)
            generated = model.generate(
                **batch,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            new_tokens = generated[:, batch["input_ids"].shape[1] :]
            answers += tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
    finally:
        tokenizer.padding_side = padding_side
    return answers


def score(
    model: Any, fmt: PromptFormat, examples: list[Example], args: argparse.Namespace
) -> dict[str, Any]:
    """numeric_metrics of the generated answers, plus a few examples to read."""
    prompts = [p for p, _ in examples]
    references = [a for _, a in examples]
    answers = generate_answers(
        model, fmt, prompts, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens
    )
    metrics = numeric_metrics(answers, references).as_dict()
    metrics["samples"] = [
        {"prompt": p, "answer": r, "generated": g}
        for p, r, g in zip(prompts[:5], references[:5], answers[:5], strict=True)
    ]
    return metrics


def _show(title: str, metrics: dict[str, Any]) -> None:
    keys = ("exact_accuracy", "mae", "median_absolute_error", "r2", "within_1_percent", "parsed")
    print(f"{title}: " + ", ".join(f"{k}={metrics[k]:.4g}" for k in keys))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train = read_jsonl(args.train)  # before loading the model: bad data fails fast
    evaluation = read_jsonl(args.eval) if args.eval else []
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.eos_token_id is None:
        raise ValueError(f"the tokenizer in {args.model} has no end-of-sequence token")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    fmt = PromptFormat(tokenizer, args.chat_template)

    train_set = [fmt.encode(p, a, args.max_length) for p, a in train]
    eval_set = [fmt.encode(p, a, args.max_length) for p, a in evaluation]
    scored = evaluation[: args.eval_samples]

    loss_fn = NTLossForTrainer(
        tokenizer, ntl_weight=args.ntl_weight, kind=args.kind, vocab_size=model.config.vocab_size
    )
    print(loss_fn.vocab.describe())
    use_cpu = not torch.cuda.is_available()
    training_args = TrainingArguments(
        output_dir=str(args.output / "checkpoints"),
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        learning_rate=args.lr,
        lr_scheduler_type="cosine",
        warmup_steps=args.warmup_steps,
        num_train_epochs=args.epochs,
        max_steps=args.max_steps,
        logging_steps=args.logging_steps,
        eval_strategy="steps" if eval_set and args.eval_steps > 0 else "no",
        eval_steps=args.eval_steps if args.eval_steps > 0 else None,
        save_strategy="no",
        report_to="none",
        use_cpu=use_cpu,
        bf16=not use_cpu and torch.cuda.is_bf16_supported(),
        remove_unused_columns=False,
        seed=args.seed,
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_set,
        eval_dataset=eval_set or None,
        data_collator=RightPaddingCollator(tokenizer.pad_token_id),
    )
    loss_fn.attach(trainer)  # CE + λ·NTL, exact under accumulation/DDP, ce and ntl in the logs

    results: dict[str, Any] = {"settings": {k: str(v) for k, v in vars(args).items()}}
    if scored and args.eval_before:
        results["before"] = score(model, fmt, scored, args)
        _show("before", results["before"])
    started = time.perf_counter()
    trainer.train()
    results["train_seconds"] = time.perf_counter() - started
    if eval_set:
        results["eval"] = trainer.evaluate()
    if scored:
        results["after"] = score(model, fmt, scored, args)
        _show("after", results["after"])
    results["log_history"] = trainer.state.log_history

    final = args.output / "model"
    trainer.save_model(str(final))
    tokenizer.save_pretrained(str(final))
    with (args.output / "results.json").open("w", encoding="utf-8") as file:
        json.dump(results, file, indent=2)  # NaN where a metric is undefined
    print(f"saved the model to {final} and the results to {args.output / 'results.json'}")
    return results


if __name__ == "__main__":
    main()
