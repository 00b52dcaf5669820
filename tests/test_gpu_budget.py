"""benchmarks/gpu_budget.py and gpu_variants.py, which size benchmarks/gpu.sh's steps from its CPU
dry run: the estimate of each step from what the dry run counted, and the failure of a step whose
estimate exceeds its limit (imports no torch; a fake work folder)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import gpu_budget
import gpu_report
import gpu_variants
import pytest


def _lines(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A dry run's work folder: set-up, launch (3 calls, 2 variants), sync (2 routes, 1 variant
    of launch's and 1 of its own)."""
    _lines(tmp_path / "steps.jsonl", [
        {"step": "setup", "limit": 30, "seconds": 12},
        {"step": "launch", "limit": 60, "seconds": 20},
        {"step": "sync", "limit": 9, "seconds": 14},
    ])  # fmt: skip
    _lines(tmp_path / "setup.jsonl", [{"device": "cpu", "import_seconds": 4.0}])
    _lines(tmp_path / "launch.jsonl", [{"record": "call"}] * 3 + [{"record": "summary"}])
    _lines(tmp_path / "sync.jsonl", [{"route": "a"}, {"route": "b"}])
    a, b, c = ({"kernel": "ce_ntl_rows", "variant": v, "file": ""} for v in "abc")
    _lines(tmp_path / "launch.variants", [a, b, a])
    _lines(tmp_path / "sync.variants", [b, c])
    return tmp_path


def test_each_step_is_estimated_from_what_its_dry_run_counted(work: Path) -> None:
    found = {e.step: e for e in gpu_budget.estimates(work)}
    cuda, compile_s = gpu_budget.CUDA_START_S, gpu_budget.COMPILE_S
    assert found["setup"].seconds == pytest.approx(12 + gpu_budget.PIP_INSTALL_S + cuda, abs=0.1)
    launch_s = 4 + cuda + 2 * compile_s + 3 * gpu_budget.UNIT_S["launch"][1]
    assert found["launch"].seconds == pytest.approx(launch_s, abs=0.1)
    # sync's variant b was launch's: only c is new (Triton's disk cache keeps b).
    sync_s = 4 + cuda + 1 * compile_s + 2 * gpu_budget.UNIT_S["sync"][1]
    assert found["sync"].seconds == pytest.approx(sync_s, abs=0.1)
    assert found["launch"].fits and not found["sync"].fits
    table = "\n".join(gpu_budget.table(list(found.values())))
    assert "| sync | 14 |" in table and "**no**" in table


def test_the_estimate_check_fails_when_a_step_exceeds_its_limit(
    work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(work=str(work))
    assert gpu_report.estimate(args) == 1
    assert "estimated past their limits on the GPU: sync" in capsys.readouterr().out
    steps = [json.loads(line) for line in (work / "steps.jsonl").read_text().splitlines()]
    steps[-1]["limit"] = 60
    _lines(work / "steps.jsonl", steps)
    assert gpu_report.estimate(args) == 0


def test_a_variant_is_the_jit_s_specialisation_and_the_constexprs_values() -> None:
    class Tensor:
        def __init__(self, address: int) -> None:
            self.dtype, self.address = "torch.bfloat16", address

        def data_ptr(self) -> int:
            return self.address

    described = gpu_variants.variant(
        [Tensor(64), Tensor(8), 1, 32, 7, 2**31 + 1], {"BLOCK_V": 1024}
    )
    assert described == "bfloat16/16, bfloat16, 1, i32/16, i32, i64, BLOCK_V=1024"
    assert gpu_variants.variant([], {"BLOCK_V": 2048}) != gpu_variants.variant(
        [], {"BLOCK_V": 1024}
    )
