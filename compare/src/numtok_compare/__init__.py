"""The experiment harness behind ``numtok demo`` and ``numtok compare``.

The tasks (``tasks``: DeepMind's Mathematics, arithmetic word problems, rJokes, diamonds, JSON
Lines) feed two harnesses that do not import each other, over what every comparison shares: one
config (``config.RunConfig``), one preset table (``presets``) and one runner (``runner``: the
phases over (seed, arm, λ) jobs, the training loop with checkpoints and exact resume, worker
processes, the run folder). From scratch (``scratch``): small transformers trained from scratch
on arithmetic or rJokes. Fine-tuning a pretrained causal LM on a user's data or a built-in task:
``finetune``. Each gives the runner its arms and how to score them. One report writer
(``report``) writes every run from its rows, with the statistics of ``analysis``,
``item_metrics`` and ``crossed`` (items crossed with the seeds, as in fine-tuning and rJokes, or
nested in them, as in arithmetic from scratch, where each seed draws its own questions).
``bootstrap`` is the method the coverage study compares with. Needs the ``demo`` extra
(fine-tuning also ``pretrained``); the package itself imports nothing, so that the command line
can list its commands without them.
"""
