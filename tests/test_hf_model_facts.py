"""The record both Hugging Face entry points read a model into (``numtok.hf._model_facts``): its
facts on tied and untied output layers, a padded one, a soft-capped model, a PEFT-wrapped one,
a model without an output layer and a trainer's parallelism; and ``patch_model`` and
``NTLossForTrainer.attach`` (TRL's route too) building it with the one ``model_facts``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import transformers
from transformers import Trainer

import numtok.hf.patch
import numtok.hf.trainer
from numtok.hf import NTLossForTrainer, patch_model
from numtok.hf._model_facts import ModelFacts, model_facts

from _hf_tiny import build_model, build_tokenizer, training_args


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer()


def _llama(tokenizer: Any, *, tied: bool, vocab_size: int | None = None) -> Any:
    model = build_model(tokenizer, vocab_size=vocab_size)
    if tied:
        model.config.tie_word_embeddings = True
        model.tie_weights()
    return model


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_the_output_layer_tied_or_not(tokenizer: Any, tied: bool) -> None:
    model = _llama(tokenizer, tied=tied)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    facts = model_facts(model)
    assert facts.head is model.lm_head and facts.output_layer() is model.lm_head
    assert facts.columns == len(tokenizer)
    assert facts.softcap is None and facts.is_encoder_decoder is False
    assert facts.model is facts.causal_lm is facts.loss_model is model
    assert not facts.on_trl and facts.tp_size == facts.replicas == 1
    # The probes pass on both, and carry the record's (absent) soft cap.
    assert facts.bypass(lambda outputs: outputs["logits"]).softcap is None
    assert facts.capture().decoder is model.model
    with pytest.raises(dataclasses.FrozenInstanceError):
        facts.columns = 1  # type: ignore[misc]


def test_a_padded_output_layer_gives_its_own_rows(tokenizer: Any) -> None:
    facts = model_facts(_llama(tokenizer, tied=False, vocab_size=64))
    assert facts.columns == 64 != len(tokenizer)


def test_a_soft_cap_is_read_from_the_configuration(tokenizer: Any) -> None:
    config = transformers.Gemma2Config(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=64,
        final_logit_softcapping=30.0,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = transformers.Gemma2ForCausalLM(config)
    facts = model_facts(model)
    assert facts.softcap == 30.0
    assert facts.head is model.lm_head and facts.columns == len(tokenizer)
    # The bypass hands the cap to the loss; the probes ran with it and left it on the model.
    assert facts.bypass(lambda outputs: outputs["logits"]).softcap == 30.0
    facts.capture()
    assert model.config.final_logit_softcapping == 30.0


def test_a_peft_model_is_read_through_to_its_base(tokenizer: Any, tmp_path: Path) -> None:
    peft = pytest.importorskip("peft")
    base = build_model(tokenizer)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    wrapped = peft.get_peft_model(base, config)
    facts = model_facts(wrapped)
    assert facts.model is wrapped and facts.causal_lm is base
    assert facts.head is base.lm_head and facts.columns == len(tokenizer)
    # Without TRL's route the wrapper's forward computes the loss; on it, the base's.
    assert facts.loss_model is wrapped
    assert dataclasses.replace(facts, on_trl=True).loss_model is base
    trainer = Trainer(model=wrapped, args=training_args(tmp_path))
    assert model_facts(trainer.model, trainer).loss_model is wrapped


def test_a_model_without_an_output_layer(tokenizer: Any) -> None:
    model = torch.nn.Linear(4, 4)
    facts = model_facts(model)
    assert facts.head is None and facts.columns is None
    assert facts.softcap is None and facts.is_encoder_decoder is None
    with pytest.raises(ValueError, match=r"Linear.get_output_embeddings\(\) returns None"):
        facts.output_layer()
    model.config = SimpleNamespace(is_encoder_decoder=True)  # type: ignore[assignment]
    assert model_facts(model).is_encoder_decoder is True


def test_the_trainers_parallelism(tokenizer: Any) -> None:
    model = build_model(tokenizer)
    trainer = SimpleNamespace(model=model, get_tp_size=lambda: 2, get_cp_size=lambda: 3)
    facts = model_facts(model, trainer)
    assert facts.tp_size == 2 and facts.replicas == 6  # no get_sp_size: 1
    assert not facts.on_trl


def _spy(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, calls: list[Any]) -> None:
    """Record the arguments of ``module.name`` (and what it returned), then call it."""
    original = getattr(module, name)

    def spy(*args: Any) -> Any:
        result = original(*args)
        calls.append((module.__name__, args, result))
        return result

    monkeypatch.setattr(module, name, spy)


def test_both_entry_points_build_the_record_with_model_facts(
    tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert numtok.hf.patch.model_facts is numtok.hf.trainer.model_facts is model_facts
    calls: list[Any] = []
    for module in (numtok.hf.patch, numtok.hf.trainer):
        _spy(monkeypatch, module, "model_facts", calls)
    model = build_model(tokenizer)
    patch_model(model, tokenizer)
    trainer = Trainer(model=build_model(tokenizer), args=training_args(tmp_path))
    NTLossForTrainer(tokenizer, logits_free=True).attach(trainer)
    assert [(name, args) for name, args, _ in calls] == [
        ("numtok.hf.patch", (model,)),
        ("numtok.hf.trainer", (trainer.model, trainer)),
    ]
    assert all(isinstance(facts, ModelFacts) for _, _, facts in calls)


def test_trls_route_is_built_from_the_record_attach_read(
    tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    peft = pytest.importorskip("peft")
    base = build_model(tokenizer)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    settings = training_args(tmp_path).to_dict() | {"max_length": 64, "bf16": False}
    trainer = trl.SFTTrainer(
        model=peft.get_peft_model(base, config),
        args=trl.SFTConfig(**settings),
        train_dataset=datasets.Dataset.from_list([{"prompt": "a=", "completion": "12"}]),
        processing_class=tokenizer,
    )
    facts_calls: list[Any] = []
    route_calls: list[Any] = []
    _spy(monkeypatch, numtok.hf.trainer, "model_facts", facts_calls)
    _spy(monkeypatch, numtok.hf.trainer, "trl_route", route_calls)
    NTLossForTrainer(tokenizer, cross_entropy="model").attach(trainer)
    [(_, _, facts)] = facts_calls
    [(_, (_, given, *_), route)] = route_calls
    assert given is facts and facts.on_trl
    assert facts.causal_lm is base is facts.loss_model is route.causal_lm
    assert route.head is base.lm_head
