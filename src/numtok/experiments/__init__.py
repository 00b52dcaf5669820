"""The experiment harness behind ``numtok demo`` and ``numtok compare``.

The tasks (``tasks``: DeepMind's Mathematics, arithmetic word problems, rJokes, diamonds, JSON
Lines) feed two harnesses that do not import each other, over what every comparison shares: one
config (``config.RunConfig``), one training loop (``loop``: checkpoints, exact resume, logged
means, step times) and one preset table (``presets``). From scratch (``scratch``): small
transformers trained from scratch on arithmetic or rJokes, one engine for both tasks. Fine-tuning
a pretrained causal LM on a user's data or a built-in task: ``finetune``. One report writer
(``report``) writes every run from its rows, with the statistics of ``analysis``,
``item_metrics`` and ``crossed`` (items crossed with the seeds, as in fine-tuning and rJokes, or
nested in them, as in arithmetic from scratch, where each seed draws its own questions).
``bootstrap`` is the method the coverage study compares with. Needs the ``demo`` extra
(fine-tuning also ``pretrained``); the package itself imports nothing, so that the command line
can list its commands without them.
"""
