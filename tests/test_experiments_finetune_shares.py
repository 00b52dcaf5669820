"""Under torchrun each process scores its share of a split (whole batches, in order) and the
first joins them. On a tiny random Llama, the joined scores of a fine-tuned arm are one
process's, also when a share is left no batch: exactly for greedy generation and the regression
head (every batch is one process's batch). The distribution readouts' numbers agree to float
rounding only: :func:`numtok.predict_numbers` reads each share's prompts in groups of its own,
padded to their own longest prompt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from numtok_compare.finetune.comparison import FinetuneComparison, prepare
from numtok_compare.finetune.config import FinetuneConfig
from numtok_compare.runner.phases import Job
from numtok_compare.runner.scoring import Share, joined_shares

#: The distribution's values, computed from float32 logits: equal to about 1e-9 here.
ROUNDED = ("expected", "median", "mode")


@pytest.mark.parametrize(
    ("arm", "max_value"),
    [("ce", None), ("ce", 99), ("head", None)],
    ids=["greedy", "readouts", "head"],
)
def test_the_joined_shares_are_the_scores_of_one_process(
    tiny_llama_dir: Path, arm: str, max_value: int | None
) -> None:
    config = FinetuneConfig(
        model=str(tiny_llama_dir), arms=("ce", "head"), seeds=(0,), train_examples=40,
        validation_examples=11, test_examples=4, harder_examples=4, eval_batch_size=4,
        threads=1, max_prompt_tokens=12, max_new_tokens=4, max_value=max_value,
    )  # fmt: skip
    comparison = FinetuneComparison(config, prepare(config))
    answerer = comparison.build(Job(0, arm, 0.0)).answerer
    scored: list[int] = []
    whole = comparison.score(answerer, "validation", scored.append)
    assert scored == [11] and all(len(answers) == 11 for answers in whole["answers"].values())
    for count in (2, 4):  # 3 batches of 4, 4 and 3 examples: of 4 shares, the first has none
        shares: list[dict[str, Any]] = []
        for index in range(count):
            shares.append(comparison.score(answerer, "validation", scored.append,
                                           Share(index, count)))  # fmt: skip
        joined = joined_shares(shares)
        if max_value is None:
            assert joined == whole
            continue
        for readout in ROUNDED:
            assert joined["answers"].pop(readout) == pytest.approx(whole["answers"][readout],
                                                                   rel=1e-6)  # fmt: skip
        assert joined.pop("unexplored") == pytest.approx(whole["unexplored"], abs=1e-6)
        joined_bounds, whole_bounds = joined.pop("bounds"), whole["bounds"]
        assert list(joined_bounds) == ["expected", "median", "mode"] == list(whole_bounds)
        for readout, bounds in joined_bounds.items():
            assert len(bounds) == 11
            assert bounds == pytest.approx(whole_bounds[readout], rel=1e-6, abs=1e-9)
        # The greedy tokens come from the same logits: equal here, as every item and its order.
        assert joined == {"answers": {"greedy": whole["answers"]["greedy"]},
                          "texts": whole["texts"]}  # fmt: skip
    assert scored[1:] == [4, 7, 0, 4, 4, 3]  # each share counts the examples it scored
