"""The tasks a comparison trains and scores on, each a source of prompts with numeric answers:
DeepMind's Mathematics questions (generated), arithmetic word problems, rJokes' scores, diamonds'
prices and a user's JSON Lines; and where their generated or downloaded files are kept
(:func:`default_cache_dir`)."""

import os
from pathlib import Path

__all__ = ["default_cache_dir"]


def default_cache_dir() -> Path:
    """``$NUMTOK_CACHE``, else ``$XDG_CACHE_HOME/numtok``, else ``~/.cache/numtok``."""
    if os.environ.get("NUMTOK_CACHE"):
        return Path(os.environ["NUMTOK_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "numtok"
