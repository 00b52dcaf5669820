"""The rJokes regression comparison behind ``numtok repro --task rjokes``.

CE vs CE + λ·NTL (WAS, MSE) vs a scalar regression head, on Reddit jokes and their score 0-11,
with a small word-level transformer trained from scratch, read out by greedy decoding and by
the mean and median of the model's distribution over whole numbers. One concern per module:
``config``, ``model`` (the head arm), ``train`` (one arm), ``evaluate`` (readouts and metrics),
``report`` and ``runner`` (a whole run), ``download``; the data (the files, the validation
split) is the task :mod:`numtok.experiments.tasks.rjokes`.
"""

from numtok.experiments.rjokes.config import RJokesConfig
from numtok.experiments.rjokes.runner import run_rjokes

__all__ = ["RJokesConfig", "run_rjokes"]
