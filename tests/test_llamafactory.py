"""numtok in LLaMA-Factory 0.9.5: the launcher of docs/integrations.md (a ``TrainerCallback``
that calls ``patch_model``, passed to LLaMA-Factory's ``run_exp``, which is what
``llamafactory-cli train`` runs) trains a tiny Llama from a YAML config in a process of its own,
and the same steps in a plain loop give the same losses and weights: full fine-tuning, two
micro-batches per step, LoRA. The scenarios are in tests/_llamafactory_worker.py.

LLaMA-Factory pins releases other than the dev environment's (transformers ≤ 5.6.0, trl ≤ 0.24.0,
peft ≤ 0.18.1, accelerate ≤ 1.11.0, datasets ≤ 4.0.0), so the worker runs in an environment of
its own, built here once and kept in a cache folder: a venv whose own site-packages hold
LLaMA-Factory and those pins and whose last entry is this environment's site-packages (torch
2.13.0, which LLaMA-Factory accepts, and the rest), found after them. LLaMA-Factory is installed
without its dependencies: they hold torchvision, torchaudio and torchdata, whose releases each
pin one torch (a second, CUDA, torch of several GB) and which supervised fine-tuning on text
never uses, and the web UI's and API's packages (gradio, fastapi, uvicorn, ...). torchaudio
alone is imported on that path (at the top of ``llamafactory/data/mm_plugin.py``, used for audio
inputs only), and its PyPI wheels are CUDA builds that do not load beside a CPU torch
(``libc10_cuda.so: cannot open shared object file``): the environment holds a stand-in module
that raises on any use. Building it (`pip install` from the package index, 15 packages, 150 MB)
took 22 s here with pip's wheel cache warm (about 45 s cold); the scenarios take about 50 s on 2
CPU cores. `$NUMTOK_LLAMAFACTORY_ENV`
chooses the folder (default: ~/.cache/numtok/llamafactory-0.9.5-<hash of the requirements and
this Python>).
"""

from __future__ import annotations

import os
import site
import subprocess
from pathlib import Path

import pytest

from _environments import build_environment, environment_folder

ROOT = Path(__file__).resolve().parents[1]

NO_DEPS = ["llamafactory==0.9.5"]
#: What LLaMA-Factory imports on the scenarios' paths, within its pins; installed with their
#: dependencies. kernels: transformers 5.6.0 reads the hub kernels' API of 0.12 (the dev
#: environment's newer release fails at import).
REQUIREMENTS = [
    "transformers==5.6.0",
    "trl==0.24.0",
    "peft==0.18.1",
    "accelerate==1.11.0",
    "datasets==4.0.0",
    "tokenizers==0.22.2",
    "huggingface_hub==1.33.0",
    "kernels==0.12.3",
    "omegaconf==2.4.0",
]
TORCHAUDIO_STAND_IN = '''"""Not torchaudio: a stand-in written by numtok's test_llamafactory.py.
LLaMA-Factory imports torchaudio for audio inputs; its wheels need a CUDA torch."""


def __getattr__(name):
    raise ImportError(f"torchaudio.{name}: this environment holds a stand-in, not torchaudio")
'''
SCENARIOS = ["full", "accumulated", "lora"]


@pytest.fixture(scope="module")
def llamafactory_python() -> Path:
    """The Python of the LLaMA-Factory environment, built on first use."""
    contents = [*site.getsitepackages(), *NO_DEPS, *REQUIREMENTS, TORCHAUDIO_STAND_IN]
    folder = environment_folder("llamafactory-0.9.5", contents, "NUMTOK_LLAMAFACTORY_ENV")
    return build_environment(
        folder, inherit=True, without_dependencies=NO_DEPS, requirements=REQUIREMENTS,
        files={"torchaudio/__init__.py": TORCHAUDIO_STAND_IN},
    )  # fmt: skip


@pytest.mark.slow
def test_llamafactory_trains_with_ntl_as_a_plain_loop_does(
    llamafactory_python: Path, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    result = subprocess.run(
        [str(llamafactory_python), str(ROOT / "tests" / "_llamafactory_worker.py"), str(tmp_path)],
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
