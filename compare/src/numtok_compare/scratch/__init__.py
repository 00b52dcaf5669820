"""Comparisons trained from scratch: a small decoder-only transformer (``model``) on character or
word tokens (``tokenizer``, ``batches``), one arm per loss or a regression head (``arm``), run by
the runner of every comparison (``comparison``: every (seed, arm) in worker processes, the step
timing of ``timing``, the report) with one scoring of readouts (``readouts``); the two tasks say
only what differs (``arithmetic``: DeepMind's Mathematics, ``rjokes``: Reddit jokes' scores),
with their settings in ``config``."""
