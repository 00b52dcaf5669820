"""The documentation: the API reference covers every public name, the README is a landing page
whose links resolve, and every README section the site includes is marked in the README.

The site itself is built by ``make docs`` (``mkdocs build --strict``), which CI runs; these checks
need no MkDocs."""

import importlib
import json
import re
from pathlib import Path

import numtok
import numtok.hf
import numtok.readout

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

# A Markdown link or image target: [text](target) with no scheme and no in-page anchor.
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _reference_objects() -> dict[str, object]:
    """``::: dotted.path`` entries of the reference page, each imported."""
    objects = {}
    for path in re.findall(r"^::: ([\w.]+)$", (DOCS / "reference.md").read_text(), re.MULTILINE):
        module, _, name = path.rpartition(".")
        objects[path] = getattr(importlib.import_module(module), name)
    return objects


def _local_links(markdown: Path) -> list[str]:
    targets = LINK.findall(markdown.read_text())
    return [t.split("#")[0] for t in targets if "://" not in t and not t.startswith("#")]


def test_every_public_name_has_a_reference_entry() -> None:
    documented = list(_reference_objects().values())
    public = [(f"numtok.{n}", getattr(numtok, n)) for n in numtok.__all__]
    public += [(f"numtok.hf.{n}", getattr(numtok.hf, n)) for n in numtok.hf.__all__]
    missing = [name for name, obj in public if not any(obj is d for d in documented)]
    assert not missing, f"docs/reference.md has no `::: ...` entry for {missing}"


def test_reference_entries_are_public_names() -> None:
    public = {id(getattr(numtok, n)) for n in numtok.__all__}
    public |= {id(getattr(numtok.hf, n)) for n in numtok.hf.__all__}
    public |= {id(getattr(numtok.readout, n)) for n in numtok.readout.__all__}
    public.add(id(numtok.readout))  # the namespace's own page: its docstring lists its names
    private = [path for path, obj in _reference_objects().items() if id(obj) not in public]
    assert not private, f"docs/reference.md documents names outside __all__: {private}"


def test_readme_is_a_landing_page_whose_links_resolve() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines, the landing page at most 200"
    links = _local_links(README)
    assert any(link.startswith("docs/") for link in links), "README.md links no docs page"
    broken = [link for link in links if not (ROOT / link).exists()]
    assert not broken, f"README.md links files that do not exist: {broken}"


def test_install_section_has_no_placeholder() -> None:
    text = README.read_text()
    assert not re.search(r"<your-[\w-]+>", text), "README.md still has a placeholder URL"
    assert 'pip install ".[hf]"' in text


def test_every_included_readme_section_is_marked() -> None:
    readme = README.read_text()
    included = set()
    for page in DOCS.glob("*.md"):
        included |= set(re.findall(r'^--8<-- "README\.md:(\w+)"$', page.read_text(), re.MULTILINE))
    assert included, "no docs page includes a README section"
    for section in sorted(included):
        start = readme.find(f"<!-- --8<-- [start:{section}] -->")
        end = readme.find(f"<!-- --8<-- [end:{section}] -->")
        assert 0 <= start < end, f"README.md lacks the markers of section {section!r}"


def test_committed_rows_are_strict_json() -> None:
    """Every results file in docs/ and benchmarks/results/ parses as strict JSON: an undefined
    value is ``null``, never the bare ``NaN`` or ``Infinity`` that only Python reads."""

    def refuse(constant: str) -> None:
        raise AssertionError(f"{path.relative_to(ROOT)} holds {constant}")

    paths = [*DOCS.glob("*.json"), *(ROOT / "benchmarks" / "results").glob("*.json")]
    for path in paths:
        json.loads(path.read_text(), parse_constant=refuse)
    for path in (ROOT / "benchmarks" / "results").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip():
                json.loads(line, parse_constant=refuse)
