"""The reproduction harness behind ``numtok demo`` and ``numtok repro``.

CE vs CE + λ·NTL (WAS, MSE) and Gaussian label smoothing on DeepMind's Mathematics data, with a
small transformer trained from scratch. One concern per module: ``compat`` (the generator under
current sympy/numpy), ``data`` (tasks, generation, cache), ``tokenizer``, ``model``, ``batches``
(packing), ``objectives`` (each arm's loss), ``train`` (one arm, checkpoints), ``evaluate``
(greedy decoding and metrics), ``timing`` (step-time overhead), ``report``, ``config``,
``presets`` and ``runner`` (a whole run). Needs the ``demo`` extra: ``pip install numtok[demo]``.
"""

from numtok.experiments.config import ExperimentConfig
from numtok.experiments.presets import PRESETS
from numtok.experiments.runner import run_experiment

__all__ = ["PRESETS", "ExperimentConfig", "run_experiment"]
