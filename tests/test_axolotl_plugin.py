"""numtok's Axolotl plugin (numtok.integrations.axolotl) run by Axolotl 0.19.0 itself: its config
loader and PluginManager read the plugin from YAML files, validate its keys and refusals, and its
trainer setup runs the plugin's hook before three training steps on a tiny Llama, with Axolotl's
cross-entropy (full fine-tuning, LoRA, two micro-batches per step logits-free) and with Axolotl's
Liger plugin (fused linear cross-entropy, in Triton's interpreter on CPU). The scenarios are in
tests/_axolotl_worker.py.

Axolotl pins releases other than the dev environment's (transformers 5.16.1, trl 1.9.0,
peft 0.20.0, accelerate 1.13.0, datasets 4.8.4, liger-kernel 0.8.1, ...), so the worker runs in
an environment of its own, built here once and kept in a cache folder: a venv whose own
site-packages hold Axolotl and those pins and whose last entry is this environment's
site-packages (torch 2.13.0, which Axolotl accepts, and the rest), found after them. Building it
(`pip install` from the package index, about 50 packages, 690 MB) took 51 s here with pip's
wheel cache warm; the scenarios take 60-85 s on 2 CPU cores. `$NUMTOK_AXOLOTL_ENV` chooses the
folder (default: ~/.cache/numtok/axolotl-0.19.0-<hash of the requirements and this Python>).
"""

from __future__ import annotations

import os
import site
import subprocess
from pathlib import Path

import pytest

from _environments import build_environment, environment_folder

ROOT = Path(__file__).resolve().parents[1]

#: Installed without their dependencies (Axolotl's own list holds CUDA-only and service packages
#: the scenarios never import: xformers, flash-attn, torchao, gradio, modal, lm_eval, ...).
NO_DEPS = ["axolotl==0.19.0", "axolotl-contribs-lgpl==0.0.7", "axolotl-contribs-mit==0.0.6"]
#: What Axolotl imports on the scenarios' paths, at Axolotl 0.19.0's pins where it pins them;
#: installed with their dependencies.
REQUIREMENTS = [
    "transformers==5.16.1",
    "trl==1.9.0",
    "peft==0.20.0",
    "accelerate==1.13.0",
    "datasets==4.8.4",
    "huggingface_hub==1.17.0",
    "tokenizers==0.23.1",
    "hf_xet==1.4.3",
    "kernels>=0.16.0,<0.17.0",
    "pydantic==2.12.5",
    "packaging==26.0",
    "PyYAML==6.0.3",
    "typing-extensions==4.15.0",
    "posthog==6.7.11",
    "mistral-common==1.11.5",
    "bitsandbytes==0.50.2",
    "liger-kernel==0.8.1",
    "evaluate==0.4.1",
    "numba>=0.63.1,<1.0",
    "wandb",
    "addict",
    "fire",
    "fastcore",
    "einops",
    "colorama",
    "termcolor",
]
SCENARIOS = [
    "validation",
    "attach",
    "attach-accumulated-logits-free",
    "attach-lora",
    "liger",
    "liger-lora",
    "loud",
]


@pytest.fixture(scope="module")
def axolotl_python() -> Path:
    """The Python of the Axolotl environment, built on first use."""
    folder = environment_folder(
        "axolotl-0.19.0", [*site.getsitepackages(), *NO_DEPS, *REQUIREMENTS], "NUMTOK_AXOLOTL_ENV"
    )
    return build_environment(
        folder, inherit=True, without_dependencies=NO_DEPS, requirements=REQUIREMENTS
    )


@pytest.mark.slow
def test_axolotl_loads_validates_and_trains_with_the_plugin(
    axolotl_python: Path, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "AXOLOTL_DO_NOT_TRACK": "1",  # Axolotl's telemetry
        "HF_HUB_OFFLINE": "1",
        "TRITON_INTERPRET": "1",  # Liger's Triton kernels on CPU tensors
        "WANDB_MODE": "disabled",
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    result = subprocess.run(
        [str(axolotl_python), str(ROOT / "tests" / "_axolotl_worker.py"), str(tmp_path)],
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
