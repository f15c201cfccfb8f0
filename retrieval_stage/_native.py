"""The optional C loops of a traced rerank (`_speedups`), loaded and set up once.

`pip install` compiles ``retrieval_stage/_speedups.c`` wherever a C compiler and Python's headers
are found; where not, the install goes on without it and `SPEEDUPS` is None. Each loop stands
in for Python that stays beside it and writes the same result (the OTLP encoder's attribute
and document loops, ``output.value``'s common case), so the module only changes how fast a
traced call is: ``RETRIEVAL_STAGE_SPEEDUPS=0`` runs the Python, to compare or to rule the C
out. Read once, at import.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType

from .models import Candidate, Reranked
from .validate import InvalidSetting, env_flag

__all__ = ["SPEEDUPS", "SPEEDUPS_ENV"]

SPEEDUPS_ENV = "RETRIEVAL_STAGE_SPEEDUPS"
"""``0``/``false``/``no``/``off``: run the Python loops even where the C ones were built."""

_logger = logging.getLogger(__name__)


def _load() -> ModuleType | None:
    try:
        wanted = env_flag(SPEEDUPS_ENV)
    except InvalidSetting:
        _logger.warning("ignoring %s=%r: expected 0 or 1", SPEEDUPS_ENV, os.environ[SPEEDUPS_ENV])
        wanted = None
    if wanted is False:
        return None
    try:
        # The extension by its full name: it is not a module of ours the import graph counts.
        import retrieval_stage._speedups as _speedups  # type: ignore[import-not-found]
    except ImportError:
        return None
    _speedups.setup_fields(Candidate, Reranked)
    module: ModuleType = _speedups
    return module


SPEEDUPS: ModuleType | None = _load()
"""The C module, set up, or None where it was not built or `SPEEDUPS_ENV` turns it off."""
