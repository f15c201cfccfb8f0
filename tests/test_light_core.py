"""The light core: the library imports and runs without the extras, and never asks for them.

`pip install retrieval-stage` installs only the core's dependencies; the command (typer, rich,
BM25, eval), the gRPC exporter and the in-process models are extras. Each check runs in a fresh
interpreter (a subprocess), so modules the test session already imported cannot hide an import.

Two runs:

- ``blocked``: every extra's modules are refused with ``ModuleNotFoundError``, as in a venv
  without the extras. The core must import and rerank through a traced stage.
- ``installed``: the extras are importable (this dev venv). The core must still load none of
  the heavy ones. httpx and structlog themselves import ``rich`` when it is installed (httpx
  its own optional command line, with ``click`` and ``pygments``; structlog its pretty
  tracebacks), so those three may appear here, but never because a module of ours asked.

In both runs every ``import`` statement naming an extra is recorded with the module that wrote
it: none may be ours, so an import of ours that tolerates ``ImportError`` is caught too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

# Import names of the extras' packages (and of what they pull in): [cli], [grpc], [local].
EXTRAS = (
    "typer",
    "click",
    "rich",
    "pygments",
    "bm25s",
    "ir_measures",
    "numpy",
    "scipy",
    "grpc",
    "opentelemetry.exporter.otlp.proto.grpc",
    "sentence_transformers",
    "transformers",
    "torch",
)
# What an installed extra still must not bring into a core-only process: all but the three
# that httpx (its `httpx._main` command line) and structlog import on their own when present.
NEVER_LOADED = tuple(name for name in EXTRAS if name not in ("click", "rich", "pygments"))
CORE = (
    "retrieval_stage",
    "retrieval_stage.client",
    "retrieval_stage.client.providers",
    "retrieval_stage.stage",
    "retrieval_stage.spans",
    "retrieval_stage.pipeline",
    "retrieval_stage.config",
    "retrieval_stage.metrics",
    "retrieval_stage.telemetry",
)

SCRIPT = """
import builtins, importlib, importlib.abc, json, sys

EXTRAS, CORE, BLOCK = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3] == "blocked"

def extra(name):
    return any(name == e or name.startswith(e + ".") for e in EXTRAS)

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if BLOCK and extra(name):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Refuse())
asked = []
real_import = builtins.__import__

def recording_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and extra(name):
        asked.append([(globals or {}).get("__name__", "?"), name])
    return real_import(name, globals, locals, fromlist, level)

builtins.__import__ = recording_import
for module in CORE:
    importlib.import_module(module)

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from retrieval_stage import Candidate, RerankStage
from retrieval_stage.config import RerankSettings, make_reranker
from retrieval_stage.telemetry import configure_tracing

exporter = InMemorySpanExporter()
provider = configure_tracing("light-core", exporter=exporter)
stage = RerankStage(make_reranker(RerankSettings()), tracer_provider=provider)
out = stage.run("q", [Candidate("a", "first", 2.0), Candidate("b", "second", 1.0)])
provider.force_flush()
print(json.dumps({
    "ids": [r.candidate.id for r in out],
    "spans": [s.name for s in exporter.get_finished_spans()],
    "asked": asked,
    "loaded": sorted(m for m in sys.modules if extra(m)),
    "cli_loaded": "retrieval_stage.cli" in sys.modules,
}))
"""


def core_run(mode: str) -> dict[str, Any]:
    """Import the core and rerank once in a fresh interpreter; what it imported."""
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(EXTRAS), json.dumps(CORE), mode],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


def under(name: str, packages: tuple[str, ...]) -> bool:
    """Whether module `name` is one of `packages` or inside one."""
    return any(name == p or name.startswith(p + ".") for p in packages)


@pytest.mark.parametrize("mode", ["blocked", "installed"])
def test_the_core_reranks_through_a_traced_stage_and_never_asks_for_an_extra(mode: str) -> None:
    report = core_run(mode)
    assert report["ids"] == ["a", "b"]  # RerankSettings() with no endpoint: the NullReranker
    assert report["spans"] == ["rerank"]
    asked_by_us = [pair for pair in report["asked"] if under(pair[0], ("retrieval_stage",))]
    assert asked_by_us == [], "a core module imports an extra"
    assert report["cli_loaded"] is False


def test_with_the_extras_installed_the_core_still_loads_none_of_the_heavy_ones() -> None:
    loaded = core_run("installed")["loaded"]
    assert [m for m in loaded if under(m, NEVER_LOADED)] == []
