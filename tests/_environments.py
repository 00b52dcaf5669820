"""Environments of their own for the tests that run numtok inside another stack (Axolotl,
LLaMA-Factory, vLLM): a venv built on first use and kept in a cache folder named by a hash of
what it holds, so that other pins build another one and an unchanged one is reused."""

from __future__ import annotations

import hashlib
import os
import site
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["build_environment", "environment_folder", "pip"]

#: Marks a finished environment: one killed while being built is built again.
_COMPLETE = ".numtok-complete"


def environment_folder(name: str, contents: Sequence[str], variable: str) -> Path:
    """``$variable`` if set, else ``~/.cache/numtok/<name>-<hash>``, the hash of this Python's
    version and ``contents`` (the pins, and whatever else decides what the environment holds)."""
    key = "\n".join([sys.version, *contents])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    default = Path.home() / ".cache" / "numtok" / f"{name}-{digest}"
    return Path(os.environ.get(variable, default))


def pip(python: Path, *args: str) -> None:
    """This Python's pip run for the environment's ``python``; a failure shows pip's output."""
    command = [sys.executable, "-m", "pip", "--python", str(python), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stderr[-4000:]}"


def build_environment(
    folder: Path,
    *,
    inherit: bool,
    without_dependencies: Sequence[str] = (),
    requirements: Sequence[str] = (),
    removed: Sequence[str] = (),
    files: Mapping[str, str] | None = None,
) -> Path:
    """The Python of the venv in ``folder``, built unless a finished one is there: with
    ``inherit``, this environment's site-packages come after its own (torch and what the stack
    does not pin are taken from here); then ``without_dependencies`` installed with
    ``--no-deps``, ``requirements`` with theirs, ``removed`` uninstalled, and ``files``
    (path relative to site-packages: text) written."""
    python = folder / "bin" / "python"
    if (folder / _COMPLETE).exists():
        return python
    subprocess.run(
        [sys.executable, "-m", "venv", "--clear", "--without-pip", str(folder)], check=True
    )
    purelib = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    if inherit:  # a .pth line is appended to sys.path, after the venv's own site-packages
        (purelib / "zz_numtok_dev_environment.pth").write_text(
            "\n".join(site.getsitepackages()) + "\n"
        )
    if without_dependencies:
        pip(python, "install", "-q", "--no-deps", *without_dependencies)
    if requirements:
        pip(python, "install", "-q", *requirements)
    if removed:
        pip(python, "uninstall", "-y", *removed)
    for relative, text in (files or {}).items():
        (purelib / relative).parent.mkdir(parents=True, exist_ok=True)
        (purelib / relative).write_text(text)
    (folder / _COMPLETE).touch()
    return python
