"""Fetching the rJokes files when they are not found: ``dev.tsv.gz`` and ``test.tsv.gz`` from the
data repository's ``data/`` folder at a pinned commit, into ``<cache>/rjokes`` (``$NUMTOK_CACHE``,
else ``~/.cache/numtok``), each checked against its pinned SHA-256 before it is kept. A file
already there with the right checksum is not fetched again.

The files are the authors' (https://github.com/orionw/rJokesData, the Reddit License and Terms of
Service); they are downloaded to the user's cache, never into the project.
"""

from __future__ import annotations

import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from numtok_compare.provenance import file_sha256
from numtok_compare.tasks import default_cache_dir

__all__ = ["CHECKSUMS", "SOURCE_URL", "DownloadError", "fetch_rjokes", "rjokes_cache_dir"]

#: The data repository's ``data/`` folder at the commit whose files the checksums pin.
SOURCE_URL = (
    "https://raw.githubusercontent.com/orionw/rJokesData/"
    "d48bedd71bdacc7557b84ad697bf556e7aad7c21/data/"
)
#: SHA-256 of each file at that commit (43,246 jokes each).
CHECKSUMS: Mapping[str, str] = {
    "dev.tsv.gz": "8787317555ad6c11f27843c47aaf202ffef90a55a16f5829ef0a0bcc9ca6bde9",
    "test.tsv.gz": "a3818c1c012e413f61179eb9f89d611a3b7091320a5137a1c3be21dbbe54a1fc",
}
_TIMEOUT_SECONDS = 30
_CHUNK_BYTES = 1 << 16


class DownloadError(RuntimeError):
    """The files could not be fetched or did not match their checksums; the message is one line
    that says which and why."""


def rjokes_cache_dir() -> Path:
    """``<cache>/rjokes``: where downloaded rJokes files are kept."""
    return default_cache_dir() / "rjokes"


def _fetch(url: str, partial: Path, show_progress: bool) -> None:
    """``url`` into ``partial``, with a progress bar of its bytes when asked."""
    with urllib.request.urlopen(url, timeout=_TIMEOUT_SECONDS) as response:
        size = int(response.headers.get("Content-Length") or 0) or None
        progress = None
        if show_progress:
            from tqdm import tqdm

            progress = tqdm(total=size, unit="B", unit_scale=True, desc=url.rsplit("/", 1)[-1])
        try:
            with partial.open("wb") as file:
                for chunk in iter(lambda: response.read(_CHUNK_BYTES), b""):
                    file.write(chunk)
                    if progress is not None:
                        progress.update(len(chunk))
        finally:
            if progress is not None:
                progress.close()


def fetch_rjokes(
    directory: Path | None = None,
    *,
    source_url: str | None = None,
    checksums: Mapping[str, str] | None = None,
    show_progress: bool = True,
) -> Path:
    """The folder (``directory``, default :func:`rjokes_cache_dir`) holding every file of
    ``checksums`` (default :data:`CHECKSUMS`), each downloaded from ``source_url + name``
    (default :data:`SOURCE_URL`) unless a copy with the right SHA-256 is there already. Raises
    :class:`DownloadError` (one line: the file, the address and the reason, or both checksums)
    and keeps no file that failed its check."""
    source_url = SOURCE_URL if source_url is None else source_url
    checksums = CHECKSUMS if checksums is None else checksums
    target = rjokes_cache_dir() if directory is None else Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    for name, expected in checksums.items():
        path = target / name
        if path.is_file() and file_sha256(path) == expected:
            continue
        url = source_url + name
        partial = path.with_name(name + ".partial")
        try:
            _fetch(url, partial, show_progress)
        except (urllib.error.URLError, OSError, ValueError) as error:
            partial.unlink(missing_ok=True)
            reason = getattr(error, "reason", error)
            raise DownloadError(f"could not download {url}: {reason}") from error
        actual = file_sha256(partial)
        if actual != expected:
            partial.unlink()
            raise DownloadError(
                f"{url} does not match its pinned checksum (SHA-256 {actual}, expected "
                f"{expected}); it was not kept"
            )
        shutil.move(os.fspath(partial), os.fspath(path))
    return target
