"""numtok inside other training and serving frameworks, one module each, imported only by the
framework that loads it or by its user (nothing here is imported by ``import numtok``):

- :mod:`numtok.integrations.axolotl`: ``plugins: [numtok.integrations.axolotl.NumtokPlugin]`` in
  an Axolotl YAML config (it imports ``axolotl``).
- :mod:`numtok.integrations.vllm`: :func:`~numtok.integrations.vllm.predict_numbers` reads the
  numbers out of a ``vllm.LLM`` (it imports ``vllm``).

PyTorch Lightning needs no module of its own: ``examples/lightning_ntl.py``."""
