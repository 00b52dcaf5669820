"""pytest's settings for the whole checkout (the tests' fixtures are in tests/conftest.py)."""

import importlib.util

# numtok.integrations.axolotl imports axolotl, which the dev environment does not hold (Axolotl
# pins other transformers/trl/peft releases): --doctest-modules cannot import it there.
# tests/test_axolotl_plugin.py runs it in an environment of its own, with Axolotl.
collect_ignore = (
    [] if importlib.util.find_spec("axolotl") else ["src/numtok/integrations/axolotl.py"]
)
