"""Where a run's code and files come from: numtok's commit in git (and whether its source differs
from it), a digest of the source that runs (numtok's and this harness's Python files, however they
are installed), the commit that last changed a file such as a pre-registration, and a file's
SHA-256 (which pins a downloaded or installed file); and the arm a pre-registration names."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["code_version", "file_sha256", "git_provenance", "registered_arm", "source_digest"]

#: Files are hashed in chunks of this many bytes (a model file need not fit in memory).
_CHUNK_BYTES = 1 << 20


def file_sha256(path: Path) -> str:
    """The SHA-256 of the file's bytes, in hex."""
    hasher = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(_CHUNK_BYTES), b""):
            hasher.update(chunk)
    return hasher.hexdigest()


def source_digest() -> str:
    """The SHA-256 (16 hex digits) of the source that runs a comparison: every ``.py`` file of
    the ``numtok`` and ``numtok_compare`` packages, by its path inside its package and its
    bytes, in sorted order. It names the code itself, not a commit: committing a
    pre-registration makes a new commit but leaves it unchanged, and an edit to either package,
    committed or not, changes it."""
    import numtok
    import numtok_compare

    hasher = hashlib.sha256()
    for package in (numtok, numtok_compare):
        root = Path(str(package.__file__)).resolve().parent
        for path in sorted(root.rglob("*.py")):
            hasher.update(f"{package.__name__}/{path.relative_to(root).as_posix()}\0".encode())
            hasher.update(path.read_bytes())
            hasher.update(b"\0")
    return hasher.hexdigest()[:16]


def code_version() -> dict[str, Any]:
    """``{"numtok", "commit", "modified", "source"}``: numtok's version, when it runs from a git
    checkout the commit it is at and whether its source differs from that commit (None where
    it is installed from a wheel), and :func:`source_digest`."""
    import numtok

    source = Path(numtok.__file__).resolve().parent
    result: dict[str, Any] = {"numtok": numtok.__version__, "commit": None, "modified": None,
                              "source": source_digest()}  # fmt: skip
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=source,
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout.strip()  # fmt: skip
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", "."], cwd=source,
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return result
    result.update(commit=commit, modified=bool(changed))
    return result


def git_provenance(path: Path) -> dict[str, Any]:
    """``{"sha256", "commit", "committed"}``: the file's hash, and the commit that last changed
    it with that commit's time (None when the file is not committed as it is, or not in git)."""
    result: dict[str, Any] = {"sha256": file_sha256(path), "commit": None, "committed": None}
    folder = path.resolve().parent
    try:
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", path.name], cwd=folder,
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout.strip()  # fmt: skip
        log = subprocess.run(
            ["git", "log", "-1", "--format=%H %cI", "--", path.name], cwd=folder,
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout.split()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return result
    if log and not changed:
        result.update(commit=log[0], committed=log[1])
    return result


def registered_arm(record: dict[str, Any]) -> str:
    """The arm of a registration's primary endpoints (this version's ``primary_endpoints``, or
    the one ``primary_endpoint`` "ARM - ce" an earlier version wrote)."""
    endpoints = record.get("primary_endpoints")
    if isinstance(endpoints, list) and endpoints and isinstance(endpoints[0], dict):
        return str(endpoints[0].get("arm", ""))
    return str(record.get("primary_endpoint", {}).get("difference", "")).split(" ")[0]
