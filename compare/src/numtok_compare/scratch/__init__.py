"""Comparisons trained from scratch: a small Llama built from a ``LlamaConfig`` (``arm``) on
character or word tokens built with ``tokenizers`` (``tokenizer``), one arm per loss or a
regression head, trained by the ``transformers.Trainer`` and run by the runner of every comparison
(``comparison``: every (seed, arm) in worker processes, the report); the two tasks say only what
differs (``arithmetic``: DeepMind's Mathematics, ``rjokes``: Reddit jokes' scores), with their
settings in ``config``."""
