"""Every measured figure in the docs has its file: a number with a unit or a "×" in README.md or a
page of docs/ sits next to a committed results file that holds it, or says it has none.

**A figure** is a number, or a range of numbers (``14–17 min``, ``0.84–1.18×``), followed by a
unit of time (``ms``, ``s``, ``min``, ``minutes``, ``h``, ``hours``, ...), of memory (``MB``,
``GB``, ``MiB``, ``GiB``, ...) or ``%``, or a ratio written ``0.79×`` (a ``×`` between two
numbers, ``4096 × 32,768``, is a shape, not a figure). Fenced code blocks, inline code, HTML
comments and link targets are not read for figures. Definitions and statistical levels are not
measurements and not figures (:data:`DEFINITIONS`): the metric "within 1 %" (the share of answers
within 1 % of the truth), a 95 % interval, a test at the 5 % level, 80 % power.

**Its context** is the Markdown block it is in: a paragraph, a list item, a heading or a table row.
A list item also reads the paragraph that introduces its list, and a table row reads the table's
header and the paragraphs just before and just after the table (its caption and its note).

**A reference** is a path, in that context (inline code and link targets included), to a results
file: a file under ``benchmarks/results/``, a ``.json``/``.jsonl`` file of ``docs/``, or one of
the report pages of :data:`REPORT_PAGES`. It is written from the repository root
(``benchmarks/results/x.md``, ``docs/x.json``), relative to the page (a Markdown link), or as a
bare file name of ``benchmarks/results/``; ``{jsonl,md}`` braces and ``*`` globs are expanded. A
figure passes when a number in one of the referenced files equals it to the precision shown:
``11.9 s`` matches 11949.3 (ms), ``0.79×`` matches 0.794, ``2,040 MiB`` matches 2039.9, ``+1.3 %``
matches 1.013 (a change may be written ``1 ± p/100``). Units of time convert into each other, as
do units of memory, and a percentage may be written as a fraction. The check asks that the
number be there, not that it be the right one of the file's numbers: it catches a figure with no
file, a file that does not exist and a figure its file does not hold, not a figure read from the
wrong row.

**A marker** says a figure has no file: the sentence holding it (or its table's or list's caption)
contains one of :data:`MARKERS`: "one-off" (observed once, no committed rows), "estimate" or
"estimated" (worked out, not measured), "unmeasured". docs/development.md says the same.

**Not checked**: the report pages of :data:`REPORT_PAGES` (copies of the ``report.md`` a command
wrote: every figure in them is that run's output, their command at their top; they are results
files themselves), and the pages of :data:`PENDING`, which a rewrite in progress will fix.
"""

from __future__ import annotations

import bisect
import functools
import glob
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RESULTS = ROOT / "benchmarks" / "results"

#: Copies of a ``report.md`` that a command wrote (the command is in each page's first lines):
#: data dumps, results files for the other pages, not checked themselves.
REPORT_PAGES = {
    "docs/number-losses-arithmetic-report.md": "numtok compare --preset add_or_sub-losses",
    "docs/number-losses-arithmetic-trainer-report.md": "numtok compare --preset add_or_sub-losses",
    "docs/number-losses-test-report.md": "numtok compare --preset rjokes-losses",
    "docs/number-losses-rjokes-trainer-report.md": "numtok compare --preset rjokes-losses",
    "docs/rjokes-test-report.md": "numtok demo",
    "docs/compare-arithmetic-fresh.md": "numtok compare --preset smollm2-arithmetic-fresh",
    "docs/smollm2-rjokes-gate.md": "numtok compare --preset smollm2-rjokes",
    "docs/smollm2-diamonds-validation.md": "numtok compare --preset smollm2-diamonds",
    "docs/smollm2-diamonds-test.md": "numtok compare --preset smollm2-diamonds",
}

#: Pages whose rewrite is under way (issue 40: the README, the landing page and the results
#: pages of `numtok compare`, SmolLM2 and rJokes), with the figures each still had without their
#: file when it was listed. Take a page off once it passes: a listed page that passes fails
#: test_the_pending_list_holds_only_failing_pages.
PENDING: set[str] = set()

#: The words that mark a sentence's figures as having no committed rows.
MARKERS = ("one-off", "estimate", "estimated", "unmeasured")
MARKER = re.compile(r"(?<![\w-])(?:" + "|".join(map(re.escape, MARKERS)) + r")(?![\w-])", re.I)

# ----------------------------------------------------------------------------------------------
# Figures

#: Units and the factor that turns one into the base unit of its kind (seconds, bytes).
TIME = {
    "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0,
    "min": 60.0, "minute": 60.0, "minutes": 60.0, "h": 3600.0, "hour": 3600.0, "hours": 3600.0,
}  # fmt: skip
MEMORY = {
    "bytes": 1.0, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
    "KiB": 2.0**10, "MiB": 2.0**20, "GiB": 2.0**30, "TiB": 2.0**40,
}  # fmt: skip
UNITS = {
    **{u: ("time", f) for u, f in TIME.items()},
    **{u: ("memory", f) for u, f in MEMORY.items()},
}

_NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
_SIGNED = rf"[−+\-±~]?(?:{_NUMBER})"
_RANGE = rf"(?P<numbers>{_SIGNED}(?:\s?(?:–|-|to|and)\s?{_SIGNED})*)"
_UNIT = "|".join(sorted(map(re.escape, UNITS), key=len, reverse=True))
FIGURE = re.compile(
    rf"(?<![\w.,/−\-]){_RANGE}"
    rf"(?:\s?(?P<unit>{_UNIT})(?![\w/])|\s?(?P<percent>%)|(?P<ratio>×)(?![\d.])"
    rf"|\s(?P<spaced>×)(?!\s?[\d(A-Z]))"
)
ONE_NUMBER = re.compile(rf"(?P<sign>[−+\-±~]?)(?P<number>{_NUMBER})")
#: Definitions and statistical levels, not measurements: the metric "within 1 %", a 95 %
#: interval, a test at the 5 % level, 80 % power.
DEFINITIONS = re.compile(
    r"within[ -]1\s?%"
    r"|(?:paired,|seed t|bootstrap)\s95\s?%|95\s?%(?=[\s-](?:[\w-]+\s){0,2}intervals?\b)"
    r"|\bat(?:\sthe)?\s5\s?%|5\s?%\slevel"
    r"|80\s?%\spower"
)


@dataclass(frozen=True)
class Figure:
    text: str
    values: tuple[tuple[float, int], ...]  # (value, decimals shown)
    kind: str  # "time", "memory", "percent" or "ratio"
    factor: float  # to the kind's base unit
    start: int  # offset in its block's text


def figures(text: str) -> Iterator[Figure]:
    """The figures of a block's text, inline code and link targets already blanked."""
    text = DEFINITIONS.sub(lambda m: " " * len(m.group(0)), text)
    for match in FIGURE.finditer(text):
        if match.group("unit"):
            kind, factor = UNITS[match.group("unit")]
        elif match.group("percent"):
            kind, factor = "percent", 1.0
        else:
            kind, factor = "ratio", 1.0
        values = []
        for number in ONE_NUMBER.finditer(match.group("numbers")):
            digits = number.group("number").replace(",", "")
            decimals = len(digits.partition(".")[2])
            values.append((float(digits), decimals))
        yield Figure(" ".join(match.group(0).split()), tuple(values), kind, factor, match.start())


def _candidates(figure: Figure, value: float, decimals: int) -> Iterator[tuple[float, float]]:
    """(value, tolerance) pairs that a number of a results file may equal for the figure."""
    tolerance = 0.5 * 10.0**-decimals * (1 + 1e-9)
    if figure.kind in ("time", "memory"):
        units = TIME if figure.kind == "time" else MEMORY
        for factor in set(units.values()):
            scale = figure.factor / factor  # the figure written in that unit
            yield value * scale, tolerance * scale
    elif figure.kind == "percent":
        yield value, tolerance
        yield value / 100, tolerance / 100
        yield 1 + value / 100, tolerance / 100
        yield 1 - value / 100, tolerance / 100
    else:
        yield value, tolerance


# ----------------------------------------------------------------------------------------------
# Results files and what they hold

FILE_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def is_results_file(path: Path) -> bool:
    if not path.is_file():
        return False
    relative = path.resolve().relative_to(ROOT).as_posix()
    if relative.startswith("benchmarks/results/"):
        return True
    return relative.startswith("docs/") and (
        path.suffix in (".json", ".jsonl") or relative in REPORT_PAGES
    )


@functools.cache
def numbers_in(path: Path) -> tuple[float, ...]:
    """Every number a results file holds (absolute values, sorted); ``1,234`` read both as
    1234 and as 1 and 234."""
    text = path.read_text(errors="replace")
    found = set()
    for match in FILE_NUMBER.finditer(text):
        token = match.group(0)
        found.add(float(token.replace(",", "")))
        for part in token.split(","):
            found.add(float(part))
    return tuple(sorted(found))


def holds(paths: list[Path], figure: Figure) -> bool:
    for value, decimals in figure.values:
        if not any(
            _near(numbers_in(path), target, tolerance)
            for path in paths
            for target, tolerance in _candidates(figure, value, decimals)
        ):
            return False
    return True


def _near(numbers: tuple[float, ...], target: float, tolerance: float) -> bool:
    index = bisect.bisect_left(numbers, target - tolerance)
    return index < len(numbers) and numbers[index] <= target + tolerance


#: A path into benchmarks/ or docs/ (globs and braces allowed), or a file name with an
#: extension (``x.json``, ``x.*``, ``x.{jsonl,md}``).
PATH_TOKEN = re.compile(
    r"(?:benchmarks|docs|results)/[\w.+\-*/{},]*[\w*}]"
    r"|(?<![\w./-])\w[\w.+\-]*\.(?:\*|\{[\w,]+\}|[A-Za-z]\w*)(?![\w/])"
)


def _expand(pattern: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", pattern)
    if not match:
        return [pattern]
    return [
        expanded
        for option in match.group(1).split(",")
        for expanded in _expand(pattern[: match.start()] + option + pattern[match.end() :])
    ]


def references(text: str, page: Path) -> tuple[list[Path], list[str]]:
    """(results files the text names, paths it names under benchmarks/results/ or docs/ that
    do not exist)."""
    found: list[Path] = []
    missing: list[str] = []
    for match in PATH_TOKEN.finditer(text):
        token = match.group(0).rstrip(".,")
        bases = [page.parent, RESULTS, ROOT / "benchmarks", ROOT]
        if token.startswith(("docs/", "benchmarks/")):
            bases = [ROOT]
        paths = [
            Path(hit)
            for base in bases
            for pattern in _expand(token)
            for hit in sorted(glob.glob(str(base / pattern)))
        ]
        results = [p for p in paths if is_results_file(p)]
        found += results
        if not paths and token.startswith(("docs/", "benchmarks/results/")):
            missing.append(token)
    return found, missing


# ----------------------------------------------------------------------------------------------
# Markdown blocks


@dataclass
class Block:
    kind: str  # "paragraph", "item", "row", "heading"
    line: int  # of its first line
    text: str  # as written
    context: str = ""  # the caption text a row or an item also reads


def _blank(pattern: str, text: str) -> str:
    """Text with the matches of ``pattern`` replaced by spaces (newlines kept)."""
    return re.sub(pattern, lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)


def prose(text: str) -> str:
    """The text a figure is read from: no inline code, no link target, no HTML comment."""
    text = _blank(r"<!--.*?-->", text)
    text = _blank(r"(`+).+?\1", text)
    return _blank(r"\]\([^)\s]*\)", text)


FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")


def _paragraph_at(lines: list[str], index: int) -> str:
    """The paragraph that starts at or after line ``index`` (past blank lines): a table's note."""
    while index < len(lines) and not lines[index].strip():
        index += 1
    paragraph = []
    while index < len(lines) and lines[index].strip():
        if FENCE.match(lines[index]) or lines[index].lstrip().startswith(("|", "#")):
            break
        paragraph.append(lines[index])
        index += 1
    return "\n".join(paragraph)


def blocks(text: str) -> list[Block]:
    """The blocks of a Markdown page, fenced code left out. A table row's context is the
    paragraph just before its table, the header row and the paragraph just after; a list item's
    is the paragraph just before its list."""
    lines = text.split("\n")
    out: list[Block] = []
    current: Block | None = None  # a paragraph or a list item being read
    fence = ""
    table: list[Block] = []

    def close() -> None:
        nonlocal current
        if current is not None:
            out.append(current)
        current = None

    def caption() -> str:
        """The text that introduces what starts here: the block just before, if a paragraph
        (or, for the next item of a list, the list's introduction)."""
        last = out[-1] if out else None
        if last is None or last.kind not in ("paragraph", "item"):
            return ""
        return last.text if last.kind == "paragraph" else last.context

    def close_table(index: int) -> None:
        nonlocal table
        if table:
            context = "\n".join([table[0].context, table[0].text, _paragraph_at(lines, index)])
            for row in table:
                row.context = context
        table = []

    for index, line in enumerate(lines):
        number = index + 1
        stripped = line.strip()
        if fence:
            if stripped.startswith(fence) and not stripped[len(fence) :].strip():
                fence = ""
            continue
        opened = FENCE.match(line)
        if opened:
            close()
            close_table(index)
            fence = opened.group(1)
            continue
        if not stripped:
            close()
            close_table(index)
            continue
        if stripped.startswith("|"):
            close()
            if re.fullmatch(r"\|?[\s:|\-]+\|?", stripped):
                continue  # the separator row
            row = Block("row", number, stripped)
            if not table:
                row.context = caption()
            table.append(row)
            out.append(row)
            continue
        close_table(index)
        if stripped.startswith("#"):
            close()
            out.append(Block("heading", number, stripped))
            continue
        if re.match(r"^\s*(?:[-*+]|\d+\.)\s+", line):
            close()
            current = Block("item", number, line, caption())
            continue
        if current is None:
            current = Block("paragraph", number, line)
        else:
            current.text += "\n" + line
    close()
    close_table(len(lines))
    return out


SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\bvs)[.!?](?=\s+[A-Z*(\[`])|\n\n")


def sentence_of(text: str, offset: int) -> str:
    """The sentence of ``text`` that holds ``offset``."""
    start = 0
    for end in SENTENCE_END.finditer(text):
        if end.end() > offset:
            return text[start : end.end()]
        start = end.end()
    return text[start:]


# ----------------------------------------------------------------------------------------------
# The check


def checked_pages() -> list[Path]:
    pages = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    return [p for p in pages if p.relative_to(ROOT).as_posix() not in REPORT_PAGES]


def violations(page: Path, text: str | None = None) -> list[str]:
    """``file:line: figure (why)`` for every figure of a page (its ``text``, else the file's)
    without its file or a marker."""
    problems = []
    relative = page.relative_to(ROOT).as_posix()
    for block in blocks(page.read_text() if text is None else text):
        text = prose(block.text)
        files, missing = references(block.text + "\n" + block.context, page)
        for path in missing:
            problems.append(f"{relative}:{block.line}: names {path}, which does not exist")
        for figure in figures(text):
            line = block.line + text.count("\n", 0, figure.start)
            if MARKER.search(sentence_of(text, figure.start)) or MARKER.search(
                prose(block.context) if block.kind in ("row", "item") else ""
            ):
                continue
            if block.kind == "row" and MARKER.search(text):
                continue
            if not files:
                problems.append(f"{relative}:{line}: {figure.text} (no results file named)")
            elif not holds(files, figure):
                named = sorted({p.relative_to(ROOT).as_posix() for p in files})
                names = ", ".join(named) if len(named) <= 3 else f"{named[0]}, ... ({len(named)})"
                problems.append(f"{relative}:{line}: {figure.text} (not in {names})")
    return problems


def test_every_figure_has_its_file_or_says_it_has_none() -> None:
    problems = [
        problem
        for page in checked_pages()
        if page.relative_to(ROOT).as_posix() not in PENDING
        for problem in violations(page)
    ]
    assert not problems, (
        "figures without a results file that holds them, and without a marker "
        f"({', '.join(MARKERS)}) in their sentence (docs/development.md, 'Figures'):\n"
        + "\n".join(problems)
    )


def test_the_pending_list_holds_only_failing_pages() -> None:
    passing = sorted(page for page in PENDING if not violations(ROOT / page))
    assert not passing, f"these pages pass the provenance check: take them off PENDING: {passing}"


def test_report_pages_are_copies_of_a_report() -> None:
    for page, command in REPORT_PAGES.items():
        head = "\n".join((ROOT / page).read_text().split("\n")[:12])
        assert command in head, f"{page} does not name the command that wrote it ({command})"


def test_the_check_reads_figures_references_and_markers() -> None:
    found = [f.text for f in figures("took 11.9 s, 14–17 min and 0.84–1.18×; 4096 × 32,768")]
    assert found == ["11.9 s", "14–17 min", "0.84–1.18×"]
    assert [f.text for f in figures("(−45%) and +8-18 % peak, share within 1 % of it")] == [
        "−45%",
        "+8-18 %",
    ]
    results = RESULTS / "2026-11-30T1748-trainer-step-cpu-t1.jsonl"
    (eleven,) = figures("11.9 s")
    assert holds([results], eleven)  # 11949.3 ms
    (wrong,) = figures("12.9 s")
    assert not holds([results], wrong)
    (memory,) = figures("2,040 MiB")
    assert holds([results], memory)  # 2039.9
    text = (
        "Measured (`benchmarks/results/2026-11-30T1748-trainer-step-cpu-t1.{jsonl,md}`):\n\n"
        "| mode | time |\n| --- | --- |\n| logits | 11.9 s |\n| free | 9.4 s |\n\n"
        "Both in one run.\n\nA first run took 3 min (one-off, no rows). Another took 4 min.\n\n"
        "Timings by hand, one-off, no rows:\n\n- a: 5 min\n- b: 6 min\n\n## Next\n\n"
        "| case | time |\n| --- | --- |\n| c | 7 min |\n"
    )
    found = violations(DOCS / "probe.md", text)
    assert [p.split(": ", 1)[1] for p in found] == [
        "9.4 s (not in benchmarks/results/2026-11-30T1748-trainer-step-cpu-t1.jsonl, "
        "benchmarks/results/2026-11-30T1748-trainer-step-cpu-t1.md)",
        "4 min (no results file named)",
        "7 min (no results file named)",  # no caption: the paragraph before is not the table's
    ]


# ----------------------------------------------------------------------------------------------
# Result sentences

#: The pages whose results a reader acts on (issue 60): every interval in them names its rows.
RESULT_PAGES = ("README.md", "docs/should-i-use-ntl.md", "docs/compare.md")
_ENDPOINT = r"[−+\-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
#: An interval as the pages write a result: ``[−0.027, +0.013]``.
INTERVAL = re.compile(rf"\[\s?(?P<low>{_ENDPOINT}),\s?(?P<high>{_ENDPOINT})\s?\]")
#: A Markdown link to a page of docs/ (relative to the page), its anchor dropped.
PAGE_LINK = re.compile(r"\]\((?P<page>[^)#\s]+\.md)(?:#[^)]*)?\)")


def _shown(text: str) -> tuple[float, int]:
    """The value and the decimals of an endpoint as written (``−0.027`` → (−0.027, 3))."""
    plain = text.replace("−", "-").replace(",", "")
    return float(plain), len(plain.split(".")[1]) if "." in plain else 0


def interval_violations(page: Path, text: str | None = None) -> list[str]:
    """``file:line: [low, high]`` for every interval of a result page whose block names no
    results file and links no page of docs/ that holds both its ends to the precision shown
    (the linked page is where its rows are named)."""
    problems = []
    relative = page.relative_to(ROOT).as_posix()
    for block in blocks(page.read_text() if text is None else text):
        written = block.text + "\n" + block.context
        files, _ = references(written, page)
        linked = [(page.parent / m.group("page")).resolve() for m in PAGE_LINK.finditer(written)]
        sources = files + [path for path in linked if path.is_file()]
        body = prose(block.text)
        for interval in INTERVAL.finditer(body):
            ends = [_shown(interval.group(name)) for name in ("low", "high")]
            held = any(
                all(_near(numbers_in(source), abs(v), 0.5 * 10**-d + 1e-12) for v, d in ends)
                for source in sources
            )
            if not held:
                line = block.line + body.count("\n", 0, interval.start())
                problems.append(f"{relative}:{line}: {interval.group(0)}")
    return problems


def test_every_result_interval_names_the_rows_it_rests_on() -> None:
    problems = [p for page in RESULT_PAGES for p in interval_violations(ROOT / page)]
    assert not problems, (
        "intervals in the result pages whose block names no results file or linked page that "
        "holds them:\n" + "\n".join(problems)
    )


def test_the_interval_check_finds_an_interval_without_its_rows() -> None:
    text = (
        "Fresh test: −0.007 [−0.027, +0.013] ([the test](compare-arithmetic-fresh.md)).\n\n"
        "A claim: +0.5 [+0.1, +0.9], from nowhere.\n\n"
        "Misquoted: −0.007 [−0.027, +0.9137] ([the test](compare-arithmetic-fresh.md)).\n"
    )
    found = interval_violations(DOCS / "probe.md", text)
    assert [p.split(": ", 1)[1] for p in found] == ["[+0.1, +0.9]", "[−0.027, +0.9137]"]
