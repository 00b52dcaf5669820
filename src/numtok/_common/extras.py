"""Optional dependencies: an entry point that needs one says which extra installs it.

The core of numtok needs torch alone. The Hugging Face adapter and ``numtok vocab`` need the
``hf`` extra (``pip install ".[hf]"`` in a checkout: numtok is not published on PyPI);
:func:`require_extra` turns their absence into one clear error at the entry point instead of a
traceback from deep inside a later call.
"""

from __future__ import annotations

import importlib.util

#: The modules each extra of pyproject.toml installs and numtok imports.
EXTRAS: dict[str, tuple[str, ...]] = {
    "hf": ("transformers", "accelerate"),
}


def _listed(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def require_extra(extra: str, feature: str) -> None:
    """Raise ``ModuleNotFoundError`` naming ``pip install ".[extra]"`` when a module of
    ``extra`` cannot be imported; ``feature`` says what needed it."""
    missing = [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]
    if missing:
        raise ModuleNotFoundError(
            f"{feature} needs {_listed(missing)}, which numtok's {extra!r} extra installs: "
            f'pip install ".[{extra}]" in a checkout of numtok',
            name=missing[0],
        )
