"""CPU of one `RerankStage.arun` call in process, this tree against another revision (issue 26).

``python -m benchmarks.studies.span_cost [--base REV] [--calls N] [--rounds R]``

No I/O: a fake async reranker answers 50 documents (`fixtures.candidates`) at once, so what is
measured is the stage's own CPU per call, on the event loop's thread (``time.thread_time``;
``--clock process`` for the whole process, exporter threads included), sampled out and traced
under four tracer providers: ``ALWAYS_OFF``; the SDK's default limit (128 attributes, so the
documents are cut) and a limit of 2,048 (every document kept), both through a
`SimpleSpanProcessor` with an exporter that does nothing; and `configure_tracing` with the same
exporter. With ``--base REV`` the package as it is at that git revision is imported beside
this tree's under another name, and both run in turns in one process: the ratio is measured
side by side, the minimum of R rounds of N calls each (the machine is shared: report
``uptime`` with the numbers, as the run does).

OpenTelemetry's GenAI names (issue 39) are off unless the environment opts in: run once as is
and once with ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`` against the same
``--base`` (which predates them, so it writes none either way) to read what the opt-in costs.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import guard
from ..fixtures import DOCS, QUERY, ROOT, passage

BASE_NAME = "retrieval_stage_base"


class Instant:
    """An async reranker that answers at once, best last first (so the order changes)."""

    provider = "fake"
    model_name = "rerank-v3.5"
    base_url = "http://127.0.0.1:8080"  # as a client's: the GenAI opt-in writes server.*

    async def rerank(self, query: str, items: Any, *, text: Any = None, top_k: Any = None) -> Any:
        n = len(items)
        return [(items[i], 1.0 - i / (2 * n)) for i in range(n - 1, -1, -1)]


def import_base(rev: str, into: Path) -> str:
    """The package at git revision `rev`, importable as `BASE_NAME` (its imports are relative)."""
    archive = subprocess.run(
        ["git", "archive", rev, "retrieval_stage"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        if hasattr(tarfile, "data_filter"):  # 3.10.12+: refuse links and paths out of `into`
            tar.extractall(into, filter="data")
        else:  # pragma: no cover - our own git archive
            tar.extractall(into)
    (into / "retrieval_stage").rename(into / BASE_NAME)
    sys.path.insert(0, str(into))
    return BASE_NAME


def stages(package: str) -> tuple[list[Any], dict[str, Any]]:
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    class Nothing(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            pass

    lib = importlib.import_module(package)
    telemetry = importlib.import_module(package + ".telemetry")
    default = TracerProvider()
    default.add_span_processor(SimpleSpanProcessor(Nothing()))
    wide = TracerProvider(span_limits=SpanLimits(max_span_attributes=2048))
    wide.add_span_processor(SimpleSpanProcessor(Nothing()))
    providers = {
        "sampled out": TracerProvider(sampler=ALWAYS_OFF),
        "traced, SDK default limit (128)": default,
        "traced, limit 2048": wide,
        "traced, configure_tracing": telemetry.configure_tracing("bench", exporter=Nothing()),
    }
    cands = [lib.Candidate(f"doc-{i}", passage(i), 1.0 - i / DOCS) for i in range(DOCS)]
    return cands, {k: lib.RerankStage(Instant(), tracer_provider=p) for k, p in providers.items()}


def per_call(stage: Any, cands: list[Any], calls: int, clock: Callable[[], float]) -> float:
    async def loop() -> None:
        for _ in range(calls):
            await stage.arun(QUERY, cands)

    started = clock()
    asyncio.run(loop())
    return (clock() - started) / calls * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies.span_cost")
    parser.add_argument("--base", help="a git revision to compare with (e.g. main)")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--clock", choices=("thread", "process"), default="thread")
    args = parser.parse_args(argv)
    guard.install()
    clock = time.thread_time if args.clock == "thread" else time.process_time
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"this tree": stages("retrieval_stage")}
        if args.base:
            sides[args.base] = stages(import_base(args.base, Path(tmp)))
        best: dict[tuple[str, str], float] = {}
        for cands, by_name in sides.values():  # warm up: key tables, imports
            for stage in by_name.values():
                per_call(stage, cands, 20, clock)
        for _ in range(args.rounds):
            for side, (cands, by_name) in sides.items():
                for name, stage in by_name.items():
                    value = per_call(stage, cands, args.calls, clock)
                    best[side, name] = min(best.get((side, name), value), value)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average {load}; us per call ({args.clock} CPU), min of {args.rounds} rounds")
    for name in sides["this tree"][1]:
        line = f"{name:34s} this tree {best['this tree', name]:7.1f}"
        if args.base:
            base = best[args.base, name]
            line += f"   {args.base} {base:7.1f}   ratio {best['this tree', name] / base:5.2f}"
        print(line)


if __name__ == "__main__":
    main()
