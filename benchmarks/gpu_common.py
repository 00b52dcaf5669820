"""What the checks of ``benchmarks/gpu.sh`` share: where they write (``BASE.jsonl``, ``BASE.md``,
rewritten after every case so that a step stopped at its time limit keeps what it measured),
reading those rows back, and the small helpers every step uses. Imports no torch at module
level (the report runs without it)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

NTL_WEIGHT = 0.3
FIRST_TEXT_ID = 1210  # ids 100..1209: the 1-3-digit number tokens of anchors.vocabularies
#: The relative difference of the loss allowed between impl="triton" and impl="torch".
LAUNCH_TOLERANCE = {"float64": 1e-9, "float32": 1e-5, "bfloat16": 1e-3, "float16": 1e-3}
#: The line a step's section ends with while it runs.
STILL_RUNNING = "(still running: the rows above are those of the cases that finished)"


def write(base: Path, rows: list[dict[str, Any]], lines: list[str], echo: bool = True) -> None:
    """``BASE.jsonl`` (a row a line) and ``BASE.md`` (``lines``), rewritten whole."""
    base.parent.mkdir(parents=True, exist_ok=True)
    base.with_suffix(".jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    base.with_suffix(".md").write_text("\n".join(lines) + "\n")
    if echo:
        print("\n".join(lines))


def write_so_far(base: Path | None, rows: list[dict[str, Any]], lines: list[str]) -> None:
    """:func:`write` after a case, the section marked as still running (``base`` None: no
    files, for a check run by hand)."""
    if base is not None:
        write(base, rows, [*lines, "", STILL_RUNNING], echo=False)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The JSON rows of ``path`` (none if it does not exist; a last line cut short is skipped)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line cut short by a time limit
            rows.append(json.loads(line))
    return rows


def tail(path: Path, lines: int) -> list[str]:
    """The last ``lines`` lines of ``path`` (none if it does not exist)."""
    if not path.is_file():
        return []
    return path.read_text(errors="replace").splitlines()[-lines:]


def synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def short(error: BaseException, limit: int = 400) -> str:
    text = f"{type(error).__name__}: {error}".strip().replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def number_batch(tokens: int, vocab_size: int, ignored: float, device: Any) -> tuple[Any, Any]:
    """(labels, vocab): 10 % of the labels among the 1,110 number tokens (ids 100..1209), a share
    ``ignored`` of them -100, the rest text ids."""
    import torch
    from anchors import CHUNKS, vocabularies

    vocab = vocabularies(vocab_size)[CHUNKS]
    generator = torch.Generator().manual_seed(1)
    choice = torch.rand(tokens, generator=generator)
    numbers = vocab.ids[torch.randint(len(vocab), (tokens,), generator=generator)]
    text = torch.randint(FIRST_TEXT_ID, vocab_size, (tokens,), generator=generator)
    labels = torch.where(choice < 0.1, numbers, text)
    labels = torch.where(choice >= 1 - ignored, torch.full_like(labels, -100), labels)
    return labels.to(device), vocab
