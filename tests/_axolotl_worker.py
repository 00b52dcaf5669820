"""Run inside an environment with Axolotl 0.19.0 (built by tests/test_axolotl_plugin.py):
numtok's plugin loaded by Axolotl's own config loader and PluginManager from YAML files,
validated, and trained through Axolotl's own trainer setup on a tiny Llama, with Axolotl's
cross-entropy and with its Liger plugin. Prints ``SCENARIO <name> ok`` after each scenario; any
failure is a traceback and a non-zero exit.

    python tests/_axolotl_worker.py WORK_DIR
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _hf_tiny import build_model, build_tokenizer

PLUGIN = "numtok.integrations.axolotl.NumtokPlugin"
LIGER = "axolotl.integrations.liger.LigerPlugin"
TEXTS = ["12+30=42", "7*6=42", "100-58=42", "84/2=42", "a+b=12345", "pi is 3.14159"]


def write_model_and_data(work: Path) -> tuple[Path, Path]:
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    model_dir = work / "tiny-llama"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data = work / "train.jsonl"
    data.write_text("".join(json.dumps({"text": text}) + "\n" for text in TEXTS))
    return model_dir, data


def write_config(work: Path, name: str, model_dir: Path, data: Path, **settings: Any) -> Path:
    """An Axolotl YAML config: a completion dataset, every example in one batch, CPU, float32."""
    config: dict[str, Any] = {
        "base_model": str(model_dir),
        "datasets": [{"path": str(data), "ds_type": "json", "type": "completion"}],
        "dataset_prepared_path": str(work / f"prepared-{name}"),
        "output_dir": str(work / f"out-{name}"),
        "val_set_size": 0,
        "sequence_len": 32,
        "micro_batch_size": len(TEXTS),
        "gradient_accumulation_steps": 1,
        "max_steps": 3,
        "num_epochs": 3,
        "learning_rate": 0.05,
        "optimizer": "adamw_torch",
        "lr_scheduler": "constant",
        "logging_steps": 1,
        "save_strategy": "no",
        "seed": 0,
        "bf16": False,
        "fp16": False,
        "tf32": False,
        "train_on_inputs": True,
        "special_tokens": {"pad_token": "<pad>", "eos_token": "<eos>"},
        "plugins": [PLUGIN],
    }
    config.update(settings)
    path = work / f"{name}.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def reset_plugins() -> None:
    """Axolotl's PluginManager is a process-wide singleton: forget the last config's plugins."""
    from axolotl.integrations.base import PluginManager

    PluginManager.get_instance().plugins.clear()


def load(path: Path) -> Any:
    from axolotl.cli.config import load_cfg

    reset_plugins()
    return load_cfg(str(path))


def expect_refusal(path: Path, *words: str) -> None:
    try:
        load(path)
    except Exception as error:  # pydantic's ValidationError, from NumtokArgs' validator
        message = str(error)
        assert all(word in message for word in words), message
        return
    raise AssertionError(f"{path.name}: the config was accepted")


def the_numtok_plugin() -> Any:
    from axolotl.integrations.base import PluginManager

    return PluginManager.get_instance().plugins[PLUGIN]


def train(path: Path) -> tuple[Any, list[dict[str, float]], float]:
    """Axolotl's own setup (datasets, model, tokenizer, trainer, the plugins' hooks), then three
    steps; also CE + 0.3·NTL of the whole data set at the initial weights, by numtok."""
    from axolotl.common.datasets import load_datasets
    from axolotl.train import setup_model_and_trainer

    from numtok import NumberVocab, cross_entropy_with_ntl

    cfg = load(path)
    dataset_meta = load_datasets(cfg=cfg)
    trainer, model, tokenizer, _, _ = setup_model_and_trainer(cfg, dataset_meta)
    data = trainer.train_dataset
    assert len(data) == len(TEXTS)
    batch = trainer.data_collator([data[i] for i in range(len(data))])
    vocab = NumberVocab.from_tokenizer(tokenizer, vocab_size=model.config.vocab_size)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        expected = cross_entropy_with_ntl(logits.logits, batch["labels"], vocab, shift=True)
    assert expected.ntl > 0
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    return trainer, logs, float(expected.loss)


def forward_of(trainer: Any) -> str:
    """The module of the causal LM class's forward (Liger's plugin replaces it)."""
    model = trainer.model
    model = model.get_base_model() if hasattr(model, "get_base_model") else model
    return type(model).forward.__module__


def check_logs(logs: list[dict[str, float]], first_loss: float, weight: float = 0.3) -> None:
    assert len(logs) == 3, logs
    assert logs[0]["loss"] == pytest_approx(first_loss), (logs[0], first_loss)
    for entry in logs:
        assert entry["ntl"] > 0, entry
        assert entry["loss"] == pytest_approx(entry["ce"] + weight * entry["ntl"]), entry
    assert logs[2]["loss"] < logs[0]["loss"], logs  # it trains


def pytest_approx(value: float) -> Any:
    class Approx:
        def __eq__(self, other: object) -> bool:
            return isinstance(other, float) and math.isclose(other, value, abs_tol=2e-4)

        def __repr__(self) -> str:
            return f"{value} ± 2e-4"

    return Approx()


def main() -> None:
    work = Path(sys.argv[1])
    model_dir, data = write_model_and_data(work)
    config = lambda name, **settings: write_config(work, name, model_dir, data, **settings)  # noqa: E731

    # Validation: the keys are typed by NumtokArgs, what NTL cannot compose with is refused.
    cfg = load(config("keys", ntl_weight=0.5, ntl_kind="mse"))
    assert (cfg.ntl_weight, cfg.ntl_kind, cfg.ntl_reweigh) == (0.5, "mse", False), cfg
    expect_refusal(config("bad-kind", ntl_kind="wass"), "ntl_kind")
    expect_refusal(config("bad-weight", ntl_weight=-1), "ntl_weight")
    expect_refusal(config("misspelt", ntl_wieght=0.5), "unknown NumtokPlugin key", "ntl_wieght")
    expect_refusal(config("dpo", rl="dpo"), "rl: dpo", "supervised fine-tuning")
    expect_refusal(config("eaft", use_eaft=True), "use_eaft", "EAFT")
    liger = {"plugins": [LIGER, PLUGIN], "liger_fused_linear_cross_entropy": True}
    expect_refusal(config("liger-reweigh", ntl_reweigh=True, **liger), "ntl_reweigh", "Liger")
    print("SCENARIO validation ok", flush=True)

    # Axolotl's cross-entropy: numtok's NTLossForTrainer attached to the AxolotlTrainer.
    trainer, logs, first_loss = train(config("attach"))
    assert the_numtok_plugin().route == "attach"
    assert type(trainer).__name__ == "AxolotlTrainer", type(trainer)
    assert forward_of(trainer).startswith("transformers."), forward_of(trainer)
    check_logs(logs, first_loss)
    full_grad_norm = logs[0]["grad_norm"]
    print(f"SCENARIO attach ok {json.dumps(logs[0])}", flush=True)

    # Two micro-batches per step, and logits-free: the step's loss is still the whole batch's.
    accumulated = {"micro_batch_size": len(TEXTS) // 2, "gradient_accumulation_steps": 2}
    trainer, logs, first_loss = train(config("accumulated", ntl_logits_free=True, **accumulated))
    check_logs(logs, first_loss)
    print(f"SCENARIO attach-accumulated-logits-free ok {json.dumps(logs[0])}", flush=True)

    # The same with LoRA (a PeftModel in the trainer).
    lora = {"adapter": "lora", "lora_r": 4, "lora_alpha": 8, "lora_target_linear": True}
    # Axolotl's own LoRA kernels allocate on CUDA: off on CPU.
    lora |= {"lora_mlp_kernel": False, "lora_qkv_kernel": False, "lora_o_kernel": False}
    trainer, logs, first_loss = train(config("attach-lora", **lora))
    assert type(trainer.model).__name__.startswith("Peft"), type(trainer.model)
    check_logs(logs, first_loss)
    print(f"SCENARIO attach-lora ok {json.dumps(logs[0])}", flush=True)

    # Axolotl's Liger plugin patches LlamaForCausalLM's forward (fused linear cross-entropy,
    # no logits; global to the class, so this runs after the others): NTL from the number head.
    liger_settings = {**liger, "liger_rms_norm": False, "liger_glu_activation": False}
    liger_settings["liger_rope"] = False
    trainer, logs, first_loss = train(config("liger", **liger_settings))
    assert the_numtok_plugin().route == "model"
    assert forward_of(trainer).startswith("liger_kernel."), forward_of(trainer)
    check_logs(logs, first_loss)
    # The same weights and batch as the run without Liger: the same gradient.
    assert math.isclose(logs[0]["grad_norm"], full_grad_norm, rel_tol=1e-5), logs[0]
    print(f"SCENARIO liger ok {json.dumps(logs[0])}", flush=True)

    trainer, logs, first_loss = train(config("liger-lora", **liger_settings, **lora))
    assert forward_of(trainer).startswith("liger_kernel."), forward_of(trainer)
    check_logs(logs, first_loss)
    print(f"SCENARIO liger-lora ok {json.dumps(logs[0])}", flush=True)

    # An ImportError while the plugin's module loads (here: numtok.hf hidden, numtok itself
    # imported): Axolotl's PluginManager would log it and train on without NTL; the plugin
    # raises it again as a RuntimeError, which stops load_cfg.
    for name in [
        name
        for name in sys.modules
        if name.startswith(("numtok.hf", "numtok.integrations.axolotl"))
    ]:
        del sys.modules[name]
    sys.modules["numtok.hf"] = None  # type: ignore[assignment]  # `from numtok.hf import` fails
    try:
        load(config("broken"))
    except RuntimeError as error:
        assert "Hugging Face routes do not import" in str(error), error
    else:
        raise AssertionError("an ImportError in the plugin was swallowed")
    del sys.modules["numtok.hf"]
    # What the plugin cannot catch: a plugin module that is not there at all. Axolotl logs the
    # error, trains on and drops the ntl_* keys (the docs say so).
    cfg = load(config("missing", plugins=["numtok.integrations.absent.NumtokPlugin"]))
    assert cfg.ntl_weight is None, cfg
    print("SCENARIO loud ok", flush=True)


if __name__ == "__main__":
    main()
