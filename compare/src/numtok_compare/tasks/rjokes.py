"""The rJokes regression data (Weller and Seppi, LREC 2020): Reddit jokes and their score, an
integer 0-11 (the log of the post's upvotes).

The task reads the data repository's ``data/`` folder (https://github.com/orionw/rJokesData):
``train.tsv(.gz)`` to train on if present, else ``dev.tsv(.gz)``, and ``test.tsv(.gz)``; each
line is ``score<TAB>joke``. The data is never copied into this project. A fixed slice of the
training file, the same for every seed, is held out as the validation split on which settings
(steps, learning rate, λ) are chosen; the test split is for the final numbers only.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import random
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DATA_SOURCE",
    "Joke",
    "RJokesData",
    "default_data_dir",
    "evaluation_subset",
    "find_data_dir",
    "load_rjokes",
    "read_jokes",
]

Joke = tuple[str, int]

DATA_SOURCE = (
    "the rJokes data (https://github.com/orionw/rJokesData, its data/ folder: dev.tsv.gz and "
    "test.tsv.gz, or train.tsv.gz)"
)
#: The environment variable that names the data folder when ``--data-dir`` is not given.
DATA_DIR_VARIABLE = "NUMTOK_RJOKES_DIR"
# The validation split is drawn with this seed whatever the training seed, so every seed and
# every arm is evaluated on the same jokes.
_SPLIT_SEED = 20_200_511


def default_data_dir() -> Path | None:
    """``$NUMTOK_RJOKES_DIR``, else ``../shared/data/rjokes`` beside the checkout this package is
    installed from (an editable install), else None."""
    if os.environ.get(DATA_DIR_VARIABLE):
        return Path(os.environ[DATA_DIR_VARIABLE])
    checkout = Path(__file__).resolve().parents[4]
    beside = checkout.parent / "shared" / "data" / "rjokes"
    return beside if (checkout / "pyproject.toml").exists() and beside.is_dir() else None


def _file(directory: Path, split: str) -> Path | None:
    for name in (f"{split}.tsv", f"{split}.tsv.gz"):
        if (directory / name).is_file():
            return directory / name
    return None


def find_data_dir(data_dir: Path | str | None) -> Path:
    """The folder to read: ``data_dir`` or :func:`default_data_dir`; a ValueError that says where
    the files come from when it does not hold them."""
    directory = Path(data_dir) if data_dir is not None else default_data_dir()
    if directory is None:
        raise ValueError(
            f"the rJokes task needs {DATA_SOURCE}; pass its folder with --data-dir DIR or set "
            f"${DATA_DIR_VARIABLE}"
        )
    missing = [
        name
        for name, present in (
            (
                "train.tsv(.gz) or dev.tsv(.gz)",
                _file(directory, "train") or _file(directory, "dev"),
            ),
            ("test.tsv(.gz)", _file(directory, "test")),
        )
        if present is None
    ]
    if missing:
        raise ValueError(
            f"the rJokes data folder {directory} lacks {' and '.join(missing)}; it should hold "
            f"{DATA_SOURCE}"
        )
    return directory


def read_jokes(path: Path) -> list[Joke]:
    """The ``(joke, score)`` pairs of one ``score<TAB>joke`` file (plain or gzip)."""
    opener = gzip.open if path.suffix == ".gz" else open
    jokes: list[Joke] = []
    with opener(path, "rt", encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            score, separator, text = line.rstrip("\n").partition("\t")
            if not separator or not score.isdigit():
                raise ValueError(
                    f"{path}:{number}: expected 'score<TAB>joke' with a non-negative integer "
                    f"score, got {line[:60]!r}"
                )
            jokes.append((text, int(score)))
    if not jokes:
        raise ValueError(f"{path} holds no jokes")
    return jokes


def _digest(paths: list[Path]) -> str:
    hasher = hashlib.sha256()
    for path in paths:
        hasher.update(path.read_bytes())
    return hasher.hexdigest()[:16]


@dataclass(frozen=True)
class RJokesData:
    """``train`` (the training file minus ``validation``), ``validation`` and ``test`` jokes;
    ``files`` the files read and ``digest`` a hash of their bytes (provenance)."""

    train: list[Joke]
    validation: list[Joke]
    test: list[Joke]
    files: list[str]
    digest: str


def load_rjokes(data_dir: Path | str | None, *, validation_jokes: int) -> RJokesData:
    """Read the data folder and hold ``validation_jokes`` training jokes out (a fixed random
    choice, the same for every seed)."""
    directory = find_data_dir(data_dir)
    training_file = _file(directory, "train") or _file(directory, "dev")
    test_file = _file(directory, "test")
    assert training_file is not None and test_file is not None
    pool = read_jokes(training_file)
    if not 0 < validation_jokes < len(pool):
        raise ValueError(
            f"validation_jokes must be between 1 and {len(pool) - 1} (the training file "
            f"{training_file.name} holds {len(pool)} jokes), got {validation_jokes}"
        )
    order = list(range(len(pool)))
    random.Random(_SPLIT_SEED).shuffle(order)
    held_out = set(order[:validation_jokes])
    return RJokesData(
        train=[joke for index, joke in enumerate(pool) if index not in held_out],
        validation=[pool[index] for index in sorted(held_out)],
        test=read_jokes(test_file),
        files=[str(training_file), str(test_file)],
        digest=_digest([training_file, test_file]),
    )


def evaluation_subset(jokes: list[Joke], count: int) -> list[Joke]:
    """The first ``count`` jokes of a fixed random order (all of them for ``count == 0``), so that
    a smaller evaluation is a subset of a larger one."""
    if count == 0 or count >= len(jokes):
        return list(jokes)
    order = list(range(len(jokes)))
    random.Random(_SPLIT_SEED + 1).shuffle(order)
    return [jokes[index] for index in sorted(order[:count])]
