"""numtok: the Number Token Loss for language models, right on every tokenizer."""

import warnings

with warnings.catch_warnings():
    # torch imported without numpy (the core needs torch alone) warns "Failed to initialize
    # NumPy: No module named 'numpy'" while it imports; nothing numtok imports uses numpy.
    warnings.filterwarnings(
        "ignore", "Failed to initialize NumPy: No module named 'numpy", UserWarning
    )
    import torch  # noqa: F401

from numtok.hf import NTLossForTrainer, patch_model, unpatch_model
from numtok.losses.fused import CEWithNTLOutput, CrossEntropyWithNTL, cross_entropy_with_ntl
from numtok.losses.head import LinearNumberTokenLoss, linear_number_token_loss
from numtok.losses.linear import LinearCrossEntropyWithNTL, linear_cross_entropy_with_ntl
from numtok.losses.module import NumberTokenLoss
from numtok.losses.ntil import NTILLoss, ntil_loss
from numtok.losses.number_level import NumberLevelLoss, number_level_loss
from numtok.losses.smoothing import GaussianLabelSmoothingLoss, gaussian_label_smoothing_ce
from numtok.losses.token import number_token_loss
from numtok.maths.kinds import DEL, DIST2, SMMD
from numtok.numbers.spans import NumberSpans, find_number_spans
from numtok.numbers.text import last_number, parse_number
from numtok.numbers.vocab import NumberVocab
from numtok.readout.decoding import (
    ExpectedNumbers,
    NumberPredictions,
    expected_numbers,
    expected_span_values,
    predict_numbers,
)
from numtok.readout.distribution import NumberDistribution, number_distribution
from numtok.readout.metrics import (
    NumericMetrics,
    argmax_logits,
    make_compute_metrics,
    numeric_metrics,
)

__all__ = [
    "DEL",
    "DIST2",
    "SMMD",
    "CEWithNTLOutput",
    "CrossEntropyWithNTL",
    "ExpectedNumbers",
    "GaussianLabelSmoothingLoss",
    "LinearCrossEntropyWithNTL",
    "LinearNumberTokenLoss",
    "NTILLoss",
    "NTLossForTrainer",
    "NumberDistribution",
    "NumberLevelLoss",
    "NumberPredictions",
    "NumberSpans",
    "NumberTokenLoss",
    "NumberVocab",
    "NumericMetrics",
    "argmax_logits",
    "cross_entropy_with_ntl",
    "expected_numbers",
    "expected_span_values",
    "find_number_spans",
    "gaussian_label_smoothing_ce",
    "last_number",
    "linear_cross_entropy_with_ntl",
    "linear_number_token_loss",
    "make_compute_metrics",
    "ntil_loss",
    "number_distribution",
    "number_level_loss",
    "number_token_loss",
    "numeric_metrics",
    "parse_number",
    "patch_model",
    "predict_numbers",
    "unpatch_model",
]
__version__ = "0.1.0"
