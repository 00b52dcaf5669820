"""patch_model: CE + NTL inside a causal LM's own forward, against the reference on the unpatched
model's logits (``F.cross_entropy`` + λ·``number_token_loss``, both shifted) — values and every
parameter's gradient, from the logits and logits-free, tied and untied; the model's own
behaviour without labels, under no_grad and after unpatch_model; the Trainer training a patched
model with no compute_loss_func; bad input. (TRL >= 1.16's SFTTrainer computes its own loss from
a fused LM head and never reads ``outputs.loss``: there NTLossForTrainer.attach is the route.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from transformers import Trainer

from numtok import NumberVocab, number_token_loss
from numtok.hf import NTLossForTrainer, last_loss_terms, patch_model, unpatch_model

from _hf_tiny import (
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


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer()


def batch_of(tokenizer: Any) -> dict[str, torch.Tensor]:
    return collate(build_dataset(tokenizer), tokenizer.pad_token_id)


def tied_or_untied(tokenizer: Any, tied: bool) -> Any:
    model = build_model(tokenizer)
    if tied:
        model.config.tie_word_embeddings = True
        model.tie_weights()
    return model


def reference_loss(model: Any, batch: dict[str, torch.Tensor], vocab: NumberVocab) -> torch.Tensor:
    """F.cross_entropy of the shifted labels + λ·number_token_loss, on the unpatched logits."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    labels = batch["labels"]
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
    return ce + NTL_WEIGHT * number_token_loss(logits, labels, vocab, shift=True)


def gradients(model: Any, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named])
    return {n: g for (n, _), g in zip(named, grads, strict=True)}


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("logits_free", [False, True], ids=["logits", "logits-free"])
def test_the_loss_and_gradients_of_the_reference(
    tokenizer: Any, tied: bool, logits_free: bool
) -> None:
    vocab = NumberVocab.from_tokenizer(tokenizer)
    batch = batch_of(tokenizer)
    reference_model = tied_or_untied(tokenizer, tied)
    expected = reference_loss(reference_model, batch, vocab)
    expected_grads = gradients(reference_model, expected)

    model = patch_model(
        tied_or_untied(tokenizer, tied), tokenizer, ntl_weight=NTL_WEIGHT, logits_free=logits_free
    )
    outputs = model(**batch)
    assert (outputs.logits is None) == logits_free  # the logits were never built
    torch.testing.assert_close(outputs.loss, expected, rtol=1e-6, atol=0)
    assert max_relative_difference(gradients(model, outputs.loss), expected_grads) < TOLERANCE
    terms = last_loss_terms(model)
    assert terms is not None and not terms.ce.requires_grad
    torch.testing.assert_close(terms.ce + NTL_WEIGHT * terms.ntl, expected.detach())

    with torch.no_grad():
        evaluated = model(**batch)
    assert evaluated.logits is not None and evaluated.logits.shape[-1] == len(tokenizer)
    torch.testing.assert_close(evaluated.loss, expected.detach(), rtol=1e-6, atol=0)


def test_without_labels_and_after_unpatching_the_model_is_its_own(tokenizer: Any) -> None:
    batch = batch_of(tokenizer)
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    model = build_model(tokenizer)
    own_logits = model(**inputs).logits
    own_loss = model(**batch).loss  # transformers' own cross-entropy
    patch_model(model, tokenizer)
    patched = model(**inputs)
    assert patched.loss is None
    torch.testing.assert_close(patched.logits, own_logits, rtol=0, atol=0)
    assert not torch.equal(model(**batch).loss, own_loss)  # NTL is added
    assert "forward" in vars(model)
    unpatch_model(model)
    assert "forward" not in vars(model)
    torch.testing.assert_close(model(**batch).loss, own_loss, rtol=0, atol=0)
    with pytest.raises(ValueError, match="is not patched"):
        unpatch_model(model)


def test_num_items_in_batch_gives_the_token_share_weighting(tokenizer: Any) -> None:
    """``Σ ce / n + λ · Σ ntl / |P| · |T| / n`` for a trainer's ``num_items_in_batch = n``: the
    call's own means when n is its own target count."""
    vocab = NumberVocab.from_tokenizer(tokenizer)
    batch = batch_of(tokenizer)
    model = patch_model(build_model(tokenizer), vocab, ntl_weight=NTL_WEIGHT)
    targets = int((batch["labels"][:, 1:] != -100).sum())
    own = model(**batch).loss
    torch.testing.assert_close(model(**batch, num_items_in_batch=targets).loss, own)
    doubled = model(**batch, num_items_in_batch=torch.tensor(2 * targets)).loss
    torch.testing.assert_close(doubled, own / 2)


def test_a_trainer_trains_a_patched_model_without_compute_loss_func(
    tokenizer: Any, tmp_path: Path
) -> None:
    """One batch, one step: the gradients and loss of NTLossForTrainer attached to the unpatched
    model; the Trainer passes num_items_in_batch to the patched forward."""

    def train(patched: bool) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        recorder = gradient_recorder()
        model = build_model(tokenizer)
        if patched:
            patch_model(model, tokenizer, ntl_weight=NTL_WEIGHT)
        trainer = Trainer(
            model=model,
            # The Trainer's default: it keeps the columns the model's forward names.
            args=training_args(tmp_path / str(patched), remove_unused_columns=True),
            train_dataset=build_dataset(tokenizer),
            data_collator=lambda features: collate(features, tokenizer.pad_token_id),
            callbacks=[recorder],
        )
        if not patched:
            NTLossForTrainer(tokenizer, ntl_weight=NTL_WEIGHT).attach(trainer)
        assert trainer.compute_loss_func is None or not patched
        trainer.train()
        return recorder.gradients[0], trainer.state.log_history[0]

    (reference, reference_log), (patched, log) = train(False), train(True)
    assert max_relative_difference(patched, reference) < TOLERANCE
    assert log["loss"] == pytest.approx(reference_log["loss"], rel=TOLERANCE)


def test_under_gradient_accumulation_ce_is_exact_and_ntl_is_weighted_by_token_share(
    tokenizer: Any, tmp_path: Path
) -> None:
    """4 micro-batches of 2 against one batch of 8 through the Trainer: with ntl_weight=0 the
    patched model's gradients are the full batch's (CE divides by the step's num_items_in_batch);
    with NTL each micro-batch's mean is weighted by its token share, which differs from NTL's
    mean over the step's number positions (what attach() computes) by the measured amount."""

    def step(patched: bool, ntl_weight: float, micro_batch: int) -> dict[str, torch.Tensor]:
        recorder = gradient_recorder()
        model = build_model(tokenizer)
        args = training_args(
            tmp_path / f"{patched}{ntl_weight}{micro_batch}",
            per_device_train_batch_size=micro_batch,
            gradient_accumulation_steps=8 // micro_batch,
        )
        data = build_dataset(tokenizer)
        trainer = Trainer(
            model=patch_model(model, tokenizer, ntl_weight=ntl_weight) if patched else model,
            args=args,
            train_dataset=data,
            data_collator=lambda features: collate(features, tokenizer.pad_token_id),
            callbacks=[recorder],
        )
        if not patched:
            NTLossForTrainer(tokenizer, ntl_weight=ntl_weight).attach(trainer)
        trainer.train()
        return recorder.gradients[0]

    exact_ce = step(False, 0.0, 8)
    assert max_relative_difference(step(True, 0.0, 2), exact_ce) < TOLERANCE
    exact = step(False, NTL_WEIGHT, 8)
    assert max_relative_difference(step(True, NTL_WEIGHT, 8), exact) < TOLERANCE
    token_share = max_relative_difference(step(True, NTL_WEIGHT, 2), exact)
    assert 1e-2 < token_share < 0.2  # 0.12 of the largest gradient entry (0.41 for 2 x 4)


def test_bad_input_says_what_to_change(tokenizer: Any) -> None:
    model = build_model(tokenizer)
    with pytest.raises(ValueError, match=r"produces 46 logits.*vocab_size=40"):
        patch_model(model, NumberVocab.from_values({5: "1"}, vocab_size=40))
    with pytest.raises(ValueError, match="get_output_embeddings"):
        patch_model(torch.nn.Linear(3, 3), tokenizer)
    patch_model(model, tokenizer)
    with pytest.raises(ValueError, match="patched already"):
        patch_model(model, tokenizer)
    batch = batch_of(tokenizer)
    with pytest.raises(ValueError, match="labels must have shape"):
        model(input_ids=batch["input_ids"], labels=batch["labels"][:, :-1])
    with pytest.raises(ValueError, match="return_dict=True"):
        model(**batch, return_dict=False)
    with pytest.raises(ValueError, match="ntl_weight must be"):
        patch_model(build_model(tokenizer), tokenizer, ntl_weight=-1)
