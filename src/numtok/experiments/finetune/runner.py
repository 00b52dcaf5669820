"""Run a whole fine-tuning comparison: the model, the data, every (seed, arm) one after the other
in this process, and the report. Rerunning the same settings into the same folder resumes:
finished arms are read back (an interrupted arm starts again).

The ``base`` arm (the model before fine-tuning) does not depend on the seed; it is scored once and
its result stored for every seed, so that it pairs with CE like the other arms.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from numtok.experiments.finetune.config import FinetuneConfig
from numtok.experiments.finetune.data import load_finetune_data
from numtok.experiments.finetune.evaluate import constant_reference, score_arm
from numtok.experiments.finetune.report import write_report
from numtok.experiments.finetune.train import train_arm
from numtok.experiments.run_folder import arm_directory, finish_arm, prepare_run_dir, read_result
from numtok.vocab import NumberVocab

__all__ = ["model_digest", "resolve_model", "run_finetune"]

Log = Callable[[str], None]


def resolve_model(model: str) -> Path:
    """The model's folder: ``"smollm2"`` is SmolLM2-135M-Instruct, built on first use
    (:func:`numtok.experiments.pretrained.ensure_smollm2`); anything else a local folder that
    holds a saved causal LM."""
    from numtok.experiments import pretrained

    if model == "smollm2":
        return pretrained.ensure_smollm2()
    return pretrained.local_model_dir(Path(model))


def model_digest(folder: Path) -> str:
    """A short hash of the model folder's configuration and the sizes of its files: two folders
    with the same digest hold the same model (the weights' bytes are not read)."""
    entries = sorted(
        (path.name, path.stat().st_size) for path in folder.iterdir() if path.is_file()
    )
    text = (folder / "config.json").read_text() + json.dumps(entries)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _check_model(run_dir: Path, model_dir: Path) -> str:
    """Record the model's digest in the run folder (``model.json``), or refuse a folder whose
    arms were trained on another model."""
    digest = model_digest(model_dir)
    path = run_dir / "model.json"
    if path.exists():
        stored = json.loads(path.read_text())
        if stored["digest"] != digest:
            raise ValueError(
                f"the run folder {run_dir} holds arms of another model ({stored['folder']}, "
                f"digest {stored['digest']}; {model_dir} has {digest}): choose another --out"
            )
    else:
        path.write_text(json.dumps({"folder": str(model_dir), "digest": digest}, indent=1))
    return digest


def run_finetune(
    config: FinetuneConfig,
    run_dir: Path,
    *,
    data_dir: Path | str | None = None,
    log: Log = print,
) -> dict[str, Any]:
    """Fine-tune and score every (seed, arm) of ``config`` into ``run_dir`` (resuming what is
    there) and write the report; returns the results."""
    from transformers import AutoConfig, AutoTokenizer

    model_dir = resolve_model(config.model)
    prepare_run_dir(config, run_dir)
    digest = _check_model(run_dir, model_dir)
    torch.set_num_threads(config.threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    vocab_size = AutoConfig.from_pretrained(model_dir).vocab_size
    vocab = NumberVocab.from_tokenizer(tokenizer, vocab_size=vocab_size)
    data = load_finetune_data(config, tokenizer, data_dir)
    evaluation = {split: examples for split, examples in data.items() if split != "train"}
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    runs: list[dict[str, Any]] = []
    base_result: dict[str, Any] | None = None
    for seed in config.seeds:
        for arm in config.arms:
            directory = arm_directory(run_dir, seed, arm)
            stored = read_result(directory)
            if stored is None and arm == "base" and base_result is not None:
                directory.mkdir(parents=True, exist_ok=True)
                copied = {**base_result, "seed": seed, "scored_as_seed": base_result["seed"]}
                stored = finish_arm(directory, copied, {"scored_as_seed": base_result["seed"]})
            if stored is None:
                directory.mkdir(parents=True, exist_ok=True)
                began = time.perf_counter()
                trained = train_arm(config, arm, seed, model_dir, data["train"], vocab, pad, log)
                metrics, predictions = score_arm(
                    trained, tokenizer, config.task, evaluation,
                    batch_size=config.eval_batch_size, new_tokens=config.max_new_tokens,
                    max_digits=config.max_digits,
                )  # fmt: skip
                result = {
                    "seed": seed,
                    "arm": arm,
                    "model_digest": digest,
                    "metrics": metrics,
                    "history": trained.history,
                    "seconds_per_step": trained.seconds_per_step,
                    "minutes": (time.perf_counter() - began) / 60,
                }
                stored = finish_arm(directory, result, predictions)
                log(f"seed {seed} {arm}: {json.dumps(metrics)}")
            if arm == "base" and base_result is None:
                base_result = stored
            runs.append(stored)
    minutes = sum(run["minutes"] for run in runs if "scored_as_seed" not in run)
    reference = constant_reference(config.task, data["train"], evaluation)
    return write_report(run_dir, config, runs, minutes, reference)
