"""A whole fine-tuning comparison (``numtok compare`` and the ``smollm2-*`` presets), run in this
process by the driver of every comparison (:func:`numtok_compare.comparison.run_comparison`):

1. **Validation.** Every (seed, arm, λ) is trained — every λ of the grid when λ is chosen — and
   scored on the validation split.
2. **Choice and gate.** The rule of :mod:`~numtok_compare.finetune.choose` picks each
   number-loss arm's λ from the validation answers alone; the learnability gate
   (:func:`~numtok_compare.analysis.learnability_gate`) reads them too.
3. **Test.** Each seed's arm at its chosen λ is scored once on the test splits.

What fine-tuning supplies to the driver is :class:`FinetuneComparison`: the arms of
:mod:`~numtok_compare.finetune.arm` on the data :func:`prepare` loads, scored by
:func:`~numtok_compare.finetune.evaluate.score_split`, and the rows of
:mod:`~numtok_compare.finetune.rows`. The ``base`` arm (the model before
fine-tuning) does not depend on the seed: it is scored once, and that one row pairs with every
seed of CE.
"""

from __future__ import annotations

import datetime
import json
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from numtok import NumberVocab
from numtok_compare.comparison import run_comparison
from numtok_compare.finetune.arm import Trained, build_arm, load_arm, load_model
from numtok_compare.finetune.choose import choose_weights
from numtok_compare.finetune.config import FinetuneConfig
from numtok_compare.finetune.data import FinetuneData, load_finetune_data
from numtok_compare.finetune.draws import draws_for_test_splits
from numtok_compare.finetune.evaluate import score_split
from numtok_compare.finetune.models import model_digest, resolve_model
from numtok_compare.finetune.preregistration import check_preregistration, preregistration
from numtok_compare.finetune.rows import run_rows
from numtok_compare.item_metrics import answer_values, item_metrics
from numtok_compare.objectives import NUMBER_LOSS_ARMS
from numtok_compare.provenance import registered_arm
from numtok_compare.runner.parallel import Executor, RayCluster
from numtok_compare.runner.phases import Arm, Job, Phases, Work
from numtok_compare.runner.run_folder import save_atomically
from numtok_compare.runner.scoring import WHOLE, Share
from numtok_compare.runner.training_log import Progress
from numtok_compare.stats import constant_answers

__all__ = [
    "FinetuneComparison",
    "Prepared",
    "check_registered",
    "estimate_minutes",
    "prepare",
    "preregistration_of",
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


def check_registered(
    config: FinetuneConfig, prepared: Prepared, path: Path, *, deviation: str | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pre-registration in ``path`` and the run's check against it (``{"differences",
    "deviation", "source", "checked"}``, as the rows record it), if it names this run (its
    hypothesis and primary arm, and this run's settings, data, model and code, the file
    committed) or ``deviation`` states why it runs anyway; otherwise a ValueError saying what
    differs."""
    stored = json.loads(path.read_text())
    record = preregistration_of(
        config, prepared, hypothesis=str(stored.get("hypothesis", "")),
        primary_arm=registered_arm(stored),
    )  # fmt: skip
    stored, differences = check_preregistration(path, record, deviation=deviation)
    check = {
        "differences": differences,
        "deviation": deviation.strip() if differences and deviation else None,
        "source": record["code"]["source"],
        "checked": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return stored, check


def _check_model(run_dir: Path, prepared: Prepared) -> None:
    """Record the model's and the data's digests (``model.json``), or refuse a folder whose arms
    were trained on another model or other data."""
    path = run_dir / "model.json"
    recorded = {"folder": str(prepared.model_dir), "digest": prepared.digest,
                "data_digest": prepared.data.digest}  # fmt: skip
    if not path.exists():
        save_atomically(recorded, path)
        return
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


@dataclass(frozen=True)
class FinetuneComparison:
    """The fine-tuned arms of ``config`` on ``prepared``'s model and data, as the driver runs
    them (:class:`~numtok_compare.comparison.Comparison`; one process: it holds the tokenizer
    and the encoded data). ``validation_only``: no test split is scored."""

    config: FinetuneConfig
    prepared: Prepared
    validation_only: bool = False

    def models(self, seed: int) -> FinetuneComparison:
        return self

    def jobs(self) -> list[Job]:
        """Every (seed, arm, λ) the validation phase trains: each λ of an arm's grid, the
        ``base`` arm once (it does not depend on the seed)."""
        config = self.config
        return [Job(seed, arm, weight) for seed in config.seeds for arm in config.arms
                if arm != "base" or seed == config.seeds[0]
                for weight in config.weights_of(arm)]  # fmt: skip

    def directory(self, run_dir: Path, job: Job) -> Path:
        """``seed<N>/<arm>``, or ``seed<N>/<arm>-lambda<λ>`` when λ is chosen from a grid."""
        chosen = self.config.weight_grid and job.arm in NUMBER_LOSS_ARMS
        return (
            Path(run_dir)
            / f"seed{job.seed}"
            / (f"{job.arm}-lambda{job.weight:g}" if chosen else job.arm)
        )

    def steps(self, job: Job) -> int:
        return self.config.steps if job.arm != "base" else 0

    def scored_items(self) -> dict[str, int]:
        return {split: len(examples) for split, examples in self.prepared.data.splits.items()}

    @property
    def test_splits(self) -> tuple[str, ...]:
        return () if self.validation_only else self.config.evaluation_splits

    def prepare(self, run_dir: Path, executor: Executor, show_progress: bool) -> None:
        _check_model(run_dir, self.prepared)

    def build(self, job: Job) -> Arm:
        p = self.prepared
        train = p.data.splits["train"]
        return build_arm(self.config, job, p.model_dir, train, p.vocab, p.pad_id)

    def load(self, job: Job, directory: Path) -> Trained:
        p = self.prepared
        return load_arm(self.config, job, p.model_dir, p.data.splits["train"], directory)

    def score(
        self, answerer: Trained, split: str, progress: Progress, share: Share = WHOLE
    ) -> dict[str, Any]:
        examples = share.of(self.prepared.data.splits[split], self.config.eval_batch_size)
        scored = score_split(answerer, self.prepared.tokenizer, self.config, examples)
        progress(len(examples))
        return scored

    def choose(self, validation: Mapping[Job, dict[str, Any]]) -> dict[str, Any]:
        """λ (:func:`_choose`) and, with ``config.choose_test_samples``, the test splits' draws
        per item (``"draws"``: :func:`~numtok_compare.finetune.draws.draws_for_test_splits`)."""
        choice = _choose(self.config, validation, self.prepared)
        draws = draws_for_test_splits(self.config, validation, choice["chosen"], self.prepared.data)
        return choice if draws is None else choice | {"draws": draws}

    def tested(self, choice: Mapping[str, Any]) -> FinetuneComparison:
        """The test splits read with the draws per item the choice set, if it set them."""
        if "draws" not in choice:
            return self
        config = self.config.with_overrides(readout_samples=choice["draws"]["test"])
        return replace(self, config=config)

    def rows(self, phases: Phases) -> dict[str, Any]:
        return run_rows(self.config, self.prepared.data, phases)


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
        arm = FinetuneComparison(probe, prepared).build(Job(config.seeds[0], "ce", 0.0))
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
    deviation: str | None = None,
    prepared: Prepared | None = None,
    validation_only: bool = False,
    cluster: RayCluster | None = None,
    show_progress: bool = False,
    log: Log = print,
    command: str | None = None,
    target_effect: float | None = None,
) -> dict[str, Any]:
    """Run (or resume) every phase of ``config`` in ``run_dir`` and write the report; returns
    the results. ``preregistered``: the pre-registration file this run must match, unless
    ``deviation`` states why it runs anyway (:func:`check_registered`);
    ``prepared``: :func:`prepare`'s result when the caller has it already;
    ``cluster``: the jobs run as Ray tasks there (one process's otherwise);
    ``validation_only``: stop before the test phase (for choosing settings: the test splits stay
    unseen, and a later run of the same settings in the same folder scores them);
    ``show_progress``: a bar on stderr over the training steps and scored examples left;
    ``command``: the command line, for the report; ``target_effect``: the report plans a next
    run for it (seeds and items needed)."""
    torch.set_num_threads(config.threads)
    prepared = prepared or prepare(config, data_dir)
    registration = check = None
    if preregistered is not None:
        stored, check = check_registered(config, prepared, preregistered, deviation=deviation)
        registration = (Path(preregistered), stored)
    return run_comparison(
        FinetuneComparison(config, prepared, validation_only), run_dir, cluster=cluster,
        show_progress=show_progress, command=command, log=log, preregistered=registration,
        registration_check=check, target_effect=target_effect,
    )  # fmt: skip
