"""Every arm of a comparison trained by the transformers Trainer (numtok_compare.runner.trainer):
the arms of a seed start from the same weights and take the same batches, each arm's loss is the
one it names (the model's own CE, NTL attached by NTLossForTrainer, the others through
compute_loss_func), and the log holds the last step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from numtok import NumberVocab, gaussian_label_smoothing_ce
from numtok_compare.config import RunConfig
from numtok_compare.objectives import ARMS, ATTACHED_ARMS, GLS_SIGMA, Objective
from numtok_compare.regression_head import RegressionHead
from numtok_compare.runner.trainer import (
    TrainerArm,
    compute_loss_func,
    last_complete_checkpoint,
    objective_loss,
)

from _hf_tiny import build_model, build_tokenizer


@dataclass(frozen=True)
class TinyConfig(RunConfig):
    ARMS: ClassVar[tuple[str, ...]] = (*ARMS, "head")


CONFIG = TinyConfig(steps=3, batch_size=4, learning_rate=1e-2, warmup_steps=1, log_every=2)


def examples(tokenizer: Any, count: int = 12) -> list[dict[str, Any]]:
    """Prompts "a+b=" and their sums, labelled on the answer only."""
    rows = []
    for i in range(count):
        prompt = tokenizer(f"{i}+{i % 5}=", add_special_tokens=False)["input_ids"]
        answer = tokenizer(str(i + i % 5), add_special_tokens=False)["input_ids"]
        rows.append({"prompt": prompt, "answer": answer, "value": float(i + i % 5)})
    return rows


def collate(batch: Sequence[Any]) -> dict[str, torch.Tensor]:
    width = max(len(e["prompt"]) + len(e["answer"]) for e in batch)
    input_ids = torch.zeros((len(batch), width), dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, e in enumerate(batch):
        ids = e["prompt"] + e["answer"]
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, len(e["prompt"]) : len(ids)] = torch.tensor(e["answer"])
        mask[row, : len(ids)] = 1
    targets = torch.tensor([e["value"] / 10 for e in batch])
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels, "targets": targets}


def test_the_objective_loss_reads_the_labelled_positions_after_the_shift() -> None:
    """compute_loss_func: the objective on logits[:, t] against labels[:, t + 1] where labelled,
    weighed by the micro-batch's share of the step's labelled positions."""
    vocab = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=12)
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 12, dtype=torch.float64)
    labels = torch.tensor([[-100, -100, 3, 4, 11], [-100, 7, 11, -100, -100]])
    loss = objective_loss(Objective("gls", vocab, ntl_weight=0.3))
    expected = gaussian_label_smoothing_ce(
        logits[[0, 0, 0, 1, 1], [1, 2, 3, 0, 1]], torch.tensor([3, 4, 11, 7, 11]), vocab,
        sigma=GLS_SIGMA,
    )  # fmt: skip
    torch.testing.assert_close(loss({"logits": logits}, labels), expected)
    torch.testing.assert_close(
        loss({"logits": logits}, labels, num_items_in_batch=torch.tensor(10)), expected * 5 / 10
    )


@pytest.mark.parametrize("arm", ARMS)
def test_each_arm_takes_the_loss_it_names(arm: str) -> None:
    vocab = NumberVocab.from_values({i: str(i) for i in range(10)}, vocab_size=12)
    function = compute_loss_func(arm, vocab, 0.3)
    assert (function is not None) == (arm not in ("ce", *ATTACHED_ARMS))


def trained(arm: str, folder: Path, seen: list[list[float]]) -> tuple[Any, Any]:
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    model = build_model(tokenizer, seed=0)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    if arm == "head":
        model = RegressionHead(model.model, model.config.hidden_size)

    def recording(batch: Sequence[Any]) -> dict[str, torch.Tensor]:
        seen.append([e["value"] for e in batch])
        return collate(batch)

    vocab = NumberVocab.from_tokenizer(tokenizer)
    trainer_arm = TrainerArm(
        model, CONFIG, 7, arm, 0.3, examples(tokenizer), recording, vocab, answerer=model
    )
    return trainer_arm.fit(folder, None), initial


def test_the_arms_of_a_seed_take_the_same_batches_and_log_their_terms(tmp_path: Path) -> None:
    batches: dict[str, list[list[float]]] = {}
    logs = {}
    initial = {}
    for arm in ("ce", "was", "gls", "head"):
        batches[arm] = []
        logs[arm], initial[arm] = trained(arm, tmp_path / arm, batches[arm])
    assert batches["ce"] == batches["was"] == batches["gls"] == batches["head"]
    for arm in ("was", "gls", "head"):
        assert all(torch.equal(initial[arm][k], v) for k, v in initial["ce"].items())
    # Logged every 2 steps and at the last: steps 2 and 3.
    assert [entry["step"] for entry in logs["was"].history] == [2, 3]
    for entry in logs["was"].history:
        assert entry["loss"] == pytest.approx(entry["ce"] + 0.3 * entry["ntl"], rel=1e-4)
    assert logs["ce"].history[0]["ntl"] is None and logs["gls"].history[0]["ce"] is None
    assert len(logs["ce"].step_seconds) == CONFIG.steps
    assert (tmp_path / "head" / "model.pt").exists()
    stored = torch.load(tmp_path / "head" / "model.pt", weights_only=True)
    assert "head.weight" in stored and stored["head.weight"].abs().max() > 0  # it trained


def test_a_half_written_checkpoint_is_not_resumed_from(tmp_path: Path) -> None:
    """A process killed while the Trainer wrote a checkpoint leaves a folder without its
    trainer_state.json (written last): the arm resumes from the newest complete one (by step,
    not by name: 10 after 2), and the half-written one is deleted."""
    assert last_complete_checkpoint(tmp_path / "none") is None
    for step, complete in ((2, True), (10, True), (12, False)):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"")
        if complete:
            (folder / "trainer_state.json").write_text("{}")
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10", "checkpoint-2"]
