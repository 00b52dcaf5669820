"""Fine-tuning a pretrained causal LM with every number loss (``numtok compare --preset
smollm2-arithmetic``, ``smollm2-rjokes``): the settings (:mod:`.config`), the tasks' examples
and their batches (:mod:`.examples`, :mod:`.data`; the tasks are :mod:`numtok.experiments.tasks`),
one arm's training (:mod:`.train`) and scoring (:mod:`.evaluate`), the run (:mod:`.runner`) and
its report (:mod:`.report`)."""
