"""The test splits' draws chosen on validation (numtok_compare.finetune.draws, ``--readout-samples
auto``): as many as the expected readout's comparisons need for the draws to be a tenth of their
variance, within what keeps the scoring within the training's time, never fewer than
validation's; and a run whose test phase draws that many."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from numtok_compare.analysis import Draws, draws_of_difference
from numtok_compare.finetune.config import FinetuneConfig
from numtok_compare.finetune.data import FinetuneData
from numtok_compare.finetune.draws import draws_for_test_splits
from numtok_compare.runner.batches import Encoded
from numtok_compare.runner.phases import Job

ITEMS = 60


def _config(**settings: Any) -> FinetuneConfig:
    defaults: dict[str, Any] = {
        "task": "jsonl", "data": "task.jsonl", "arms": ("ce", "was"), "seeds": (0, 1, 2),
        "readout_samples": 64, "choose_test_samples": True, "max_value": 999, "max_digits": 3,
        "metric": "mae",
    }  # fmt: skip
    return FinetuneConfig(**(defaults | settings))


def _data(test_items: int = ITEMS) -> tuple[FinetuneData, np.ndarray]:
    rng = np.random.default_rng(0)
    values = rng.integers(100, 900, size=ITEMS).astype(float)
    encoded = [Encoded((1,), (2,), float(v)) for v in values]
    splits = {"train": encoded, "validation": encoded, "test": encoded[:test_items]}
    return FinetuneData(splits), values


def _validation(
    config: FinetuneConfig, references: np.ndarray, standard_error: float, *,
    train_minutes: float = 1.0, score_minutes: float = 0.1, head_minutes: float = 0.05,
) -> dict[Job, dict[str, Any]]:  # fmt: skip
    """Every arm's validation answers: the expected readout off the truth by its own error (sd
    100, each arm and seed its own) plus its draws' noise (sd ``standard_error``, the standard
    error it reports), the head's answers, the minutes each job took."""
    rng = np.random.default_rng(1)
    stored = {}
    for seed in config.seeds:
        for arm in config.arms:
            answers = references + rng.normal(0, 100, size=ITEMS)
            answers += rng.normal(0, standard_error, size=ITEMS) if arm != "head" else 0.0
            if arm == "head":
                entry = {"answers": {"head": answers.tolist()}, "score_minutes": head_minutes}
            else:
                entry = {"answers": {"greedy": np.round(answers).tolist(),
                                     "expected": answers.tolist()},
                         "standard_errors": {"expected": [standard_error] * ITEMS},
                         "score_minutes": score_minutes}  # fmt: skip
            stored[Job(seed, arm, config.weights_of(arm)[0])] = entry | {
                "train_minutes": train_minutes
            }
    return stored


def _needed(
    config: FinetuneConfig, validation: dict[Job, dict[str, Any]], standard_error: float,
    references: np.ndarray,
) -> int | None:  # fmt: skip
    """What the analysis itself says was − CE needs (the same standard error on every item)."""
    answers = {arm: {readout: np.stack([validation[Job(seed, arm, config.weights_of(arm)[0])]
                                        ["answers"][readout] for seed in config.seeds])
                     for readout in ("greedy", "expected")}
               for arm in ("ce", "was")}  # fmt: skip
    errors = {arm: {"expected": np.full((3, ITEMS), standard_error)} for arm in ("ce", "was")}
    entry = draws_of_difference(("was", "expected"), ("ce", "expected"), answers, references, 3,
                                "mae", float(np.median(references)), Draws(errors, 64))  # fmt: skip
    count: int | None = entry["draws_needed"]
    return count


def test_the_test_splits_draw_what_the_comparison_needs_within_the_training() -> None:
    """The affordable count from the minutes by hand: 6 jobs of 2 min training and 0.1 scoring
    leave 11.4 min for test scoring that costs 0.6 min at 64 draws: 64 · 11.4 / 0.6 = 1,216,
    1,024 as a doubling of 64 from below. The draws' noise set so that the comparison needs
    fewer than that (rounded up to a doubling), more than it, and fewer than validation's 64."""
    config = _config()
    data, references = _data()
    for standard_error, expected in ((40.0, "needed"), (200.0, "affordable"), (0.5, "floor")):
        validation = _validation(config, references, standard_error, train_minutes=2.0)
        chosen = draws_for_test_splits(config, validation, {"ce": 0.0, "was": 0.3}, data)
        assert chosen is not None and chosen["affordable"] == 1216
        needed = _needed(config, validation, standard_error, references)
        assert chosen["needed"] == {"was − ce": needed}
        if expected == "needed":
            assert needed is not None and 256 < needed <= 512 and chosen["test"] == 512
        elif expected == "affordable":
            assert (needed is None or needed > 1024) and chosen["test"] == 1024
        else:
            assert needed is not None and needed < 64 and chosen["test"] == 64


def test_the_head_and_larger_test_splits_in_the_budget() -> None:
    """The head's scoring does not grow with the draws: its test minutes come off the budget;
    a test split twice validation's size doubles the token arms' test cost. The head is a
    baseline of its own (was − head), and base is compared with CE only."""
    config = _config(arms=("base", "ce", "was", "head"))
    data, references = _data()
    doubled = FinetuneData(data.splits | {"test": data.splits["test"] * 2})
    validation = {job: stored for job, stored in _validation(config, references, 200.0).items()
                  if job.arm != "base" or job.seed == 0}  # fmt: skip
    weights = {"base": 0.0, "ce": 0.0, "was": 0.3, "head": 0.0}
    chosen = draws_for_test_splits(config, validation, weights, doubled)
    assert chosen is not None
    training = 9 * 1.0 + 1.0  # base trains nothing in a real run; here its minutes count alike
    scoring = 7 * 0.1 + 3 * 0.05
    tokens, head = 7 * 0.1 * 2, 3 * 0.05 * 2
    assert chosen["affordable"] == math.floor(64 * (training - scoring - head) / tokens)
    assert set(chosen["needed"]) == {"base − ce", "was − ce", "ce − head", "was − head"}


def test_no_choice_without_the_setting_or_the_readouts() -> None:
    data, references = _data()
    for config in (_config(choose_test_samples=False), _config(max_value=None)):
        validation = _validation(_config(), references, 20.0)
        assert draws_for_test_splits(config, validation, {"ce": 0.0, "was": 0.3}, data) is None
    with pytest.raises(ValueError, match=r"choose_test_samples .* needs readout_samples"):
        _config(readout_samples=None)
    with pytest.raises(TypeError, match="choose_test_samples must be a bool"):
        _config(choose_test_samples="yes")
    # Unset, the setting stays out of the stored settings: older run folders resume.
    assert "choose_test_samples" not in _config(choose_test_samples=False).to_dict()


def test_a_run_draws_on_its_test_split_what_validation_chose(
    tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """numtok compare --data at its default: validation reads 64 draws per item, the test split
    the count recorded in the choice (every predict_numbers call seen)."""
    import numtok_compare.finetune.evaluate as evaluate
    from numtok.cli import main

    drawn: list[int | None] = []
    real = evaluate.predict_numbers

    def recording(*args: Any, **kwargs: Any) -> Any:
        drawn.append(kwargs["samples"])
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluate, "predict_numbers", recording)
    rng = np.random.default_rng(0)
    pairs = {(int(a), int(b)) for a, b in rng.integers(0, 40, size=(60, 2))}
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": a + b}) + "\n"
                            for a, b in sorted(pairs)[:40]))  # fmt: skip
    out = tmp_path / "run"
    assert main(["compare", "--data", str(data), "--model", str(tiny_llama_dir), "--seeds", "2",
                 "--arms", "ce,was", "--steps", "2", "--batch-size", "4", "--threads", "1",
                 "--adaptation", "full", "--out", str(out), "--no-progress"]) == 0  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    chosen = results["choice"]["draws"]
    assert results["config"]["choose_test_samples"] is True
    # The estimate's probe, then 2 seeds × 2 arms on validation, then on test (one batch each).
    assert drawn == [64] * 5 + [chosen["test"]] * 4 and chosen["test"] > 64
