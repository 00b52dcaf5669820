"""examples/finetune_causal_lm.py runs end to end on a tiny randomly initialised Llama saved to a
folder, as a user would run it on a real one."""

from __future__ import annotations

import json
import random
import runpy
from pathlib import Path
from typing import Any

import pytest

from _hf_tiny import build_model, build_tokenizer

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "finetune_causal_lm.py"


def write_jsonl(path: Path, count: int, seed: int) -> None:
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as file:
        for _ in range(count):
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            file.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n")


@pytest.fixture(scope="module")
def finetune_main() -> Any:
    return runpy.run_path(str(EXAMPLE))["main"]


def test_example_fine_tunes_evaluates_and_saves(finetune_main: Any, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = build_tokenizer()
    model_dir = tmp_path / "tiny-llama"
    build_model(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    write_jsonl(tmp_path / "train.jsonl", 32, seed=0)
    write_jsonl(tmp_path / "eval.jsonl", 6, seed=1)
    output = tmp_path / "run"

    results = finetune_main(
        [
            *("--model", str(model_dir), "--output", str(output)),
            *("--train", str(tmp_path / "train.jsonl"), "--eval", str(tmp_path / "eval.jsonl")),
            *("--max-steps", "12", "--batch-size", "4", "--grad-accum", "2", "--lr", "3e-3"),
            *("--logging-steps", "4", "--eval-steps", "6", "--max-new-tokens", "4"),
            *("--eval-before", "--threads", "1"),
        ]
    )

    training_logs = [entry for entry in results["log_history"] if "loss" in entry]
    assert [entry["step"] for entry in training_logs] == [4, 8, 12]
    for entry in training_logs:  # transformers 4.x logs the loss rounded to 4 decimals
        assert entry["loss"] == pytest.approx(entry["ce"] + 0.3 * entry["ntl"], rel=1e-5, abs=5e-5)
    assert training_logs[-1]["loss"] < training_logs[0]["loss"]  # it learns
    eval_logs = [entry for entry in results["log_history"] if "eval_ntl" in entry]
    assert [entry["step"] for entry in eval_logs] == [6, 12, 12]  # two during training, one after
    for scores in (results["before"], results["after"]):
        assert scores["count"] == 6
        assert 0 <= scores["exact_accuracy"] <= 1
        assert scores["parsed"] + scores["unparseable"] == 6
        assert len(scores["samples"]) == 5

    saved = json.loads((output / "results.json").read_text())
    assert saved["after"]["count"] == 6 and saved["settings"]["ntl_weight"] == "0.3"
    reloaded = AutoModelForCausalLM.from_pretrained(output / "model")
    assert reloaded.config.vocab_size == len(AutoTokenizer.from_pretrained(output / "model"))


def test_example_rejects_malformed_data(finetune_main: Any, tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"question": "1+1=", "answer": "2"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: expected an object with 'prompt'"):
        finetune_main(
            ["--model", str(tmp_path), "--train", str(tmp_path / "bad.jsonl"), "--output", "x"]
        )
