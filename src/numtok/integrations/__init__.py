"""numtok inside other training frameworks, one module each, imported only by the framework that
loads it (nothing here is imported by ``import numtok``):

- :mod:`numtok.integrations.axolotl`: ``plugins: [numtok.integrations.axolotl.NumtokPlugin]`` in
  an Axolotl YAML config (it imports ``axolotl``).

PyTorch Lightning needs no module of its own: ``examples/lightning_ntl.py``."""
