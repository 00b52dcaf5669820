"""The experiment harness behind ``numtok demo`` and ``numtok compare``.

The tasks (``tasks``: DeepMind's Mathematics, arithmetic word problems, rJokes, JSON Lines) feed
two harnesses that do not import each other. From scratch: CE vs CE + λ·NTL and the other number
losses, small transformers trained from scratch (``config``, ``tokenizer``, ``model``,
``batches``, ``objectives``, ``train``, ``evaluate``, ``timing``, ``report``, ``presets``,
``runner``; ``rjokes`` the regression task). Fine-tuning a pretrained causal LM on a user's data or
a built-in task: ``finetune`` (``numtok compare``). The statistics both report with:
``analysis``, ``item_metrics``, ``bootstrap`` and ``stats``. Needs the ``demo`` extra (fine-tuning
also ``pretrained``); the package itself imports nothing, so that the command line can list its
commands without them.
"""
