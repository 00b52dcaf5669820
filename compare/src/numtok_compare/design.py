"""What a comparison compared, as its report states it (:class:`Design`): every harness describes
its run with one, the report writer (:mod:`numtok_compare.report`) and the planning of a next
run (:mod:`numtok_compare.planning`) read it from the rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Design", "equivalence_baseline"]


def equivalence_baseline(
    margin: float | None, margin_baseline: str | None, arms: Sequence[str]
) -> str | None:
    """The arm whose primary comparisons a margin tests: ``margin_baseline``, else the
    regression head where ``arms`` has one (the paper's "matches a regression head"), else CE;
    None without a margin."""
    if margin is None:
        return None
    return margin_baseline or ("head" if "head" in arms else "ce")


@dataclass(frozen=True)
class Design:
    """What a run compared, as its report states it: ``title``; ``trained`` (a sentence: the
    model, the training budget, λ, the data); ``seeds``; ``arms`` (the primary endpoint's table:
    each of them but CE minus CE); ``splits`` (the scored splits but validation, the primary one
    first); the primary ``metric`` (one of :data:`~numtok_compare.item_metrics.ITEM_METRICS`,
    also the gate's) and ``readout``; ``max_value``, the largest answer the distribution
    readouts enumerate (None: none); ``margin``, the equivalence margin of the primary
    comparisons against ``margin_baseline`` in units of the tested metric (None: no equivalence
    test; rows written before ``margin_baseline`` existed read as its default,
    :attr:`equivalence_baseline`)."""

    title: str
    trained: str
    seeds: tuple[int, ...]
    arms: tuple[str, ...]
    splits: tuple[str, ...]
    metric: str
    readout: str
    max_value: int | None
    margin: float | None = None
    margin_baseline: str | None = None

    @property
    def equivalence_baseline(self) -> str | None:
        """:func:`equivalence_baseline` of this design's margin and arms."""
        return equivalence_baseline(self.margin, self.margin_baseline, self.arms)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, stored: Mapping[str, Any]) -> Design:
        return cls(**{**stored, **{key: tuple(stored[key]) for key in ("seeds", "arms", "splits")}})
