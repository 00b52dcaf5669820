"""NTLossForTrainer.attach on TRL >= 1.16's SFTTrainer without compute_loss_func: with TRL's
fused LM head computing the cross-entropy (``cross_entropy="model"``, NTL from the number head
beside it) and with numtok's logits-free pass computing it (``"numtok"``, the CPU default):
exact under gradient accumulation and equal to the compute_loss_func route (every gradient);
one model forward per micro-batch, no full logits, no FutureWarning; TRL's entropy and token
accuracy logged as TRL alone logs them; ce/ntl in the logs; evaluation; PEFT LoRA; what is
refused."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from numtok.hf import NTLossForTrainer

from _hf_tiny import (
    EXAMPLES,
    build_model,
    build_tokenizer,
    gradient_recorder,
    max_relative_difference,
    training_args,
)

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

NTL_WEIGHT = 0.5
TOLERANCE = 1e-5
ROUTES = ["model", "numtok"]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer()


def echo_model(tokenizer: Any) -> Any:
    """The tiny Llama with its output layer the input embedding times 30: it mostly predicts
    its input token, so on runs of one digit its token accuracy is far from 0."""
    model = build_model(tokenizer)
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight * 30)
    return model


def _data(repeated: bool) -> Any:
    if repeated:
        answers = ["1111", "22222", "3333333", "44", "555555", "66", "77777", "8888"]
        rows = [{"prompt": "n: ", "completion": a} for a in answers]
    else:
        rows = [{"prompt": p, "completion": a} for p, a in EXAMPLES]
    return datasets.Dataset.from_list(rows)


class _Counted:
    """How often the trainer ran the decoder, and built full logits, in training calls."""

    def __init__(self, model: Any) -> None:
        self.decoder_calls = self.logits_built = 0
        model.model.register_forward_hook(self._decoder)
        model.lm_head.register_forward_hook(self._head)

    def _decoder(self, *_: Any) -> None:
        self.decoder_calls += torch.is_grad_enabled()

    def _head(self, module: Any, args: Any, output: torch.Tensor) -> None:
        self.logits_built += torch.is_grad_enabled() and output.shape[-1] == module.out_features


def sft(
    tokenizer: Any,
    tmp_path: Path,
    micro_batch: int,
    steps: int,
    route: str | None,
    *,
    model: Any = None,
    repeated: bool = False,
    **config: Any,
) -> tuple[Any, dict[str, torch.Tensor], list[warnings.WarningMessage], _Counted]:
    """One SGD step of TRL's SFTTrainer; ``route`` None: TRL alone, ``"compute_loss_func"``:
    numtok through TRL's deprecated hook (today's route), else attach(cross_entropy=route)."""
    model = build_model(tokenizer) if model is None else model
    counted = _Counted(model)
    recorder = gradient_recorder()
    settings = training_args(
        tmp_path, per_device_train_batch_size=micro_batch, gradient_accumulation_steps=steps
    ).to_dict() | {"max_length": 64, "bf16": False, **config}
    loss_fn = NTLossForTrainer(tokenizer, ntl_weight=NTL_WEIGHT)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = trl.SFTTrainer(
            model=model,
            args=trl.SFTConfig(**settings),
            train_dataset=_data(repeated),
            processing_class=tokenizer,
            callbacks=[recorder],
            compute_loss_func=loss_fn if route == "compute_loss_func" else None,
        )
        if route == "compute_loss_func":
            loss_fn.attach(trainer)
        elif route is not None:
            NTLossForTrainer(tokenizer, ntl_weight=NTL_WEIGHT, cross_entropy=route).attach(trainer)
        trainer.train()
    return trainer, recorder.gradients[0], caught, counted


def _future_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]


@pytest.mark.parametrize("route", ROUTES)
def test_exact_under_accumulation_and_equal_to_the_compute_loss_func_route(
    tokenizer: Any, tmp_path: Path, route: str
) -> None:
    reference, reference_grads, reference_warnings, _ = sft(
        tokenizer, tmp_path, len(EXAMPLES), 1, "compute_loss_func"
    )
    assert any("compute_loss_func" in w for w in _future_warnings(reference_warnings))
    full, full_grads, full_warnings, _ = sft(tokenizer, tmp_path, len(EXAMPLES), 1, route)
    accumulated, grads, _, counted = sft(tokenizer, tmp_path, 2, 4, route)
    assert not _future_warnings(full_warnings)
    assert max_relative_difference(full_grads, reference_grads) < TOLERANCE
    assert max_relative_difference(grads, full_grads) < TOLERANCE
    # One forward per micro-batch (the compute_loss_func route runs two), no full logits.
    assert counted.decoder_calls == 4 and counted.logits_built == 0
    expected = reference.state.log_history[0]
    for log in (full.state.log_history[0], accumulated.state.log_history[0]):
        for key in ("loss", "ce", "ntl"):
            assert log[key] == pytest.approx(expected[key], rel=TOLERANCE)
        assert log["loss"] == pytest.approx(log["ce"] + NTL_WEIGHT * log["ntl"], rel=TOLERANCE)


def test_trl_alone_is_exact_under_accumulation(tokenizer: Any, tmp_path: Path) -> None:
    """TRL 1.16 without numtok: its fused head divides by ``num_items_in_batch``, so 4
    micro-batches of 2 give one batch of 8's gradients (the baseline the routes above add to;
    docs/trainer.md says what we found when an earlier probe suggested otherwise)."""
    _, full, _, _ = sft(tokenizer, tmp_path, len(EXAMPLES), 1, None)
    _, accumulated, _, _ = sft(tokenizer, tmp_path, 2, 4, None)
    assert max_relative_difference(accumulated, full) < TOLERANCE


@pytest.mark.parametrize("route", ROUTES)
def test_trls_metrics_are_logged_as_trl_alone_logs_them(
    tokenizer: Any, tmp_path: Path, route: str
) -> None:
    alone, _, _, _ = sft(
        tokenizer, tmp_path, 4, 2, None, model=echo_model(tokenizer), repeated=True
    )
    attached, _, _, _ = sft(
        tokenizer, tmp_path, 4, 2, route, model=echo_model(tokenizer), repeated=True
    )
    expected, log = alone.state.log_history[0], attached.state.log_history[0]
    assert expected["mean_token_accuracy"] > 0.3
    for key in ("entropy", "mean_token_accuracy", "num_tokens"):
        assert log[key] == pytest.approx(expected[key], rel=1e-5), key
    assert log["ce"] == pytest.approx(expected["loss"], rel=1e-5)  # TRL's loss is its CE


@pytest.mark.parametrize("route", ROUTES)
def test_the_cpu_default_and_which_head_computes_the_cross_entropy(
    tokenizer: Any, tmp_path: Path, route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cross_entropy="model"`` runs TRL's tiled log-probability kernel in training, ``"numtok"``
    (what ``"auto"`` chooses on CPU) does not: numtok's pass computes the loss."""
    import trl.trainer.utils as trl_utils

    kernel = trl_utils._ChunkedLogProbFunction
    calls: list[bool] = []

    class Counted(kernel):  # type: ignore[misc, valid-type]
        @staticmethod
        def forward(ctx: Any, *args: Any) -> Any:
            calls.append(torch.is_grad_enabled() or ctx.needs_input_grad[1])
            return kernel.forward(ctx, *args)

    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", Counted)
    _, grads, _, _ = sft(tokenizer, tmp_path, 4, 2, route)
    _, auto_grads, _, _ = sft(tokenizer, tmp_path, 4, 2, "auto")
    assert max_relative_difference(auto_grads, grads) < TOLERANCE
    trl_calls = 2 if route == "model" else 0
    assert len(calls) == trl_calls  # "auto" (numtok on CPU) adds none


@pytest.mark.parametrize("route", ROUTES)
def test_evaluation_adds_ntl_and_its_terms(tokenizer: Any, tmp_path: Path, route: str) -> None:
    data = _data(repeated=False)
    results = []
    for chosen in ("compute_loss_func", route):
        loss_fn = NTLossForTrainer(tokenizer, ntl_weight=NTL_WEIGHT)
        settings = training_args(tmp_path).to_dict() | {
            "max_length": 64,
            "bf16": False,
            "per_device_eval_batch_size": 3,
        }
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            trainer = trl.SFTTrainer(
                model=build_model(tokenizer),
                args=trl.SFTConfig(**settings),
                train_dataset=data,
                eval_dataset=data,
                processing_class=tokenizer,
                compute_loss_func=loss_fn if chosen == "compute_loss_func" else None,
            )
        if chosen == "compute_loss_func":
            loss_fn.attach(trainer)
        else:
            NTLossForTrainer(tokenizer, ntl_weight=NTL_WEIGHT, cross_entropy=route).attach(trainer)
        results.append(trainer.evaluate())
    reference, metrics = results
    for key in ("eval_ce", "eval_ntl"):
        assert metrics[key] == pytest.approx(reference[key], rel=1e-5)
    assert metrics["eval_entropy"] == pytest.approx(reference["eval_entropy"], rel=1e-5)


@pytest.mark.parametrize("route", ROUTES)
def test_peft_lora(tokenizer: Any, tmp_path: Path, route: str) -> None:
    """A LoRA-wrapped model (q and v projections): the adapters' gradients equal the
    compute_loss_func route's, also accumulated."""
    peft = pytest.importorskip("peft")

    def lora_model() -> Any:
        config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
        model = peft.get_peft_model(build_model(tokenizer), config)
        torch.manual_seed(1)
        for name, parameter in model.named_parameters():
            if "lora_B" in name:  # non-zero, so that lora_A gets a gradient too
                torch.nn.init.normal_(parameter, std=0.1)
        return model

    _, reference, _, _ = sft(
        tokenizer, tmp_path, len(EXAMPLES), 1, "compute_loss_func", model=lora_model()
    )
    _, grads, _, _ = sft(tokenizer, tmp_path, 2, 4, route, model=lora_model())
    assert reference and all("lora" in name for name in reference)
    assert max_relative_difference(grads, reference) < TOLERANCE


def test_what_it_refuses(tokenizer: Any, tmp_path: Path) -> None:
    from transformers import Trainer

    with pytest.raises(
        ValueError, match=r"cross_entropy must be one of \('auto', 'numtok', 'model'\)"
    ):
        NTLossForTrainer(tokenizer, cross_entropy="liger")
    plain = Trainer(model=build_model(tokenizer), args=training_args(tmp_path))
    with pytest.raises(
        ValueError, match="cross_entropy='model' chooses the cross-entropy on TRL's"
    ):
        NTLossForTrainer(tokenizer, cross_entropy="model").attach(plain)
    with pytest.raises(ValueError, match="loss_type='dft' would reweigh"):
        sft(tokenizer, tmp_path, 4, 2, "numtok", loss_type="dft")
