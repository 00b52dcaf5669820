"""NTLossForTrainer(logits_free=True): CE + NTL from the final hidden states and the output
layer's weight, for every family of causal LM, exactly as from the logits; what it cannot compute
exactly is refused by name. (Gradient accumulation: test_hf.py; DDP: test_hf_distributed.py.)"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import transformers
from transformers import Trainer
from transformers.modeling_outputs import CausalLMOutput

from numtok.hf import NTLossForTrainer, patch_model, unpatch_model
from numtok.hf._head import check_bypass_is_exact

from _hf_tiny import (
    EXAMPLES,
    build_dataset,
    build_model,
    build_tokenizer,
    collate,
    gradient_recorder,
    max_relative_difference,
    training_args,
)

TOLERANCE = 1e-5
NTL_WEIGHT = 1.0

#: name -> (config class, model class, settings besides the common ones). Phi's output layer
#: has a bias; Gemma, Gemma 2, Cohere and GPT-2 tie it to the input embeddings; Granite divides
#: the logits by logits_scaling and Cohere multiplies them by logit_scale; Gemma 2 soft-caps them
#: (final_logit_softcapping), which the loss applies in the logits-free path.
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama-tied": ("LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": True}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 8}),
    "gemma2-uncapped": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {"head_dim": 8, "final_logit_softcapping": None},
    ),
    # A cap of 0.5 on a tiny model's logits (spread about 1) changes every one of them.
    "gemma2-capped": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {"head_dim": 8, "final_logit_softcapping": 0.5},
    ),
    "phi": ("PhiConfig", "PhiForCausalLM", {}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {"logits_scaling": 4.0}),
    "cohere": ("CohereConfig", "CohereForCausalLM", {"logit_scale": 0.5}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {}),
}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer()


def build_family(name: str, tokenizer: Any, **overrides: Any) -> Any:
    config_class, model_class, settings = FAMILIES[name]
    special = {
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.eos_token_id,
    }
    if name == "gpt2":
        sizes = {"n_embd": 16, "n_layer": 1, "n_head": 2, "n_positions": 64}
    else:
        sizes = {
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 64,
        }
    if not hasattr(transformers, config_class):  # Qwen3: transformers 4.51 and later
        pytest.skip(f"transformers {transformers.__version__} has no {config_class}")
    config = getattr(transformers, config_class)(
        vocab_size=len(tokenizer), **sizes, **special, **{**settings, **overrides}
    )
    torch.manual_seed(0)
    return getattr(transformers, model_class)(config)


def trainer_for(
    tokenizer: Any, model: Any, output_dir: Path, recorder: Any = None, **args: Any
) -> Trainer:
    return Trainer(
        model=model,
        args=training_args(output_dir, **args),
        train_dataset=build_dataset(tokenizer),
        data_collator=lambda features: collate(features, tokenizer.pad_token_id),
        callbacks=[recorder] if recorder is not None else [],
    )


def one_step(
    tokenizer: Any, model: Any, output_dir: Path, *, logits_free: bool, **args: Any
) -> tuple[dict[str, torch.Tensor], dict[str, float], Trainer]:
    """One optimizer step on all examples: the gradients, the first log and the trainer."""
    recorder = gradient_recorder()
    trainer = trainer_for(tokenizer, model, output_dir, recorder, **args)
    NTLossForTrainer(tokenizer, ntl_weight=NTL_WEIGHT, logits_free=logits_free).attach(trainer)
    trainer.train()
    return recorder.gradients[0], trainer.state.log_history[0], trainer


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_gives_the_gradients_of_the_logits_path(
    tokenizer: Any, tmp_path: Path, family: str
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # eager attention, configuration notes
        reference, reference_log, _ = one_step(
            tokenizer, build_family(family, tokenizer), tmp_path, logits_free=False
        )
        gradients, log, _ = one_step(
            tokenizer, build_family(family, tokenizer), tmp_path, logits_free=True
        )
    assert max_relative_difference(gradients, reference) < TOLERANCE
    for key in ("loss", "ce", "ntl"):
        assert log[key] == pytest.approx(reference_log[key], rel=TOLERANCE)


def test_bfloat16_autocast_runs_the_loss_in_bfloat16(tokenizer: Any, tmp_path: Path) -> None:
    """Trainer(bf16=True) on a float32 model: the output layer would have run under autocast in
    bfloat16, and so does the logits-free loss. Both paths round the logits to bfloat16."""
    runs = [
        one_step(tokenizer, build_model(tokenizer), tmp_path, logits_free=free, bf16=True)
        for free in (False, True)
    ]
    (reference, reference_log, _), (gradients, log, _) = runs
    assert max_relative_difference(gradients, reference) < 2e-2
    assert log["loss"] == pytest.approx(reference_log["loss"], rel=1e-2)


def test_evaluation_and_generate_get_the_logits(tokenizer: Any, tmp_path: Path) -> None:
    _, _, trainer = one_step(tokenizer, build_model(tokenizer), tmp_path, logits_free=True)
    model = trainer.model
    batch = collate(build_dataset(tokenizer), tokenizer.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"]).logits
    assert logits.shape == (*batch["input_ids"].shape, len(tokenizer))
    # Outside a training step the output layer computes logits even when recording gradients.
    assert model(input_ids=batch["input_ids"]).logits.shape[-1] == len(tokenizer)
    generated = model.generate(batch["input_ids"][:1, :3], max_new_tokens=2, do_sample=False)
    assert generated.shape == (1, 5)
    metrics = trainer.evaluate(eval_dataset=build_dataset(tokenizer))
    assert metrics["eval_ce"] > 0 and metrics["eval_ntl"] > 0
    assert "forward" not in vars(model.get_output_embeddings())  # the bypass is gone


def test_trl_sft_trainer(tokenizer: Any, tmp_path: Path) -> None:
    # TRL's routes need TRL and datasets: absent where TRL cannot install (make test-versions'
    # floors, whose transformers is below TRL's own floor).
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")

    data = datasets.Dataset.from_list([{"prompt": p, "completion": a} for p, a in EXAMPLES])

    def sft(logits_free: bool) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        recorder = gradient_recorder()
        args = trl.SFTConfig(
            **training_args(tmp_path).to_dict() | {"max_length": 64, "bf16": False},
        )
        # Through TRL's compute_loss_func (without it attach() takes TRL's fused-head route,
        # logits-free either way: test_hf_trl.py).
        loss_fn = NTLossForTrainer(tokenizer, ntl_weight=NTL_WEIGHT, logits_free=logits_free)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # TRL deprecates compute_loss_func
            trainer = trl.SFTTrainer(
                model=build_model(tokenizer),
                args=args,
                train_dataset=data,
                processing_class=tokenizer,
                callbacks=[recorder],
                compute_loss_func=loss_fn,
            )
        loss_fn.attach(trainer)
        trainer.train()
        return recorder.gradients[0], trainer.state.log_history[0]

    (reference, reference_log), (gradients, log) = sft(False), sft(True)
    assert max_relative_difference(gradients, reference) < TOLERANCE
    assert log["ntl"] == pytest.approx(reference_log["ntl"], rel=TOLERANCE)
    assert log["mean_token_accuracy"] == reference_log["mean_token_accuracy"]


# ---------------------------------------------------------------------------------- refusals


def test_the_soft_cap_is_the_losses_during_a_step_and_the_models_otherwise(
    tokenizer: Any, tmp_path: Path
) -> None:
    """Gemma 2 with its soft cap: the cap changes the gradients (so the family test above can
    fail), and after a logits-free step the configuration holds it again and evaluation's
    logits are capped."""
    capped, _, _ = one_step(
        tokenizer, build_family("gemma2-capped", tokenizer), tmp_path, logits_free=False
    )
    uncapped, _, _ = one_step(
        tokenizer, build_family("gemma2-uncapped", tokenizer), tmp_path, logits_free=False
    )
    assert max_relative_difference(capped, uncapped) > 0.01
    _, _, trainer = one_step(
        tokenizer, build_family("gemma2-capped", tokenizer), tmp_path, logits_free=True
    )
    assert trainer.model.config.final_logit_softcapping == 0.5
    with torch.no_grad():
        logits = trainer.model(input_ids=torch.arange(6)[None]).logits
    assert logits.abs().max() <= 0.5


class _TinyLM(torch.nn.Module):
    """A duck-typed causal LM whose logits are ``post(lm_head(embed(ids)))``."""

    def __init__(self, post: Any, *, bias: bool, head: Any = None, **settings: Any) -> None:
        super().__init__()
        self.config = SimpleNamespace(**settings)
        self.embed = torch.nn.Embedding(12, 4)
        self.lm_head = head if head is not None else torch.nn.Linear(4, 12, bias=bias)
        self.post = post

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.embed

    def get_output_embeddings(self) -> Any:
        return self.lm_head

    def forward(self, input_ids: torch.Tensor) -> CausalLMOutput:
        return CausalLMOutput(logits=self.post(self.lm_head(self.embed(input_ids))))


def _logits(outputs: Any) -> torch.Tensor:
    return outputs.logits  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("post", "bias", "settings", "match"),
    [
        (lambda x: 2.0 * x, False, {"logit_scale": 2.0}, None),  # exact: accepted
        (lambda x: 2.0 * x, True, {"logit_scale": 2.0}, r"sets logit_scale=2.0"),
        (lambda x: 5 * torch.tanh(x / 5), False, {}, "transforms the output layer's result"),
        (lambda x: x[..., :10], False, {"unpadded_vocab_size": 10}, "unpadded_vocab_size=10"),
    ],
    ids=["scale", "scale-with-bias", "unnamed-soft-cap", "sliced-vocabulary"],
)
def test_the_probe_refuses_what_the_hidden_states_cannot_give(
    post: Any, bias: bool, settings: dict[str, Any], match: str | None
) -> None:
    model = _TinyLM(post, bias=bias, **settings).train()
    if match is None:
        check_bypass_is_exact(model, model.lm_head, _logits)
    else:
        with pytest.raises(ValueError, match=match):
            check_bypass_is_exact(model, model.lm_head, _logits)
    assert model.training and "forward" not in vars(model.lm_head)


def test_an_output_layer_that_is_not_linear_is_refused(tokenizer: Any, tmp_path: Path) -> None:
    model = build_model(tokenizer)
    model.lm_head = torch.nn.Sequential(model.lm_head)  # as an adapter would wrap it
    with pytest.raises(ValueError, match=r"plain torch.nn.Linear.*Sequential"):
        NTLossForTrainer(tokenizer, logits_free=True).attach(
            trainer_for(tokenizer, model, tmp_path)
        )


def test_tensor_parallelism_is_refused_naming_its_settings(tokenizer: Any, tmp_path: Path) -> None:
    trainer = trainer_for(tokenizer, build_model(tokenizer), tmp_path)
    vars(trainer)["get_tp_size"] = lambda: 2  # tp_plan, or DeepSpeed's autotp_size, set to 2
    match = (
        r"tensor parallelism over 2 ranks \(.*tp_plan.*DeepSpeed's tensor_parallel.autotp_size"
        r"\).*use logits_free=False.*ZeRO-3 or FSDP2"
    )
    with pytest.raises(ValueError, match=match):
        NTLossForTrainer(tokenizer, logits_free=True).attach(trainer)
    assert "forward" not in vars(trainer.model)  # refused before the model was patched


def test_fsdp_is_accepted_the_loss_being_computed_inside_the_forward(
    tokenizer: Any, tmp_path: Path
) -> None:
    """FSDP gathers the output layer's weight during the model's forward, where the attached
    loss reads it (the two-process FSDP2 test is in test_hf_fsdp.py)."""
    trainer = trainer_for(tokenizer, build_model(tokenizer), tmp_path)
    vars(trainer)["is_fsdp_enabled"] = True
    NTLossForTrainer(tokenizer, logits_free=True).attach(trainer)
    assert "forward" in vars(trainer.model)


def test_the_training_forward_computes_the_loss_and_returns_no_logits(
    tokenizer: Any, tmp_path: Path
) -> None:
    trainer = trainer_for(tokenizer, build_model(tokenizer), tmp_path)
    NTLossForTrainer(tokenizer, ntl_weight=NTL_WEIGHT, logits_free=True).attach(trainer)
    batch = collate(build_dataset(tokenizer), tokenizer.pad_token_id)
    trainer.model.train()
    loss, outputs = trainer.compute_loss(trainer.model, dict(batch), return_outputs=True)
    assert outputs.logits is None and outputs.loss is loss and loss.requires_grad
    reference = NTLossForTrainer(tokenizer, ntl_weight=NTL_WEIGHT)
    with torch.no_grad():
        logits = trainer.model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    torch.testing.assert_close(loss.detach(), reference(logits, batch["labels"]))


def test_a_forward_replaced_after_attach_falls_back_to_the_logits_with_a_warning(
    tokenizer: Any, tmp_path: Path
) -> None:
    """Something that replaces the model's forward after attach() (Liger's kernels do, when
    training starts) leaves the loss to the logits: the same gradients, and one warning."""
    reference, reference_log, _ = one_step(
        tokenizer, build_model(tokenizer), tmp_path, logits_free=False
    )
    model = build_model(tokenizer)
    trainer = trainer_for(tokenizer, model, tmp_path, recorder := gradient_recorder())
    NTLossForTrainer(tokenizer, ntl_weight=NTL_WEIGHT, logits_free=True).attach(trainer)
    vars(model)["forward"] = type(model).forward.__get__(model)
    with pytest.warns(UserWarning, match="did not compute the loss in its forward") as caught:
        trainer.train()
    assert sum("did not compute the loss" in str(w.message) for w in caught) == 1
    assert max_relative_difference(recorder.gradients[0], reference) < TOLERANCE
    assert trainer.state.log_history[0]["ntl"] == pytest.approx(reference_log["ntl"], rel=1e-5)


@pytest.mark.parametrize("first", ["patch_model", "attach"])
def test_one_model_gets_one_loss_in_its_forward(tokenizer: Any, tmp_path: Path, first: str) -> None:
    model = build_model(tokenizer)
    trainer = trainer_for(tokenizer, model, tmp_path)
    loss_fn = NTLossForTrainer(tokenizer, logits_free=True)
    if first == "patch_model":
        patch_model(model, tokenizer)
        with pytest.raises(ValueError, match=r"patched already .*by patch_model"):
            loss_fn.attach(trainer)
    else:
        loss_fn.attach(trainer)
        with pytest.raises(ValueError, match=r"patched already .*by NTLossForTrainer"):
            patch_model(model, tokenizer)
        with pytest.raises(
            ValueError,
            match=r"not patched \(patch_model\); its forward was patched by NTLossForTrainer",
        ):
            unpatch_model(model)


def test_logits_free_must_be_a_bool(tokenizer: Any) -> None:
    with pytest.raises(TypeError, match="logits_free must be a bool, got 'yes'"):
        NTLossForTrainer(tokenizer, logits_free="yes")  # type: ignore[arg-type]
    assert "logits_free=True" in repr(NTLossForTrainer(tokenizer, logits_free=True))
