"""patch_model(..., cross_entropy="model"): the model's own loss — transformers' cross-entropy,
Liger-Kernel's fused linear cross-entropy (its Triton kernels in the interpreter), Cut
Cross-Entropy (``impl="torch_compile"`` on CPU) — plus λ·NTL from the number head on the final
hidden states captured inside the forward; against the unpatched model's ``F.cross_entropy`` +
λ·``number_token_loss`` of its logits (values and every parameter's gradient), tied and untied,
soft-capped; logits as the model returns them (None under Liger); what it refuses."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from numtok import NumberVocab, number_token_loss
from numtok.hf import last_loss_terms, patch_model

from _hf_tiny import build_dataset, build_model, build_tokenizer, collate, max_relative_difference
from test_hf_patch import batch_of, gradients, tied_or_untied

NTL_WEIGHT = 0.7


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer()


def reference(
    model: Any, batch: dict[str, torch.Tensor], vocab: NumberVocab, num_items: int | None = None
) -> torch.Tensor:
    """The unpatched model's cross-entropy (``Σ ce / num_items``) + λ·NTL of its logits, NTL's
    mean over the number positions times the batch's share of the ``num_items`` tokens."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    labels = batch["labels"]
    flat_logits, flat_labels = (
        logits[:, :-1].reshape(-1, logits.shape[-1]),
        labels[:, 1:].reshape(-1),
    )
    tokens = int((flat_labels != -100).sum())
    items = tokens if num_items is None else num_items
    ce = F.cross_entropy(flat_logits, flat_labels, reduction="sum") / items
    ntl = number_token_loss(logits, labels, vocab, shift=True) * tokens / items
    return ce + NTL_WEIGHT * ntl


@pytest.mark.parametrize("num_items", [None, 50])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_transformers_own_cross_entropy_plus_the_number_head(
    tokenizer: Any, tied: bool, num_items: int | None
) -> None:
    vocab = NumberVocab.from_tokenizer(tokenizer)
    batch = batch_of(tokenizer)
    reference_model = tied_or_untied(tokenizer, tied)
    expected = reference(reference_model, batch, vocab, num_items)
    expected_grads = gradients(reference_model, expected)

    model = patch_model(
        tied_or_untied(tokenizer, tied), vocab, ntl_weight=NTL_WEIGHT, cross_entropy="model"
    )
    extra = {} if num_items is None else {"num_items_in_batch": num_items}
    outputs = model(**batch, **extra)
    assert outputs.logits is not None  # the model's own forward builds them
    torch.testing.assert_close(outputs.loss, expected, rtol=1e-6, atol=0)
    assert max_relative_difference(gradients(model, outputs.loss), expected_grads) < 1e-5
    terms = last_loss_terms(model)
    assert terms is not None
    torch.testing.assert_close(terms.ce + NTL_WEIGHT * terms.ntl, expected.detach())
    with torch.no_grad():
        torch.testing.assert_close(model(**batch, **extra).loss, expected.detach())
    no_labels = {k: v for k, v in batch.items() if k != "labels"}
    assert model(**no_labels).loss is None


@pytest.fixture
def liger_llama() -> Iterator[None]:
    """Liger-Kernel's fused linear cross-entropy patched into LlamaForCausalLM (its patch is
    global to the class), restored afterwards."""
    # Liger-Kernel is in the dev extra, not in make test-versions' environments.
    liger = pytest.importorskip("liger_kernel.transformers")
    apply_liger_kernel_to_llama = liger.apply_liger_kernel_to_llama
    from transformers.models.llama import modeling_llama

    own = modeling_llama.LlamaForCausalLM.forward
    apply_liger_kernel_to_llama(
        fused_linear_cross_entropy=True, cross_entropy=False, rms_norm=False, swiglu=False,
        rope=False,
    )  # fmt: skip
    assert modeling_llama.LlamaForCausalLM.forward is not own
    try:
        yield
    finally:
        modeling_llama.LlamaForCausalLM.forward = own


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_liger_fused_linear_cross_entropy_keeps_the_logits_away(
    tokenizer: Any, tied: bool, liger_llama: None
) -> None:
    vocab = NumberVocab.from_tokenizer(tokenizer)
    batch = batch_of(tokenizer)
    reference_model = tied_or_untied(tokenizer, tied)
    reference_model.eval()  # Liger's forward builds the logits in evaluation
    expected = reference(reference_model, batch, vocab)
    expected_grads = gradients(reference_model, expected)

    model = patch_model(
        tied_or_untied(tokenizer, tied), vocab, ntl_weight=NTL_WEIGHT, cross_entropy="model"
    )
    model.train()
    outputs = model(**batch)
    assert outputs.logits is None  # Liger's kernel never built them
    torch.testing.assert_close(outputs.loss, expected, rtol=1e-5, atol=0)
    assert max_relative_difference(gradients(model, outputs.loss), expected_grads) < 1e-4


def _cut_cross_entropy_llama(tokenizer: Any) -> Any:
    """A Llama whose training forward computes its loss with Cut Cross-Entropy from the final
    hidden states and the output layer's weight (as Axolotl's CCE integration patches it): no
    logits."""
    from cut_cross_entropy import linear_cross_entropy
    from transformers.modeling_outputs import CausalLMOutputWithPast

    model = build_model(tokenizer)
    own_forward = model.forward

    def forward(input_ids: Any = None, labels: Any = None, **kwargs: Any) -> Any:
        kwargs.pop("num_items_in_batch", None)
        if labels is None or not model.training:
            return own_forward(input_ids=input_ids, labels=labels, **kwargs)
        hidden = model.model(input_ids=input_ids, **kwargs).last_hidden_state
        loss = linear_cross_entropy(
            hidden, model.lm_head.weight, labels, shift=True, impl="torch_compile"
        )
        return CausalLMOutputWithPast(loss=loss, logits=None)

    model.forward = forward
    return model


@pytest.mark.slow
def test_cut_cross_entropy(tokenizer: Any) -> None:
    vocab = NumberVocab.from_tokenizer(tokenizer)
    batch = batch_of(tokenizer)
    reference_model = build_model(tokenizer)
    expected = reference(reference_model, batch, vocab)
    expected_grads = gradients(reference_model, expected)

    model = patch_model(
        _cut_cross_entropy_llama(tokenizer), vocab, ntl_weight=NTL_WEIGHT, cross_entropy="model"
    )
    model.train()
    outputs = model(**batch)
    assert outputs.logits is None
    torch.testing.assert_close(outputs.loss, expected, rtol=1e-5, atol=0)
    assert max_relative_difference(gradients(model, outputs.loss), expected_grads) < 1e-4


def _gemma2(tokenizer: Any) -> Any:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=64,
        final_logit_softcapping=2.0, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    return Gemma2ForCausalLM(config)


def test_soft_capped_logits(tokenizer: Any) -> None:
    """Gemma 2 caps its logits (``final_logit_softcapping``): its own loss is of the capped
    logits, and so is the number head's NTL."""
    vocab = NumberVocab.from_tokenizer(tokenizer)
    batch = batch_of(tokenizer)
    reference_model = _gemma2(tokenizer)
    expected = reference(reference_model, batch, vocab)
    expected_grads = gradients(reference_model, expected)
    model = patch_model(_gemma2(tokenizer), vocab, ntl_weight=NTL_WEIGHT, cross_entropy="model")
    outputs = model(**batch)
    torch.testing.assert_close(outputs.loss, expected, rtol=1e-6, atol=0)
    assert max_relative_difference(gradients(model, outputs.loss), expected_grads) < 1e-5


def test_what_it_refuses(tokenizer: Any) -> None:
    vocab = NumberVocab.from_tokenizer(tokenizer)
    with pytest.raises(
        ValueError, match=r"cross_entropy must be one of \('auto', 'numtok', 'model'\)"
    ):
        patch_model(build_model(tokenizer), vocab, cross_entropy="liger")
    with pytest.raises(ValueError, match="reweigh=True needs each number position's full"):
        patch_model(build_model(tokenizer), vocab, reweigh=True, cross_entropy="model")
    with pytest.raises(ValueError, match=r"its configuration sets logits_scaling=4\.0"):
        patch_model(scaled_logits_model(tokenizer), vocab, cross_entropy="model")
    with pytest.raises(ValueError, match="has none of its own"):
        patch_model(_DecoderOnly(build_model(tokenizer)), vocab, cross_entropy="model")


def scaled_logits_model(tokenizer: Any) -> Any:
    """A model dividing its logits by a scale (``logits_scaling``, as Granite): numtok's
    logits-free pass is exact for it (no bias), the number head beside its own loss is not."""
    model = build_model(tokenizer)
    model.config.logits_scaling = 4.0
    own_forward = model.forward

    def divided(*args: Any, **kwargs: Any) -> Any:
        outputs = own_forward(*args, **kwargs)
        outputs.logits = outputs.logits / model.config.logits_scaling
        return outputs

    model.forward = divided
    return model


class _DecoderOnly(torch.nn.Module):
    """A model with an output layer but no decoder of its own (``base_model`` is itself)."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner
        self.base_model = self
        self.config = inner.config

    def get_output_embeddings(self) -> Any:
        return self.inner.lm_head


def test_a_trainer_step_with_the_models_own_loss(tokenizer: Any, tmp_path: Any) -> None:
    """The Hugging Face Trainer trains a patched model with no compute_loss_func: it reads
    ``outputs.loss``, the model's cross-entropy plus λ·NTL."""
    from transformers import Trainer

    from _hf_tiny import training_args

    model = patch_model(build_model(tokenizer), tokenizer, ntl_weight=NTL_WEIGHT,
                        cross_entropy="model")  # fmt: skip
    trainer = Trainer(
        model=model,
        args=training_args(tmp_path, max_steps=2),
        train_dataset=build_dataset(tokenizer),
        data_collator=lambda features: collate(features, tokenizer.pad_token_id),
    )
    trainer.train()
    terms = last_loss_terms(model)
    assert terms is not None and float(terms.ntl) > 0
