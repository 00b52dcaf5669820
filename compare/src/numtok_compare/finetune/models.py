"""The model a comparison fine-tunes: its folder and a digest that tells two models apart."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

__all__ = ["model_digest", "resolve_model"]


def resolve_model(model: str) -> Path:
    """The model's folder: ``"smollm2"`` is SmolLM2-135M-Instruct, built on first use
    (:func:`numtok_compare.pretrained.ensure_smollm2`); anything else a local folder that
    holds a saved causal LM."""
    from numtok_compare import pretrained

    if model == "smollm2":
        return pretrained.ensure_smollm2()
    return pretrained.local_model_dir(Path(model))


def model_digest(folder: Path) -> str:
    """A short hash of the model folder's configuration and the sizes of its files: two folders
    with the same digest hold the same model (the weights' bytes are not read)."""
    entries = sorted(
        (path.name, path.stat().st_size) for path in folder.iterdir() if path.is_file()
    )
    text = (folder / "config.json").read_text() + json.dumps(entries)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
