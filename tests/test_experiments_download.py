"""Fetching the rJokes files when none are found, against an HTTP server the test starts on
127.0.0.1 (nothing leaves the machine): the download is verified and kept, found again without a
second download, refused with one line for a wrong checksum or a dead server; ``numtok demo``
fetches and runs the rJokes comparison, and falls back to the arithmetic one when it cannot."""

from __future__ import annotations

import functools
import hashlib
import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from numtok.cli import main
from numtok_compare import commands
from numtok_compare.tasks import rjokes_download as download
from numtok_compare.tasks.rjokes_download import DownloadError, fetch_rjokes

from test_experiments_rjokes import write_jokes


class _Server:
    """A static file server on 127.0.0.1 in a thread; ``requests`` lists the paths asked for."""

    def __init__(self, folder: Path) -> None:
        requests: list[str] = []

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self) -> None:
                requests.append(self.path)
                super().do_GET()

            def log_message(self, *args: Any) -> None:
                pass

        handler = functools.partial(Handler, directory=str(folder))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.requests = requests
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[_Server, dict[str, str]]]:
    """Generated rJokes-format files served over HTTP, and their checksums."""
    folder = tmp_path / "served"
    folder.mkdir()
    write_jokes(folder / "dev.tsv.gz", 4100, seed=1)  # the demo holds 4,000 out for validation
    write_jokes(folder / "test.tsv.gz", 200, seed=2)
    server = _Server(folder)
    yield server, {name: _sha256(folder / name) for name in ("dev.tsv.gz", "test.tsv.gz")}
    server.close()


def _dead_url() -> str:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/"


def test_the_files_are_verified_kept_and_found_again(
    served: tuple[_Server, dict[str, str]], tmp_path: Path
) -> None:
    server, checksums = served
    cache = tmp_path / "cache"
    folder = fetch_rjokes(cache, source_url=server.url, checksums=checksums, show_progress=False)
    assert folder == cache
    assert {name: _sha256(cache / name) for name in checksums} == checksums
    assert sorted(server.requests) == ["/dev.tsv.gz", "/test.tsv.gz"]
    fetch_rjokes(cache, source_url=server.url, checksums=checksums, show_progress=False)
    assert len(server.requests) == 2  # nothing fetched twice
    assert not list(cache.glob("*.partial"))


def test_a_wrong_checksum_and_a_dead_server_are_one_line(
    served: tuple[_Server, dict[str, str]], tmp_path: Path
) -> None:
    server, checksums = served
    wrong = {**checksums, "test.tsv.gz": "0" * 64}
    with pytest.raises(DownloadError) as mismatch:
        fetch_rjokes(tmp_path / "a", source_url=server.url, checksums=wrong, show_progress=False)
    message = str(mismatch.value)
    assert "test.tsv.gz does not match its pinned checksum" in message and "\n" not in message
    assert not (tmp_path / "a" / "test.tsv.gz").exists()  # not kept
    assert not list((tmp_path / "a").glob("*.partial"))
    with pytest.raises(DownloadError, match=r"could not download http://127\.0\.0\.1:\d+/dev"):
        fetch_rjokes(tmp_path / "b", source_url=_dead_url(), checksums=checksums)


def test_the_pinned_checksums() -> None:
    """A SHA-256 for each file the demo needs, at the raw address of one commit of the data
    repository; where a copy of the data is at hand (``default_data_dir``), its files match."""
    assert set(download.CHECKSUMS) == {"dev.tsv.gz", "test.tsv.gz"}
    assert all(len(value) == 64 for value in download.CHECKSUMS.values())
    assert download.SOURCE_URL.startswith("https://raw.githubusercontent.com/orionw/rJokesData/")
    local = commands.default_data_dir()
    if local is not None and all((local / name).is_file() for name in download.CHECKSUMS):
        assert {name: _sha256(local / name) for name in download.CHECKSUMS} == download.CHECKSUMS


@pytest.mark.slow  # two short demo runs, 8 s: the download itself is held by the tests above
def test_demo_fetches_the_data_when_none_is_found(
    served: tuple[_Server, dict[str, str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server, checksums = served
    monkeypatch.setattr(commands, "default_data_dir", lambda: None)  # no folder anywhere
    monkeypatch.setenv("NUMTOK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(download, "SOURCE_URL", server.url)
    monkeypatch.setattr(download, "CHECKSUMS", checksums)
    smoke = ["--seeds", "1", "--arms", "ce,head", "--steps", "2", "--eval-examples", "5",
             "--workers", "1", "--no-progress"]  # fmt: skip
    status = main(["demo", *smoke, "--out", str(tmp_path / "run")])
    assert status == 0
    assert "learnability gate (validation rmse" in capsys.readouterr().out
    assert (tmp_path / "cache" / "rjokes" / "dev.tsv.gz").is_file()

    monkeypatch.setattr(download, "SOURCE_URL", _dead_url())
    monkeypatch.setenv("NUMTOK_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(SystemExit) as exit_info:  # the head arm: rJokes only, so it tells
        main(["demo", *smoke, "--out", str(tmp_path / "fallback")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "running the arithmetic comparison, since could not download" in error
    assert "Traceback" not in error
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "--preset", "rjokes", *smoke, "--out", str(tmp_path / "refused")])
    assert exit_info.value.code == 2
    assert "numtok: error: could not download" in capsys.readouterr().err
