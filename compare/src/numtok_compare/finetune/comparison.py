"""A whole fine-tuning comparison (``numtok compare`` and the ``smollm2-*`` presets), run in this
process by the runner of every comparison (:func:`numtok_compare.runner.phases.run_phases`):

1. **Validation.** Every (seed, arm, λ) is trained — every λ of the grid when λ is chosen — and
   scored on the validation split.
2. **Choice and gate.** The rule of :mod:`~numtok_compare.finetune.choose` picks each
   number-loss arm's λ from the validation answers alone; the learnability gate
   (:func:`~numtok_compare.analysis.learnability_gate`) reads them too.
3. **Test.** Each seed's arm at its chosen λ is scored once on the test splits.

What fine-tuning supplies to the runner is :class:`FinetuneModels`: the arms of
:mod:`~numtok_compare.finetune.arm` on the data :func:`prepare` loads, scored by
:func:`~numtok_compare.finetune.evaluate.score_split`. The ``base`` arm (the model before
fine-tuning) does not depend on the seed: it is scored once, and that one row pairs with every
seed of CE.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from numtok import NumberVocab
from numtok_compare.finetune.arm import Trained, build_arm, load_arm, load_model
from numtok_compare.finetune.choose import choose_weights
from numtok_compare.finetune.config import FinetuneConfig
from numtok_compare.finetune.data import FinetuneData, load_finetune_data
from numtok_compare.finetune.evaluate import score_split
from numtok_compare.finetune.models import model_digest, resolve_model
from numtok_compare.finetune.preregistration import check_preregistration, preregistration
from numtok_compare.finetune.rows import write_report
from numtok_compare.item_metrics import answer_values, item_metrics
from numtok_compare.objectives import NUMBER_LOSS_ARMS
from numtok_compare.runner.parallel import open_executor, progress_bar
from numtok_compare.runner.phases import Arm, Job, Work, run_phases
from numtok_compare.runner.phases import remaining_work as work_left
from numtok_compare.runner.run_folder import prepare_run_dir, save_atomically
from numtok_compare.runner.training_log import Progress
from numtok_compare.stats import constant_answers

__all__ = [
    "FinetuneModels",
    "Prepared",
    "check_registered",
    "estimate_minutes",
    "job_directory",
    "jobs_of",
    "prepare",
    "preregistration_of",
    "remaining_work",
    "run_finetune",
]

Log = Callable[[str], None]


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
    """The pre-registration record of this run (:mod:`~numtok_compare.finetune.
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
        save_atomically(recorded, path)
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


@dataclass(frozen=True)
class FinetuneModels:
    """The fine-tuned arms of ``config`` on ``prepared``'s model and data, as the runner builds,
    rebuilds and scores them (one process: it holds the tokenizer and the encoded data)."""

    config: FinetuneConfig
    prepared: Prepared

    def models(self, seed: int) -> FinetuneModels:
        return self

    def build(self, job: Job) -> Arm:
        p = self.prepared
        train = p.data.splits["train"]
        return build_arm(self.config, job, p.model_dir, train, p.vocab, p.pad_id)

    def load(self, job: Job, directory: Path) -> Trained:
        p = self.prepared
        return load_arm(self.config, job, p.model_dir, p.data.splits["train"], directory)

    def score(self, answerer: Trained, split: str, progress: Progress) -> dict[str, Any]:
        examples = self.prepared.data.splits[split]
        scored = score_split(answerer, self.prepared.tokenizer, self.config, examples)
        progress(len(examples))
        return scored


def jobs_of(config: FinetuneConfig) -> list[Job]:
    """Every (seed, arm, λ) the validation phase trains: each λ of an arm's grid, the ``base``
    arm once (it does not depend on the seed)."""
    return [
        Job(seed, arm, weight)
        for seed in config.seeds
        for arm in config.arms
        if arm != "base" or seed == config.seeds[0]
        for weight in config.weights_of(arm)
    ]


def _directories(config: FinetuneConfig, run_dir: Path) -> dict[Job, Path]:
    return {job: job_directory(run_dir, config, *job) for job in jobs_of(config)}


def remaining_work(
    config: FinetuneConfig, prepared: Prepared, run_dir: Path, *, validation_only: bool = False
) -> Work:
    """Every training step and every scored example of ``config`` not yet stored in
    ``run_dir`` (with ``validation_only``, none of the test splits')."""
    splits = prepared.data.splits
    return work_left(
        jobs_of(config), _directories(config, run_dir),
        steps=lambda job: config.steps if job.arm != "base" else 0,
        items={split: len(examples) for split, examples in splits.items()},
        test_splits=() if validation_only else config.evaluation_splits,
    )  # fmt: skip


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
        arm = FinetuneModels(probe, prepared).build(Job(config.seeds[0], "ce", 0.0))
        with tempfile.TemporaryDirectory() as folder:
            log = arm.fit(Path(folder), None)
        trained = arm.answerer
        step_seconds = float(np.median(log.step_seconds[1:]))
    else:  # scoring left alone: the pretrained model scores as fast as a trained one
        trained = Trained(load_model(prepared.model_dir, config, config.seeds[0]).eval(), None,
                          (0.0, 1.0))  # fmt: skip
    examples = prepared.data.splits["validation"][: config.eval_batch_size]
    began = time.perf_counter()
    score_split(trained, prepared.tokenizer, config, examples)
    example_seconds = (time.perf_counter() - began) / len(examples)
    seconds = work.steps * step_seconds + work.items * example_seconds
    return seconds / 60, step_seconds, example_seconds


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
    validation: Mapping[Job, dict[str, Any]],
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
                _metric_of(validation[Job(seed, arm, weight)], config.readout, config.metric,
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
    total = work.steps + work.items
    with (
        progress_bar(show_progress, total, "steps + scored examples", "it") as bar,
        open_executor(1) as executor,
    ):
        phases = run_phases(
            FinetuneModels(config, prepared), jobs_of(config), _directories(config, run_dir),
            choose=lambda validation: _choose(config, validation, prepared),
            test_splits=() if validation_only else config.evaluation_splits,
            executor=executor, bar=bar, log=log,
        )  # fmt: skip
    return write_report(
        run_dir, config, prepared.data, phases,
        constants=constant_answers([e.value for e in prepared.data.splits["train"]]),
        preregistered=None if preregistered is None or registration is None
        else (Path(preregistered), registration),
        started=created, target_effect=target_effect,
    )  # fmt: skip
