"""``numtok vocab PATH``: the audit of a tokenizer saved in a folder or as a tokenizer.json — the
real GPT-2 and Mistral tokenizers, one that lacks digits (status 1, naming them), bad paths and
sizes (status 2, one line, no traceback)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from numtok.cli import main

from conftest import build_gpt2_tokenizer, build_mistral_tokenizer


def run(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str, str]:
    try:
        status = main(["vocab", *arguments])
    except SystemExit as exit_:
        status = int(exit_.code or 0)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_gpt2_saved_as_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build_gpt2_tokenizer().save_pretrained(tmp_path / "gpt2")
    status, out, err = run(capsys, str(tmp_path / "gpt2"), "--vocab-size", "50304")
    assert status == 0, err
    assert "1691 number tokens in a vocabulary of 50304" in out
    assert "by digit length: 1: " in out and "minus signs" in out and "skipped" in out


def test_mistral_saved_as_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build_mistral_tokenizer(tmp_path).save_pretrained(tmp_path / "mistral")
    status, out, err = run(capsys, str(tmp_path / "mistral"))
    assert status == 0, err
    assert "by digit length: 1: " in out and "WARNING" not in out


def test_a_tokenizer_json_without_every_digit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<unk>", "a", "b", *"01234"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    backend.save(str(tmp_path / "tokenizer.json"))
    status, out, err = run(capsys, str(tmp_path / "tokenizer.json"))
    assert status == 1
    assert "5 number tokens" in out
    assert err.strip() == (
        f"numtok: error: {tmp_path / 'tokenizer.json'} has no single-digit token for 5, 6, 7, 8, "
        "9: NTL can neither reward nor penalise those digits; train with another tokenizer or "
        "add the digits as tokens (and resize the model's embeddings)"
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("missing-folder",), "missing-folder does not exist"),
        (("GPT2", "--vocab-size", "10"), "vocab_size"),
    ],
)
def test_bad_paths_and_sizes_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], arguments: Any, message: str
) -> None:
    build_gpt2_tokenizer().save_pretrained(tmp_path / "GPT2")
    arguments = [str(tmp_path / arguments[0]), *arguments[1:]]
    status, _, err = run(capsys, *arguments)
    assert status == 2
    assert len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err
