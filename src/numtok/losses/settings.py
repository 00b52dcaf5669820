"""The checked settings of cross-entropy + NTL, one place for the fused form (logits given) and
the linear form (hidden states and the output layer's weight given), function and module alike:
``kind="number"`` refused with the way to compute it instead, the
:class:`~numtok.maths.ntl.LossSpec`, ``ntl_weight`` and ``impl``."""

from __future__ import annotations

from typing import NamedTuple

from numtok._common.validation import check_ntl_weight
from numtok.maths.ntl import Kind, LossSpec, refuse_number_level
from numtok.numbers.vocab import NumberVocab
from numtok.ops.kernels.dispatch import check_impl

__all__ = ["NUMBER_LEVEL_BESIDE_HIDDEN", "NUMBER_LEVEL_BESIDE_LOGITS", "CEWithNTLSettings"]

#: What a refusal of ``kind="number"`` (which has no fused pass) offers instead, given logits.
NUMBER_LEVEL_BESIDE_LOGITS = (
    "Add it to a cross-entropy instead: F.cross_entropy(...) + ntl_weight * "
    "number_token_loss(logits, labels, vocab, kind='number', shift=...)"
)
#: The same, given hidden states and the output layer's weight.
NUMBER_LEVEL_BESIDE_HIDDEN = (
    "Add it to a cross-entropy instead: your cross-entropy + ntl_weight * "
    "linear_number_token_loss(hidden, weight, labels, vocab, kind='number', shift=...), "
    "the number head, which needs no logits either"
)


class CEWithNTLSettings(NamedTuple):
    """``loss = ce + ntl_weight · ntl`` computed by the backend ``impl`` with the NTL of
    ``spec``."""

    spec: LossSpec
    ntl_weight: float
    impl: str

    @classmethod
    def build(
        cls,
        entry_point: str,
        instead: str,
        vocab: NumberVocab,
        *,
        ntl_weight: float,
        kind: Kind,
        reweigh: bool,
        squash_factor: float | None,
        ignore_index: int,
        reduction: str,
        shift: bool,
        logit_softcap: float | None,
        impl: str,
        capturable: bool,
    ) -> CEWithNTLSettings:
        """Check the settings of ``entry_point`` once; a ``ValueError``/``TypeError`` names the
        bad argument (``kind="number"``: what to call ``instead``)."""
        refuse_number_level(kind, entry_point, instead)
        spec = LossSpec.build(
            vocab,
            kind=kind,
            reweigh=reweigh,
            squash_factor=squash_factor,
            ignore_index=ignore_index,
            reduction=reduction,
            shift=shift,
            logit_softcap=logit_softcap,
            capturable=capturable,
        )
        return cls(spec, check_ntl_weight(ntl_weight), check_impl(impl))

    def describe(self, number_tokens: int) -> str:
        """The settings as a module's ``extra_repr`` shows them."""
        return f"ntl_weight={self.ntl_weight}, {self.spec.describe(number_tokens)}" + (
            "" if self.impl == "auto" else f", impl={self.impl!r}"
        )
