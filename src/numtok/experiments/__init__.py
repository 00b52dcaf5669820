"""The experiment harness behind ``numtok demo``, ``numtok repro`` and ``numtok compare``.

From scratch: CE vs CE + λ·NTL and the other number losses on DeepMind's Mathematics data and on
rJokes, small transformers trained from scratch (``config``, ``data``, ``tokenizer``, ``model``,
``batches``, ``objectives``, ``train``, ``evaluate``, ``timing``, ``report``, ``presets``,
``runner``; ``rjokes`` the regression task). Fine-tuning a pretrained causal LM on a user's data or
a built-in task, with the statistics a reviewer accepts: ``finetune`` (``numtok compare``),
``item_metrics`` and ``bootstrap``. Needs the ``demo`` extra (fine-tuning also ``pretrained``);
the package itself imports nothing, so that the command line can list its commands without them.
"""
