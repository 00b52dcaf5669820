"""A user's task as JSON Lines: one example per line, ``{"prompt": "...", "answer": 12.5}``, with
an optional ``"split"``: ``"train"``, ``"validation"`` or ``"test"``.

The input is one ``.jsonl`` file or a folder of them (read in name order); in a folder, a file
named ``train.jsonl``, ``validation.jsonl`` or ``test.jsonl`` gives its split to its lines. Either
every example names its split (by its field or its file), or none does: then the distinct
prompts are split 80 / 10 / 10 % with a fixed seed (:data:`SPLIT_SEED`), every copy of a prompt
in the same split, and the report says so.

The answer is a JSON number, or a string that holds one plain number (``"0.50"``, written as it
is: the model is trained on that text); a JSON number is written without an exponent
(``1e-07`` is trained as ``0.0000001``). Anything else — a line that is not a JSON object, a
missing or empty prompt, an answer that is not a finite number, an unknown split, a split with
no example, a prompt in two splits — is a :class:`DataError` naming the file, the line and the
field.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

__all__ = [
    "SPLITS",
    "SPLIT_SEED",
    "DataError",
    "Record",
    "UserData",
    "read_records",
    "read_user_data",
]

#: The splits a line may name.
SPLITS = ("train", "validation", "test")
#: The seed of the 80 / 10 / 10 % split of data that names no split.
SPLIT_SEED = 0
_SHARES = {"validation": 0.1, "test": 0.1}
_PLAIN_NUMBER = re.compile(r"-?\d+(\.\d+)?")


class DataError(ValueError):
    """Bad input data; the message names the file, line and field."""


@dataclass(frozen=True)
class Record:
    """One example: its prompt, the answer's text and value, its split (None: not given) and
    where it came from (``"file:line"``)."""

    prompt: str
    answer: str
    value: float
    split: str | None
    source: str


@dataclass(frozen=True)
class UserData:
    """The examples of each split, and how the splits were made (for the report)."""

    splits: dict[str, list[Record]]
    how_split: str
    files: list[str]


def _answer_text(value: object, where: str) -> tuple[str, float]:
    if isinstance(value, str) and _PLAIN_NUMBER.fullmatch(value.strip()):
        text = value.strip()
        return text, float(text)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value), float(value)
    if isinstance(value, float) and math.isfinite(value):
        text = format(Decimal(repr(value)), "f")
        return text, value
    raise DataError(
        f"{where}: field 'answer' must be a finite number, or a string holding one plain number "
        f'such as "0.50", got {json.dumps(value)[:60]}'
    )


def _record(line: str, where: str, file_split: str | None) -> Record:
    try:
        entry = json.loads(line)
    except json.JSONDecodeError as error:
        raise DataError(f"{where}: not valid JSON ({error.msg}): {line[:60]!r}") from None
    if not isinstance(entry, dict):
        raise DataError(
            f"{where}: expected a JSON object with 'prompt' and 'answer', got {line[:60]!r}"
        )
    prompt = entry.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        found = "no 'prompt'" if "prompt" not in entry else json.dumps(prompt)[:60]
        raise DataError(f"{where}: field 'prompt' must be a non-empty string, got {found}")
    if "answer" not in entry:
        raise DataError(f"{where}: field 'answer' is missing")
    answer, value = _answer_text(entry["answer"], where)
    split = entry.get("split", file_split)
    if split is not None and split not in SPLITS:
        raise DataError(f"{where}: field 'split' must be one of {list(SPLITS)}, got {split!r}")
    if file_split is not None and split != file_split:
        raise DataError(
            f"{where}: field 'split' is {split!r}, but the file's name makes it {file_split!r}"
        )
    return Record(prompt, answer, value, split, where)


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        try:
            files = sorted(p for p in path.iterdir() if p.suffix == ".jsonl")
        except OSError as error:
            raise DataError(f"{path}: cannot read the folder ({error.strerror})") from None
        if not files:
            raise DataError(f"{path}: a data folder must hold .jsonl files, found none")
        return files
    raise DataError(f"{path}: no such file or folder (expected a .jsonl file or a folder of them)")


def read_records(path: Path | str) -> list[Record]:
    """Every example of the file (or the folder's files), in order; blank lines are skipped."""
    records: list[Record] = []
    for file in _files(Path(path)):
        file_split = file.stem if file.parent == Path(path) and file.stem in SPLITS else None
        try:
            with file.open(encoding="utf-8") as lines:
                for number, line in enumerate(lines, start=1):
                    if line.strip():
                        records.append(_record(line, f"{file}:{number}", file_split))
        except OSError as error:
            raise DataError(f"{file}: cannot read the file ({error.strerror})") from None
        except UnicodeDecodeError as error:
            raise DataError(
                f"{file}: not UTF-8 text (byte {error.start}): JSON Lines are UTF-8"
            ) from None
    if not records:
        raise DataError(f"{path}: holds no examples")
    return records


def _split_by_seed(records: list[Record]) -> dict[str, list[Record]]:
    """80 / 10 / 10 % of the distinct prompts (in a fixed random order), every copy of a prompt
    in its prompt's split."""
    prompts = list(dict.fromkeys(r.prompt for r in records))
    if len(prompts) < 3:
        raise DataError(
            f"{records[0].source.rsplit(':', 1)[0]}: {len(prompts)} distinct prompt(s) cannot be "
            "split into train, validation and test; give more examples"
        )
    random.Random(SPLIT_SEED).shuffle(prompts)
    sizes = {split: max(1, round(share * len(prompts))) for split, share in _SHARES.items()}
    chosen = {p: "validation" for p in prompts[: sizes["validation"]]}
    chosen |= {
        p: "test" for p in prompts[sizes["validation"] : sizes["validation"] + sizes["test"]]
    }
    splits: dict[str, list[Record]] = {split: [] for split in SPLITS}
    for record in records:
        splits[chosen.get(record.prompt, "train")].append(record)
    return splits


def _check_disjoint(splits: dict[str, list[Record]]) -> None:
    first: dict[str, Record] = {}
    for split in SPLITS:
        for record in splits[split]:
            seen = first.setdefault(record.prompt, record)
            if seen.split != record.split and seen is not record:
                raise DataError(
                    f"{record.source}: field 'prompt' repeats the prompt of {seen.source} "
                    f"({seen.split} split) in the {record.split} split: an example in two splits "
                    "makes the evaluation score what was trained on"
                )


def read_user_data(path: Path | str) -> UserData:
    """The splits of a user's data (module docstring)."""
    records = read_records(path)
    named = [r for r in records if r.split is not None]
    files = sorted({r.source.rsplit(":", 1)[0] for r in records})
    if named and len(named) < len(records):
        missing = next(r for r in records if r.split is None)
        raise DataError(
            f"{missing.source}: field 'split' is missing, while {named[0].source} names one: "
            "either every example names its split or none does"
        )
    if named:
        splits = {split: [r for r in records if r.split == split] for split in SPLITS}
        how = "the splits the data names"
    else:
        splits = _split_by_seed(records)
        splits = {split: [_with_split(r, split) for r in splits[split]] for split in SPLITS}
        how = (
            f"no example names a split: its {len(set(r.prompt for r in records))} distinct prompts "
            f"were split 80 / 10 / 10 % with the fixed seed {SPLIT_SEED}"
        )
    for split in SPLITS:
        if not splits[split]:
            raise DataError(
                f"{', '.join(files)}: the {split} split is empty (every comparison needs train, "
                "validation and test examples)"
            )
    _check_disjoint(splits)
    return UserData(splits=splits, how_split=how, files=files)


def _with_split(record: Record, split: str) -> Record:
    return Record(record.prompt, record.answer, record.value, split, record.source)
