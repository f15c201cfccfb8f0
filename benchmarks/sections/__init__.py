"""The sections of ``python -m benchmarks``, one module each, and their registry.

A section module holds both its measurement and the rows it reports:

- ``measure(server: LocalServer, scale: Scale) -> dict[str, Any]`` (required): runs against
  the local server and returns its results, JSON-serialisable (they go into ``--json``);
- ``SCALE = {"count_name": (full, quick)}`` (optional): the repetition counts it reads as
  ``scale.count_name``, for a full run and for ``--quick``;
- ``targets(result, results) -> list[Row]`` (optional): its rows in the targets table;
- ``rows(result, results) -> list[Row]`` (optional): its rows in the "Everything else" table.

`result` is the section's own ``measure`` output, `results` the whole run's (a section may read
another's, as breakdown reads overhead's raw-call CPU). Modules import the library and SDK
inside their functions, never at module level, so `benchmarks.guard` is installed first.

To add a section: write ``benchmarks/sections/<name>.py`` and add its name to `NAMES`. The
order of `NAMES` is the order the sections run in (without ``--only``) and the order of their
rows in both tables; ``--only`` takes these names.
"""

from __future__ import annotations

import importlib
from types import ModuleType

NAMES: tuple[str, ...] = (
    "overhead",
    "throughput",
    "pool",
    "peer_tracing",
    "fanout",
    "memory",
    "peers",
    "breakdown",
    "transports",
    "rerank_server",
    "embedding_precision",
    "span_size",
    "quality",
    "quality_corpus",
)


def load(name: str) -> ModuleType:
    """The section module registered as `name`."""
    if name not in NAMES:
        raise KeyError(f"no benchmark section {name!r}; registered: {', '.join(NAMES)}")
    return importlib.import_module(f"{__name__}.{name}")
