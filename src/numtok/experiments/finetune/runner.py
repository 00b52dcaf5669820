"""Run a whole fine-tuning comparison (``numtok compare`` and the ``smollm2-*`` presets), in
this process, in three phases:

1. **Validation.** Every (seed, arm, λ) is trained — every λ of the grid when λ is chosen — and
   scored on the validation split; what training changed is kept (``model.pt``,
   written by the training loop every comparison shares, which also resumes an interrupted arm
   from its checkpoint).
2. **Choice and gate.** The rule of :mod:`~numtok.experiments.finetune.choose` picks each
   number-loss arm's λ from the validation answers alone; the learnability gate
   (:func:`~numtok.experiments.analysis.learnability_gate`) reads them too.
3. **Test.** Each seed's arm at its chosen λ is scored once on the test splits; its
   ``model.pt`` is then deleted (those of the λ not chosen, after the choice).

Rerunning the same settings into the same folder resumes: a finished step (``validation.json``,
``test.json``) is read back, an interrupted training continues from its last checkpoint, an
interrupted scoring starts again. The ``base`` arm (the model before
fine-tuning) does not depend on the seed: it is scored once, and that one row pairs with every
seed of CE.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from numtok.experiments.finetune.choose import choose_weights
from numtok.experiments.finetune.config import FinetuneConfig
from numtok.experiments.finetune.data import FinetuneData, load_finetune_data
from numtok.experiments.finetune.evaluate import score_split
from numtok.experiments.finetune.models import model_digest, resolve_model
from numtok.experiments.finetune.preregistration import check_preregistration, preregistration
from numtok.experiments.finetune.rows import write_report
from numtok.experiments.finetune.train import Trained, load_model, load_trained, train_arm
from numtok.experiments.item_metrics import answer_values, item_metrics
from numtok.experiments.loop import median_step_seconds
from numtok.experiments.objectives import NUMBER_LOSS_ARMS
from numtok.experiments.parallel import progress_bar
from numtok.experiments.run_folder import CHECKPOINT, WEIGHTS, prepare_run_dir, save_atomically
from numtok.experiments.stats import constant_answers
from numtok.numbers.vocab import NumberVocab

__all__ = [
    "Prepared",
    "Work",
    "check_registered",
    "estimate_minutes",
    "job_directory",
    "prepare",
    "preregistration_of",
    "remaining_work",
    "run_finetune",
]

Log = Callable[[str], None]
VALIDATION, TEST = "validation.json", "test.json"


@dataclass
class Prepared:
    """What every phase reads: the model's folder and digest, its tokenizer and number
    vocabulary, the encoded data, and the padding id."""

    model_dir: Path
    digest: str
    tokenizer: Any
    vocab: NumberVocab
    data: FinetuneData
    pad_id: int


def prepare(config: FinetuneConfig, data_dir: Path | str | None = None) -> Prepared:
    """Load the tokenizer and the data of ``config`` (checked: a user's data error is raised
    here, before any training)."""
    from transformers import AutoConfig, AutoTokenizer

    model_dir = resolve_model(config.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model_config = AutoConfig.from_pretrained(model_dir)
    vocab = NumberVocab.from_tokenizer(tokenizer, vocab_size=model_config.vocab_size)
    context = getattr(model_config, "max_position_embeddings", None)
    data = load_finetune_data(
        config, tokenizer, data_dir, context=context if isinstance(context, int) else None
    )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return Prepared(model_dir, model_digest(model_dir), tokenizer, vocab, data, pad)


def preregistration_of(
    config: FinetuneConfig, prepared: Prepared, *, hypothesis: str, primary_arm: str
) -> dict[str, Any]:
    """The pre-registration record of this run (:mod:`~numtok.experiments.finetune.
    preregistration`)."""
    sizes = {split: len(examples) for split, examples in prepared.data.splits.items()}
    return preregistration(
        config, hypothesis=hypothesis, primary_arm=primary_arm,
        data={"sizes": sizes, "digest": prepared.data.digest,
              "content_digest": prepared.data.content_digest, "notes": prepared.data.notes},
        model_digest=prepared.digest,
    )  # fmt: skip


def check_registered(config: FinetuneConfig, prepared: Prepared, path: Path) -> dict[str, Any]:
    """The pre-registration in ``path`` if it names this run (its hypothesis and primary arm,
    and this run's settings, data and model); otherwise a ValueError saying what differs."""
    stored = json.loads(path.read_text())
    primary = str(stored.get("primary_endpoint", {}).get("difference", "")).split(" ")[0]
    record = preregistration_of(
        config, prepared, hypothesis=str(stored.get("hypothesis", "")), primary_arm=primary
    )
    return check_preregistration(path, record)


def job_directory(
    run_dir: Path, config: FinetuneConfig, seed: int, arm: str, weight: float
) -> Path:
    """``seed<N>/<arm>``, or ``seed<N>/<arm>-lambda<λ>`` when λ is chosen from a grid."""
    name = f"{arm}-lambda{weight:g}" if config.weight_grid and arm in NUMBER_LOSS_ARMS else arm
    return Path(run_dir) / f"seed{seed}" / name


def _check_model(run_dir: Path, prepared: Prepared) -> float:
    """Record the model's and the data's digests (``model.json``), or refuse a folder whose arms
    were trained on another model or other data; returns when the folder was first made (Unix
    time)."""
    path = run_dir / "model.json"
    created = time.time()
    recorded = {"folder": str(prepared.model_dir), "digest": prepared.digest,
                "data_digest": prepared.data.digest, "created": created}  # fmt: skip
    if not path.exists():
        path.write_text(json.dumps(recorded, indent=1))
        return created
    stored = json.loads(path.read_text())
    if stored["digest"] != prepared.digest:
        raise ValueError(
            f"the run folder {run_dir} holds arms of another model ({stored['folder']}, "
            f"digest {stored['digest']}; {prepared.model_dir} has {prepared.digest}): choose "
            "another --out"
        )
    if stored.get("data_digest", "") != prepared.data.digest:
        raise ValueError(
            f"the run folder {run_dir} holds arms trained on other data (digest "
            f"{stored.get('data_digest')}, this data {prepared.data.digest}): choose another --out"
        )
    return float(stored.get("created", path.stat().st_mtime))


def _read(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _score(
    trained: Trained, prepared: Prepared, config: FinetuneConfig, split: str, bar: Any
) -> dict[str, Any]:
    scored = score_split(trained, prepared.tokenizer, config, prepared.data.splits[split])
    bar.update(len(prepared.data.splits[split]))
    return scored


@dataclass(frozen=True)
class Work:
    """What a run still has to do: training steps and scored examples (a finished phase's
    stored results are not done again)."""

    steps: int
    examples: int


def remaining_work(
    config: FinetuneConfig, prepared: Prepared, run_dir: Path, *, validation_only: bool = False
) -> Work:
    """Every training step and every scored example of ``config`` not yet stored in
    ``run_dir`` (with ``validation_only``, none of the test splits')."""
    splits = prepared.data.splits
    steps = examples = 0
    for seed in config.seeds:
        for arm in config.arms:
            if arm == "base" and seed != config.seeds[0]:
                continue
            for weight in config.weights_of(arm):
                if not (job_directory(run_dir, config, seed, arm, weight) / VALIDATION).exists():
                    steps += config.steps if arm != "base" else 0
                    examples += len(splits["validation"])
            tested = job_directory(run_dir, config, seed, arm, config.weights_of(arm)[0]) / TEST
            if not validation_only and not tested.exists():
                examples += sum(len(splits[s]) for s in config.evaluation_splits)
    return Work(steps, examples)


#: The probe's training steps; the first, with its one-off allocations, is not timed.
_PROBE_STEPS = 3


def estimate_minutes(
    config: FinetuneConfig, prepared: Prepared, work: Work
) -> tuple[float, float, float]:
    """``(minutes, seconds per step, seconds per example)``: ``work`` timed by a short probe,
    CE trained for a few steps on the first seed (in a folder deleted after; only when training
    is left) and one batch of validation examples scored with this run's readouts. A number-loss
    arm's step costs CE's plus its overhead (``docs/fused.md``): for them it is a lower estimate."""
    step_seconds = 0.0
    if work.steps:
        probe = config.with_overrides(steps=_PROBE_STEPS, warmup_steps=1, checkpoint_every=1000)
        with tempfile.TemporaryDirectory() as folder:
            trained, log = train_arm(
                probe, "ce", 0.0, config.seeds[0], prepared.model_dir,
                prepared.data.splits["train"], prepared.vocab, prepared.pad_id, Path(folder),
            )  # fmt: skip
        step_seconds = float(np.median(log.step_seconds[1:]))
    else:  # scoring left alone: the pretrained model scores as fast as a trained one
        trained = Trained(load_model(prepared.model_dir, config, config.seeds[0]).eval(), None,
                          (0.0, 1.0))  # fmt: skip
    examples = prepared.data.splits["validation"][: config.eval_batch_size]
    began = time.perf_counter()
    score_split(trained, prepared.tokenizer, config, examples)
    example_seconds = (time.perf_counter() - began) / len(examples)
    seconds = work.steps * step_seconds + work.examples * example_seconds
    return seconds / 60, step_seconds, example_seconds


def _validation_phase(
    config: FinetuneConfig, run_dir: Path, prepared: Prepared, log: Log, bar: Any
) -> dict[tuple[int, str, float], dict[str, Any]]:
    """Train and score on validation every (seed, arm, λ) not done yet; their results."""
    results: dict[tuple[int, str, float], dict[str, Any]] = {}
    for seed in config.seeds:
        for arm in config.arms:
            if arm == "base" and seed != config.seeds[0]:
                continue
            for weight in config.weights_of(arm):
                directory = job_directory(run_dir, config, seed, arm, weight)
                stored = _read(directory / VALIDATION)
                if stored is None:
                    directory.mkdir(parents=True, exist_ok=True)
                    began = time.perf_counter()
                    trained, training = train_arm(
                        config, arm, weight, seed, prepared.model_dir,
                        prepared.data.splits["train"], prepared.vocab, prepared.pad_id,
                        directory, progress=bar.update,
                    )  # fmt: skip
                    trained_minutes = (time.perf_counter() - began) / 60
                    began = time.perf_counter()
                    scored = _score(trained, prepared, config, "validation", bar)
                    stored = {
                        "seed": seed, "arm": arm, "weight": weight, **scored,
                        "history": training.history,
                        "seconds_per_step": median_step_seconds(training),
                        "train_minutes": trained_minutes,
                        "score_minutes": (time.perf_counter() - began) / 60,
                    }  # fmt: skip
                    save_atomically(stored, directory / VALIDATION)
                    (directory / CHECKPOINT).unlink(missing_ok=True)
                    log(f"seed {seed} {arm} λ={weight:g}: trained and validation scored")
                results[(seed, arm, weight)] = stored
    return results


def _metric_of(
    stored: dict[str, Any], readout: str, metric: str, references: Any, unparsed: float
) -> float | None:
    """``metric`` of one arm's ``readout`` answers, an unparsed answer scored as ``unparsed``
    (the training median, the report's rule)."""
    answers = stored["answers"].get(readout)
    if answers is None:
        return None
    return item_metrics(answer_values(answers), references, unparsed=unparsed)[metric]


def _choose(
    config: FinetuneConfig,
    validation: dict[tuple[int, str, float], dict[str, Any]],
    prepared: Prepared,
) -> dict[str, Any]:
    """Each number-loss arm's λ: the grid's choice, or the one λ it trained at."""
    chosen = {arm: config.weights_of(arm)[0] for arm in config.arms}
    if not config.weight_grid:
        return {"chosen": chosen, "means": {}}
    references = answer_values([e.value for e in prepared.data.splits["validation"]])
    unparsed = constant_answers([e.value for e in prepared.data.splits["train"]])["median"]
    values = {
        arm: {
            weight: [
                _metric_of(validation[(seed, arm, weight)], config.readout, config.metric,
                           references, unparsed)
                for seed in config.seeds
            ]
            for weight in config.weight_grid
        }
        for arm in config.arms if arm in NUMBER_LOSS_ARMS
    }  # fmt: skip
    choices = choose_weights(values, metric=config.metric)
    chosen |= {choice.arm: choice.chosen for choice in choices}
    means = {choice.arm: {f"{w:g}": m for w, m in choice.means.items()} for choice in choices}
    return {"chosen": chosen, "means": means}


def _test_phase(
    config: FinetuneConfig,
    run_dir: Path,
    prepared: Prepared,
    chosen: dict[str, float],
    log: Log,
    bar: Any,
) -> dict[tuple[int, str], dict[str, Any]]:
    """Score every seed's arm at its chosen λ on the test splits, once; drop the kept weights."""
    results: dict[tuple[int, str], dict[str, Any]] = {}
    for seed in config.seeds:
        for arm in config.arms:
            if arm == "base" and seed != config.seeds[0]:
                continue
            directory = job_directory(run_dir, config, seed, arm, chosen[arm])
            stored = _read(directory / TEST)
            if stored is None:
                began = time.perf_counter()
                train = prepared.data.splits["train"]
                if arm == "base":
                    trained, _ = train_arm(
                        config, arm, 0.0, seed, prepared.model_dir, train, prepared.vocab,
                        prepared.pad_id, directory,
                    )  # fmt: skip
                else:
                    trained = load_trained(config, arm, seed, prepared.model_dir, train, directory)
                stored = {
                    "seed": seed, "arm": arm, "weight": chosen[arm],
                    "splits": {s: _score(trained, prepared, config, s, bar)
                               for s in config.evaluation_splits},
                    "score_minutes": (time.perf_counter() - began) / 60,
                }  # fmt: skip
                save_atomically(stored, directory / TEST)
                log(f"seed {seed} {arm}: test splits scored")
            (directory / WEIGHTS).unlink(missing_ok=True)
            results[(seed, arm)] = stored
    return results


def _drop_unchosen(config: FinetuneConfig, run_dir: Path, chosen: dict[str, float]) -> None:
    for seed in config.seeds:
        for arm in config.arms:
            for weight in config.weights_of(arm):
                if weight != chosen[arm]:
                    path = job_directory(run_dir, config, seed, arm, weight) / WEIGHTS
                    path.unlink(missing_ok=True)


def run_finetune(
    config: FinetuneConfig,
    run_dir: Path,
    *,
    data_dir: Path | str | None = None,
    preregistered: Path | None = None,
    prepared: Prepared | None = None,
    validation_only: bool = False,
    show_progress: bool = False,
    log: Log = print,
    target_effect: float | None = None,
) -> dict[str, Any]:
    """Run (or resume) every phase of ``config`` in ``run_dir`` and write the report; returns
    the results. ``preregistered``: the pre-registration file this run must match;
    ``prepared``: :func:`prepare`'s result when the caller has it already;
    ``validation_only``: stop before the test phase (for choosing settings: the test splits stay
    unseen, and a later run of the same settings in the same folder scores them);
    ``show_progress``: a bar on stderr over the training steps and scored examples left;
    ``target_effect``: the report plans a next run for it (seeds and items needed)."""
    torch.set_num_threads(config.threads)
    prepared = prepared or prepare(config, data_dir)
    registration = None
    if preregistered is not None:
        registration = check_registered(config, prepared, Path(preregistered))
    prepare_run_dir(config, run_dir)
    created = _check_model(run_dir, prepared)
    work = remaining_work(config, prepared, run_dir, validation_only=validation_only)
    total = work.steps + work.examples
    with progress_bar(show_progress, total, "steps + scored examples", "it") as bar:
        validation = _validation_phase(config, run_dir, prepared, log, bar)
        choice = _choose(config, validation, prepared)
        test: dict[tuple[int, str], dict[str, Any]] = {}
        if not validation_only:
            _drop_unchosen(config, run_dir, choice["chosen"])
            test = _test_phase(config, run_dir, prepared, choice["chosen"], log, bar)
    return write_report(
        run_dir, config, prepared.data, validation, choice, test,
        constants=constant_answers([e.value for e in prepared.data.splits["train"]]),
        preregistered=None if preregistered is None or registration is None
        else (Path(preregistered), registration),
        started=created, target_effect=target_effect,
    )  # fmt: skip
