"""Reading numbers back out of a model: the distribution over whole numbers, the decoding
readouts (expected, median, mode) and the numeric metrics.

The readouts themselves are importable from ``numtok`` (:func:`numtok.predict_numbers`,
:func:`numtok.number_distribution`, ...). This package's own public names are the pieces a
program that builds its own evaluation on them needs, documented here and kept as the API:

* :class:`NextTokenScorer`: the model as a tree of continuations of its prompts, which
  :func:`number_distribution` and :func:`greedy_tokens` read;
* :func:`greedy_tokens`: greedy decoding through such a scorer;
* :func:`cache_argument`, :func:`returned_cache`, :func:`shared_prefix_length`: what a scorer that
  keeps a Hugging Face model's key/value cache needs (the forward's name for the cache, the cache
  a forward returned, the tokens every prompt of a batch shares);
* :data:`MAX_DIGITS` (the longest numbers :func:`number_distribution` enumerates),
  :data:`FAST_TOLERANCE` (a tolerance with which the mean moves by less than 1e-3 of the values'
  range) and the checks of those two settings, :func:`check_max_digits` and
  :func:`check_tolerance`, and of the draws per prompt, :func:`check_samples`, with the errors
  the readouts raise.
"""

from numtok.readout.decoding import greedy_tokens
from numtok.readout.distribution import (
    FAST_TOLERANCE,
    MAX_DIGITS,
    NextTokenScorer,
    check_max_digits,
    check_tolerance,
)
from numtok.readout.sampling import check_samples
from numtok.readout.scorers import cache_argument, returned_cache, shared_prefix_length

__all__ = [
    "FAST_TOLERANCE",
    "MAX_DIGITS",
    "NextTokenScorer",
    "cache_argument",
    "check_max_digits",
    "check_samples",
    "check_tolerance",
    "greedy_tokens",
    "returned_cache",
    "shared_prefix_length",
]
