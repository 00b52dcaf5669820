"""Fine-tuning a pretrained causal LM with every number loss (``numtok compare --preset
smollm2-arithmetic``, ``smollm2-rjokes``): the settings (:mod:`.config`), the tasks' examples
and their batches (:mod:`.examples`, :mod:`.data`; the tasks are :mod:`numtok_compare.tasks`),
one arm built and rebuilt (:mod:`.arm`) and scored (:mod:`.evaluate`), the comparison the runner
of every comparison runs (:mod:`.comparison`), its rows (:mod:`.rows`) and the ``compare``
command (:mod:`.command`)."""
