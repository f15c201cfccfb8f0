"""Where the package keeps what it computes once and reuses: ``$XDG_CACHE_HOME/retrieval-stage``.

Dense recall's document embeddings (`retrieval_stage.recall.dense`) and the embedding model's
int8 and bf16 graphs (`retrieval_stage.local.graph_cache`) live under it; one module below both
so neither imports the other for a path.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["default_cache_dir"]


def default_cache_dir() -> Path:
    """The user's cache directory for this package: ``$XDG_CACHE_HOME/retrieval-stage``.

    ``~/.cache/retrieval-stage`` when ``XDG_CACHE_HOME`` is unset, ``%LOCALAPPDATA%`` on
    Windows.
    """
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    if not base and os.name == "nt":
        base = os.environ.get("LOCALAPPDATA", "").strip()
    root = Path(base) if base else Path.home() / ".cache"
    return root / "retrieval-stage"
