"""numtok.hf: CE + NTL through the real Hugging Face Trainer and TRL on a tiny Llama.

The central property: k micro-batches of size b give the gradients of one batch of k·b, for
cross-entropy and for NTL, within 1e-5 (float32). The data mixes answers with many, few and no
digits, so a per-micro-batch NTL mean would be off by about 10 % (checked below, so that the
exactness tests can fail).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from transformers import Trainer
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput, Seq2SeqLMOutput

from numtok import NumberVocab, cross_entropy_with_ntl, number_token_loss
from numtok.hf import NTLossForTrainer

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
NTL_WEIGHT = 1.0  # large, so that NTL's share of the gradient is large


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer()


def train_step(
    tokenizer: Any,
    output_dir: Path,
    *,
    micro_batch: int = len(EXAMPLES),
    steps: int = 1,
    ntl_weight: float = NTL_WEIGHT,
    attach: bool = True,
    dataset: list[dict[str, Any]] | None = None,
    model: Any = None,
    collator: Any = None,
    logits_free: bool = False,
    impl: str = "auto",
    **args: Any,
) -> tuple[list[dict[str, torch.Tensor]], list[dict[str, float]], Trainer]:
    """Train through the real Trainer; the gradients of every optimizer step and the logs."""
    recorder = gradient_recorder()
    loss_fn = NTLossForTrainer(tokenizer, ntl_weight=ntl_weight, logits_free=logits_free, impl=impl)
    trainer = Trainer(
        model=model if model is not None else build_model(tokenizer),
        args=training_args(
            output_dir,
            per_device_train_batch_size=micro_batch,
            gradient_accumulation_steps=steps,
            **args,
        ),
        train_dataset=dataset if dataset is not None else build_dataset(tokenizer),
        data_collator=collator or (lambda features: collate(features, tokenizer.pad_token_id)),
        compute_loss_func=loss_fn,
        callbacks=[recorder],
    )
    if attach:
        loss_fn.attach(trainer)
    trainer.train()
    return recorder.gradients, trainer.state.log_history, trainer


@pytest.fixture(scope="module")
def full_batch(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[float, Any]:
    """One batch of all examples, for NTL weights 0 (cross-entropy alone) and NTL_WEIGHT."""
    out = tmp_path_factory.mktemp("full")
    return {w: train_step(tokenizer, out, ntl_weight=w) for w in (0.0, NTL_WEIGHT)}


# ---------------------------------------------------------------------------------- exactness


@pytest.mark.parametrize(("micro_batch", "steps"), [(1, 8), (2, 4), (4, 2)])
def test_accumulated_micro_batches_give_the_full_batch_gradients(
    tokenizer: Any, full_batch: dict[float, Any], tmp_path: Path, micro_batch: int, steps: int
) -> None:
    accumulated = {
        w: train_step(tokenizer, tmp_path, micro_batch=micro_batch, steps=steps, ntl_weight=w)
        for w in (0.0, NTL_WEIGHT)
    }
    for w in (0.0, NTL_WEIGHT):
        gradients, logs, _ = accumulated[w]
        reference, reference_logs, _ = full_batch[w]
        assert max_relative_difference(gradients[0], reference[0]) < TOLERANCE
        for key in ("loss", "ce", "ntl"):
            assert logs[0][key] == pytest.approx(reference_logs[0][key], rel=TOLERANCE)
    # NTL's own gradient: the difference between CE + w·NTL and CE alone.
    ntl = {
        name: accumulated[NTL_WEIGHT][0][0][name] - accumulated[0.0][0][0][name]
        for name in accumulated[0.0][0][0]
    }
    reference_ntl = {
        name: full_batch[NTL_WEIGHT][0][0][name] - full_batch[0.0][0][0][name] for name in ntl
    }
    assert max_relative_difference(ntl, reference_ntl) < TOLERANCE


def test_logits_free_gives_the_parameters_of_the_logits_path(
    tokenizer: Any, tmp_path: Path
) -> None:
    """logits_free=True, 2 micro-batches of 2 and 1 batch of 4, against the logits path on 1
    batch of 4: the same gradients, parameters after the step and logged CE and NTL."""
    dataset = build_dataset(tokenizer, EXAMPLES[:4])  # 5, 1, 0 and 3 digits: shares differ
    runs = {
        (logits_free, micro_batch): train_step(
            tokenizer,
            tmp_path,
            micro_batch=micro_batch,
            steps=4 // micro_batch,
            dataset=dataset,
            logits_free=logits_free,
        )
        for logits_free, micro_batch in [(False, 4), (True, 4), (True, 2)]
    }
    reference, reference_logs, reference_trainer = runs[False, 4]
    expected = dict(reference_trainer.model.named_parameters())
    for micro_batch in (4, 2):
        gradients, logs, trainer = runs[True, micro_batch]
        assert max_relative_difference(gradients[0], reference[0]) < TOLERANCE
        parameters = {name: p.detach() for name, p in trainer.model.named_parameters()}
        assert max_relative_difference(parameters, expected) < TOLERANCE
        for key in ("loss", "ce", "ntl"):
            assert logs[0][key] == pytest.approx(reference_logs[0][key], rel=TOLERANCE)


def test_without_attach_accumulation_is_approximate_and_warns(
    tokenizer: Any, full_batch: dict[float, Any], tmp_path: Path
) -> None:
    with pytest.warns(UserWarning, match=r"attach\(trainer\) to make it exact"):
        gradients, logs, _ = train_step(tokenizer, tmp_path, micro_batch=2, steps=4, attach=False)
    # The data is built so that per-micro-batch NTL means are visibly wrong: the exactness tests
    # above would fail without the step-wide count.
    assert max_relative_difference(gradients[0], full_batch[NTL_WEIGHT][0][0]) > 1e-2
    assert "ce" not in logs[0]


def test_single_batch_without_attach_is_exact_and_silent(
    tokenizer: Any, full_batch: dict[float, Any], tmp_path: Path
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        gradients, _, _ = train_step(tokenizer, tmp_path, attach=False)
    assert max_relative_difference(gradients[0], full_batch[NTL_WEIGHT][0][0]) < TOLERANCE


def test_full_batch_gradients_are_the_definition(
    tokenizer: Any, full_batch: dict[float, Any]
) -> None:
    """Mean CE over the target tokens + w · mean NTL over the number positions, computed with
    F.cross_entropy and the unfused number_token_loss on the whole batch."""
    model = build_model(tokenizer)
    batch = collate(build_dataset(tokenizer), tokenizer.pad_token_id)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    labels = batch["labels"]
    vocab = NumberVocab.from_tokenizer(tokenizer)
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
    loss = ce + NTL_WEIGHT * number_token_loss(logits, labels, vocab, shift=True)
    loss.backward()
    expected = {n: p.grad for n, p in model.named_parameters()}
    assert max_relative_difference(full_batch[NTL_WEIGHT][0][0], expected) < TOLERANCE


def test_direct_call_is_cross_entropy_plus_ntl(tokenizer: Any) -> None:
    """Outside a trainer: plain means over this batch, or num_items_in_batch for CE with NTL
    weighted by the batch's share of it."""
    torch.manual_seed(1)
    batch = collate(build_dataset(tokenizer), tokenizer.pad_token_id)
    labels = batch["labels"]
    logits = torch.randn(*labels.shape, len(tokenizer), dtype=torch.float64)
    vocab = NumberVocab.from_tokenizer(tokenizer)
    loss_fn = NTLossForTrainer(vocab, ntl_weight=0.3, kind="mse")
    flat_logits, flat_labels = logits[:, :-1].reshape(-1, len(tokenizer)), labels[:, 1:].reshape(-1)
    ce_sum = F.cross_entropy(flat_logits, flat_labels, reduction="sum")
    ntl = number_token_loss(logits, labels, vocab, kind="mse", shift=True)
    targets = int((labels[:, 1:] != -100).sum())
    loss = loss_fn(CausalLMOutput(logits=logits), labels)
    torch.testing.assert_close(loss, ce_sum / targets + 0.3 * ntl, rtol=1e-12, atol=0)
    # num_items_in_batch = 4 × this batch's tokens: CE and NTL both count a quarter.
    with pytest.warns(UserWarning, match="num_items_in_batch counts more tokens"):
        loss = loss_fn({"logits": logits}, labels, num_items_in_batch=torch.tensor(4 * targets))
    torch.testing.assert_close(loss, (ce_sum / targets + 0.3 * ntl) / 4, rtol=1e-12, atol=0)
    # Outputs as a tuple (return_dict=False) or the logits themselves.
    torch.testing.assert_close(loss_fn((logits,), labels), loss_fn(logits, labels))


def test_the_exactness_check_reads_the_device_on_the_first_training_call_only(
    tokenizer: Any,
) -> None:
    """The check compares num_items_in_batch with the micro-batch's own count, a read-back from
    the device; once per loss object, on the first call with a gradient, so that training on a
    GPU does not wait for it every step."""
    batch = collate(build_dataset(tokenizer), tokenizer.pad_token_id)
    labels = batch["labels"]
    logits = torch.randn(*labels.shape, len(tokenizer), dtype=torch.float64)
    targets = int((labels[:, 1:] != -100).sum())
    loss_fn = NTLossForTrainer(NumberVocab.from_tokenizer(tokenizer), ntl_weight=0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        with torch.no_grad():  # evaluation: not checked, and the check stays ahead
            loss_fn(logits, labels, num_items_in_batch=torch.tensor(4 * targets))
        loss_fn(logits, labels, num_items_in_batch=torch.tensor(targets))  # exact: checked
        loss_fn(logits, labels, num_items_in_batch=torch.tensor(4 * targets))  # not again
    fresh = NTLossForTrainer(NumberVocab.from_tokenizer(tokenizer), ntl_weight=0.3)
    with pytest.warns(UserWarning, match="num_items_in_batch counts more tokens"):
        fresh(logits, labels, num_items_in_batch=torch.tensor(4 * targets))


# ---------------------------------------------------------------------------------- logging


def test_logs_hold_ce_and_ntl_averaged_like_the_loss(tokenizer: Any, tmp_path: Path) -> None:
    _, logs, _ = train_step(
        tokenizer, tmp_path, micro_batch=2, steps=2, max_steps=4, logging_steps=2
    )
    training_logs = [entry for entry in logs if "loss" in entry]
    assert [entry["step"] for entry in training_logs] == [2, 4]
    for entry in training_logs:
        assert list(entry)[:3] == ["loss", "ce", "ntl"]
        assert entry["ce"] > 0 and entry["ntl"] > 0
        assert entry["loss"] == pytest.approx(entry["ce"] + NTL_WEIGHT * entry["ntl"], rel=1e-5)


def test_evaluate_reports_the_eval_sets_ce_and_ntl(tokenizer: Any, tmp_path: Path) -> None:
    """eval_ce and eval_ntl are the exact means over the whole evaluation set, whatever its
    batching (3 batches of 3, 3 and 2 examples here)."""
    model = build_model(tokenizer)
    dataset = build_dataset(tokenizer)
    _, _, trainer = train_step(
        tokenizer, tmp_path, model=model, max_steps=0, per_device_eval_batch_size=3
    )
    metrics = trainer.evaluate(eval_dataset=dataset)
    test_metrics = trainer.evaluate(eval_dataset=dataset, metric_key_prefix="test")

    batch = collate(dataset, tokenizer.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    labels = batch["labels"]
    vocab = NumberVocab.from_tokenizer(tokenizer)
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
    ntl = number_token_loss(logits, labels, vocab, shift=True)
    for prefix, values in (("eval", metrics), ("test", test_metrics)):
        assert values[f"{prefix}_ce"] == pytest.approx(float(ce), rel=1e-5)
        assert values[f"{prefix}_ntl"] == pytest.approx(float(ntl), rel=1e-5)
    assert any("eval_ntl" in entry for entry in trainer.state.log_history)


# ---------------------------------------------------------------------------------- TRL, seq2seq


def test_trl_sft_trainer_through_compute_loss_func_is_exact_and_logs_ce_and_ntl(
    tokenizer: Any, tmp_path: Path
) -> None:
    """A user's ``compute_loss_func=loss_fn`` keeps TRL's deprecated route (without it attach()
    takes TRL's fused-head route: test_hf_trl.py)."""
    # TRL's routes need TRL and datasets: absent where TRL cannot install (make test-versions'
    # floors, whose transformers is below TRL's own floor).
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")

    data = datasets.Dataset.from_list([{"prompt": p, "completion": a} for p, a in EXAMPLES])

    def sft(micro_batch: int, steps: int) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        recorder = gradient_recorder()
        args = trl.SFTConfig(
            **training_args(
                tmp_path,
                per_device_train_batch_size=micro_batch,
                gradient_accumulation_steps=steps,
            ).to_dict()
            | {"max_length": 64, "bf16": False},  # TRL turns bf16 on by default, even on CPU
        )
        loss_fn = NTLossForTrainer(tokenizer, ntl_weight=NTL_WEIGHT)
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

    full, full_log = sft(len(EXAMPLES), 1)
    accumulated, log = sft(2, 4)
    assert max_relative_difference(accumulated, full) < TOLERANCE
    assert log["ce"] == pytest.approx(full_log["ce"], rel=TOLERANCE)
    assert log["ntl"] == pytest.approx(full_log["ntl"], rel=TOLERANCE)
    assert log["loss"] == pytest.approx(log["ce"] + NTL_WEIGHT * log["ntl"], rel=TOLERANCE)


def build_t5(tokenizer: Any) -> Any:
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=8,
        d_ff=16,
        d_kv=4,
        num_layers=1,
        dropout_rate=0.0,
        num_heads=2,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    return T5ForConditionalGeneration(config)


def test_encoder_decoder_with_shift_false_is_exact(tokenizer: Any, tmp_path: Path) -> None:
    """T5: the decoder reads right-shifted labels, so logits[t] predicts labels[t]."""
    model = build_t5(tokenizer)
    dataset = [
        {"input_ids": tokenizer(p)["input_ids"], "labels": tokenizer(a)["input_ids"]}
        for p, a in EXAMPLES
    ]

    def collate_seq2seq(features: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        inputs = collate(
            [{"input_ids": f["input_ids"], "labels": f["input_ids"]} for f in features]
        )
        targets = collate([{"input_ids": f["labels"], "labels": f["labels"]} for f in features])
        return {
            "input_ids": inputs["input_ids"],
            "attention_mask": inputs["attention_mask"],
            "labels": targets["labels"],
            "decoder_input_ids": model._shift_right(targets["labels"]),
        }

    def run(micro_batch: int, steps: int) -> dict[str, torch.Tensor]:
        recorder = gradient_recorder()
        trainer = Trainer(
            model=build_t5(tokenizer),
            args=training_args(
                tmp_path, per_device_train_batch_size=micro_batch, gradient_accumulation_steps=steps
            ),
            train_dataset=dataset,
            data_collator=collate_seq2seq,
            callbacks=[recorder],
        )
        NTLossForTrainer(tokenizer, ntl_weight=NTL_WEIGHT, shift=False).attach(trainer)
        trainer.train()
        return recorder.gradients[0]

    assert max_relative_difference(run(2, 4), run(len(EXAMPLES), 1)) < TOLERANCE


# ---------------------------------------------------------------------------------- compile


def _compiled_graphs_containing(op_name: str, graphs: list[Any]) -> int:
    return sum(op_name in graph.code for graph in graphs)


@pytest.mark.slow
def test_torch_compile_of_model_and_loss(
    tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trainer(torch_compile=True) compiles the model, and attach() the loss, with the
    Trainer's backend; the gradients equal the eager ones. About 20 s (aot_eager)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.registry import _COMPILER_FNS, lookup_backend
    from torch._functorch.aot_autograd import make_boxed_func

    graphs: list[Any] = []

    def record(graph: Any, example_inputs: Any) -> Any:
        graphs.append(graph)
        return make_boxed_func(graph.forward)

    # The Trainer accepts only accelerate's backend names: aot_eager, with its graphs recorded.
    lookup_backend("aot_eager")
    monkeypatch.setitem(
        _COMPILER_FNS, "aot_eager", aot_autograd(fw_compiler=record, bw_compiler=record)
    )
    torch._dynamo.reset()
    dataset = build_dataset(tokenizer) * 2
    compiled, compiled_logs, _ = train_step(
        tokenizer,
        tmp_path,
        micro_batch=4,
        steps=2,
        max_steps=2,
        dataset=dataset,
        torch_compile=True,
        torch_compile_backend="aot_eager",
    )
    torch._dynamo.reset()
    eager, eager_logs, _ = train_step(
        tokenizer, tmp_path, micro_batch=4, steps=2, max_steps=2, dataset=dataset
    )
    # The fused loss's custom op is inside a compiled graph, forward and backward.
    assert _compiled_graphs_containing("numtok.row_statistics.default", graphs) >= 1
    assert _compiled_graphs_containing("numtok.row_statistics_backward.default", graphs) >= 1
    for step in range(2):
        assert max_relative_difference(compiled[step], eager[step]) < TOLERANCE
    assert compiled_logs[1]["ntl"] == pytest.approx(eager_logs[1]["ntl"], rel=TOLERANCE)


@pytest.mark.slow
def test_torch_compile_with_inductor(tokenizer: Any, tmp_path: Path) -> None:
    """The default backend generates C++ for model and loss: about a minute or two on CPU."""
    compiled, _, _ = train_step(
        tokenizer,
        tmp_path,
        micro_batch=4,
        steps=2,
        torch_compile=True,
        torch_compile_backend="inductor",
    )
    eager, _, _ = train_step(tokenizer, tmp_path, micro_batch=4, steps=2)
    assert max_relative_difference(compiled[0], eager[0]) < TOLERANCE


# ---------------------------------------------------------------------------------- bad input


def test_vocabulary_mismatch_says_what_to_change(tokenizer: Any, tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    def trainer_for(vocab_size: int) -> Trainer:
        config = LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=8,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
        )
        return Trainer(model=LlamaForCausalLM(config), args=training_args(tmp_path))

    with pytest.raises(ValueError, match=r"produces 40 logits.*resize_token_embeddings"):
        NTLossForTrainer(tokenizer).attach(trainer_for(40))  # tokens the model lacks
    # A NumberVocab (or an explicit vocab_size) states the size: a padded layer is a mismatch.
    vocab = NumberVocab.from_tokenizer(tokenizer)
    with pytest.raises(ValueError, match=r"produces 64 logits.*vocab_size=64"):
        NTLossForTrainer(vocab).attach(trainer_for(64))
    with pytest.raises(ValueError, match=r"produces 64 logits.*vocab_size=50"):
        NTLossForTrainer(tokenizer, vocab_size=50).attach(trainer_for(64))
    # The same check when the loss is called, e.g. without attach.
    labels = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"produces 64 logits .* vocab_size=46"):
        NTLossForTrainer(tokenizer)(CausalLMOutput(logits=torch.zeros(1, 3, 64)), labels)
    # A padded output layer is fine when the loss is told.
    loss_fn = NTLossForTrainer(tokenizer, vocab_size=64)
    assert loss_fn(CausalLMOutput(logits=torch.zeros(1, 3, 64)), labels) >= 0


@pytest.mark.parametrize("logits_free", [False, True])
def test_attach_reads_a_padded_output_layer_from_the_model(
    tokenizer: Any, tmp_path: Path, logits_free: bool
) -> None:
    """The README's one line on the README's kind of model, whose output layer is padded beyond
    the tokenizer (GPT-2's 50,257 tokens in 50,304 logits): attach() reads the number of logits
    from the model, as patch_model does, and the step's loss is that of a NumberVocab built for
    it."""
    model = build_model(tokenizer, vocab_size=64)
    _, logs, trainer = train_step(tokenizer, tmp_path, model=model, logits_free=logits_free)
    loss_fn = trainer.compute_loss_func
    assert loss_fn.vocab.vocab_size == loss_fn.spec.vocab_size == 64 != len(tokenizer)
    vocab = NumberVocab.from_tokenizer(tokenizer, vocab_size=64)
    assert loss_fn.vocab.ids.tolist() == vocab.ids.tolist()
    batch = collate(build_dataset(tokenizer), tokenizer.pad_token_id)
    with torch.no_grad():
        logits = build_model(tokenizer, vocab_size=64)(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        ).logits  # the same initial weights (seed 0) on the whole batch: the step's one batch
    labels = batch["labels"]
    expected = cross_entropy_with_ntl(logits, labels, vocab, ntl_weight=NTL_WEIGHT, shift=True)
    assert logs[0]["loss"] == pytest.approx(float(expected.loss), rel=TOLERANCE)
    assert logs[0]["ntl"] == pytest.approx(float(expected.ntl), rel=TOLERANCE)


def test_missing_labels_say_what_to_change(tokenizer: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"labels are missing.*DataCollatorForLanguageModeling"):
        NTLossForTrainer(tokenizer)(CausalLMOutput(logits=torch.zeros(1, 3, 46)), None)

    def no_labels(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = collate(features, tokenizer.pad_token_id)
        del batch["labels"]
        return batch

    # transformers 4.46's and 4.48's Trainer refuses such a batch itself, before the loss sees it.
    with pytest.raises(ValueError, match=r"labels are missing|did not return a loss"):
        train_step(tokenizer, tmp_path, collator=no_labels)


def test_encoder_decoder_with_shift_is_refused(tokenizer: Any, tmp_path: Path) -> None:
    trainer = Trainer(model=build_t5(tokenizer), args=training_args(tmp_path))
    with pytest.raises(ValueError, match=r"encoder-decoder.*shift=False"):
        NTLossForTrainer(tokenizer).attach(trainer)
    outputs = Seq2SeqLMOutput(
        logits=torch.zeros(1, 3, 46), encoder_last_hidden_state=torch.zeros(1, 2, 8)
    )
    with pytest.raises(ValueError, match=r"encoder-decoder.*shift=False"):
        NTLossForTrainer(tokenizer)(outputs, torch.zeros(1, 3, dtype=torch.long))


def test_causal_model_without_shift_warns(tokenizer: Any, tmp_path: Path) -> None:
    trainer = Trainer(model=build_model(tokenizer), args=training_args(tmp_path))
    with pytest.warns(UserWarning, match=r"causal LM and shift=False"):
        NTLossForTrainer(tokenizer, shift=False).attach(trainer)


def test_output_without_logits_says_what_to_change(tokenizer: Any, tmp_path: Path) -> None:
    from transformers import LlamaModel

    base_model = LlamaModel(build_model(tokenizer).config)  # AutoModel: hidden states only
    with pytest.raises(ValueError, match=r"no logits.*'last_hidden_state'.*AutoModelForCausalLM"):
        train_step(tokenizer, tmp_path, model=base_model)
    labels = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="no logits"):
        NTLossForTrainer(tokenizer)(BaseModelOutput(last_hidden_state=torch.zeros(1, 3, 8)), labels)
    with pytest.raises(TypeError, match=r"outputs must be a model output with logits .*got str"):
        NTLossForTrainer(tokenizer)("logits", labels)
    with pytest.raises(TypeError, match="logits must be floating point"):
        NTLossForTrainer(tokenizer)(torch.zeros(1, 3, 46, dtype=torch.long), labels)


def test_attach_refuses_what_it_cannot_make_exact(tokenizer: Any, tmp_path: Path) -> None:
    def trainer(**kwargs: Any) -> Trainer:
        return Trainer(model=build_model(tokenizer), args=training_args(tmp_path), **kwargs)

    with pytest.raises(ValueError, match="another compute_loss_func"):
        NTLossForTrainer(tokenizer).attach(trainer(compute_loss_func=lambda *a, **k: 0))
    loss_fn = NTLossForTrainer(tokenizer)
    loss_fn.attach(trainer())
    with pytest.raises(ValueError, match="already attached"):
        loss_fn.attach(trainer())
    with pytest.raises(TypeError, match=r"transformers.Trainer .*get_batch_samples.*object"):
        NTLossForTrainer(tokenizer).attach(object())
    data_parallel = trainer()
    data_parallel.args._n_gpu = 2  # what TrainingArguments sets with several visible GPUs
    with pytest.raises(ValueError, match=r"DataParallel over 2 GPUs.*torchrun"):
        NTLossForTrainer(tokenizer).attach(data_parallel)
    # attach() sets the loss when the Trainer was built without one.
    plain = trainer()
    loss_fn = NTLossForTrainer(tokenizer)
    assert loss_fn.attach(plain) is plain and plain.compute_loss_func is loss_fn


def test_bad_settings_are_refused_at_construction(tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="ntl_weight must be a finite number >= 0, got -1"):
        NTLossForTrainer(tokenizer, ntl_weight=-1)
    with pytest.raises(ValueError, match="kind must be one of"):
        NTLossForTrainer(tokenizer, kind="l7")
    with pytest.raises(TypeError, match="compile must be a bool"):
        NTLossForTrainer(tokenizer, compile="yes")  # type: ignore[arg-type]
    vocab = NumberVocab.from_tokenizer(tokenizer)
    with pytest.raises(ValueError, match="vocab_size=50 differs from the NumberVocab's"):
        NTLossForTrainer(vocab, vocab_size=50)
    with pytest.raises(TypeError, match="get_vocab"):
        NTLossForTrainer(object())
    assert "ntl_weight=0.3" in repr(NTLossForTrainer(vocab))
    with pytest.raises(ValueError, match="impl must be one of"):
        NTLossForTrainer(vocab, impl="cuda")


@pytest.mark.parametrize("logits_free", [False, True], ids=["logits", "logits-free"])
def test_the_triton_kernels_give_the_gradients_of_the_torch_path(
    tokenizer: Any, full_batch: dict[float, Any], tmp_path: Path, logits_free: bool
) -> None:
    """impl="triton" (in Triton's interpreter here) through the Trainer, accumulating micro-batches,
    from the logits and logits-free: the full batch's gradients and logs of the torch path."""
    gradients, logs, trainer = train_step(
        tokenizer, tmp_path, micro_batch=4, steps=2, impl="triton", logits_free=logits_free
    )
    reference, reference_logs, _ = full_batch[NTL_WEIGHT]
    assert "impl='triton'" in repr(trainer.compute_loss_func)
    assert max_relative_difference(gradients[0], reference[0]) < TOLERANCE
    for key in ("loss", "ce", "ntl"):
        assert logs[0][key] == pytest.approx(reference_logs[0][key], rel=TOLERANCE)
