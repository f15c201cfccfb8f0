"""Where a traced async call's extra CPU goes, end to end, layer by layer (issue 26).

``python -m benchmarks.studies.traced_layers [--rounds R] [--calls N]``

The setting of issue 26's targets: 64 concurrent callers, the benchmark server answering 50 TEI
results after 20 ms, 50 documents per call. Six variants take turns round by round (order
rotating), each adding one layer of the traced path to the one before:

- ``raw aiohttp``: a raw `aiohttp.ClientSession` loop, the unit everything is counted in;
- ``sampled out``: `RerankStage.arun` under ``ALWAYS_OFF`` (non-recording spans);
- ``recorded``: the span recorded (every document: a limit of 2,048 attributes) and ended,
  with no span processor: what writing the span costs on the event loop;
- ``queued``: `configure_tracing` with an exporter that drops every batch: the
  BatchSpanProcessor's queue and its thread's wake-ups;
- ``encoded``: the same, the exporter encoding each batch with `otlp_encoder.serialize_spans`
  and dropping the bytes;
- ``exported``: the fast OTLP exporter POSTing to the server's loopback sink, as the
  ``transports`` section's traced row does.

For each: calls/s, CPU per call (process time: every thread, the exporter's included), the
system part of it and minor page faults per call (`getrusage`), and the garbage collector's
share (`GcTimer`: the thread CPU of every collection, whichever thread ran it, and how many
per 1,000 calls), median and minimum over the rounds. Then each layer's cost: the median
over rounds of the difference between a variant and the one before it in the same round, in
µs and in raw aiohttp calls of CPU. A layer's cost is as noisy as the two variants it is the
difference of: read it over several runs.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import resource
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .. import guard
from ..fixtures import DOCS, QUERY, LocalServer, candidates, sampled_out_provider, traced_provider
from ..harness import drive

CONCURRENCY = 64
DELAY_MS = 20
BSP_SCHEDULE_DELAY_MS = "100"
"""As `fixtures.traced_provider`: the BatchSpanProcessor works during a timed block."""


class GcTimer:
    """Thread CPU spent in garbage collections, from `gc.callbacks`, while installed.

    A collection runs on the thread whose allocation set it off, holding the GIL, so one
    start slot is enough and ``time.thread_time`` at its start and stop is its CPU. A traced
    call keeps SDK span objects alive in the BatchSpanProcessor's queue, which makes
    collections of the young generation (that of every in-flight call) more frequent.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = 0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.seconds += time.thread_time() - self._started
            self.collections += 1

    def reset(self) -> None:
        self.seconds, self.collections = 0.0, 0

    def __enter__(self) -> GcTimer:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


LAYERS = ("raw aiohttp", "sampled out", "recorded", "queued", "encoded", "exported")


def _providers(server: LocalServer) -> dict[str, Any]:
    """The tracer provider of each stage variant."""
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from retrieval_stage.telemetry import configure_tracing
    from retrieval_stage.telemetry.otlp_encoder import serialize_spans

    class Dropping(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    class Encoding(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            serialize_spans(spans)
            return SpanExportResult.SUCCESS

    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = BSP_SCHEDULE_DELAY_MS
    return {
        "sampled out": sampled_out_provider(),
        "recorded": TracerProvider(span_limits=SpanLimits(max_span_attributes=2048)),
        "queued": configure_tracing("retrieval-stage-bench", exporter=Dropping()),
        "encoded": configure_tracing("retrieval-stage-bench", exporter=Encoding()),
        "exported": traced_provider(server),
    }


async def _measure(
    server: LocalServer, rounds: int, calls: int
) -> dict[str, dict[str, list[float]]]:
    import aiohttp

    from retrieval_stage import AsyncRerankClient, RerankStage

    cands = candidates(DOCS)
    base_url = server.delayed(DELAY_MS)
    payload = {"query": QUERY, "texts": [c.text for c in cands]}
    providers = _providers(server)
    stages = {
        name: RerankStage(AsyncRerankClient(base_url, batch_size=DOCS), tracer_provider=provider)
        for name, provider in providers.items()
    }
    session = aiohttp.ClientSession()

    async def raw() -> object:
        async with session.post(base_url + "/rerank", json=payload) as response:
            return json.loads(await response.read())

    def staged(stage: Any) -> Callable[[], Awaitable[object]]:
        return lambda: stage.arun(QUERY, cands)

    variants: dict[str, Callable[[], Awaitable[object]]] = {"raw aiohttp": raw}
    variants.update({name: staged(stage) for name, stage in stages.items()})

    def flush(name: str) -> None:
        provider = providers.get(name)
        if provider is not None and hasattr(provider, "force_flush"):
            provider.force_flush()

    out: dict[str, dict[str, list[float]]] = {
        key: {name: [] for name in LAYERS}
        for key in ("calls_per_second", "cpu_us", "system_us", "faults", "gc_us", "gc_per_1k")
    }
    timer = GcTimer()
    try:
        for name, fn in variants.items():  # warm: connections, caches, exporter threads
            await drive(fn, CONCURRENCY * 4, CONCURRENCY)
            flush(name)
        for r in range(rounds):
            for name in LAYERS[r % len(LAYERS) :] + LAYERS[: r % len(LAYERS)]:
                gc.collect()
                timer.reset()
                usage = resource.getrusage(resource.RUSAGE_SELF)
                started, cpu_started = time.perf_counter(), time.process_time()
                with timer:
                    await drive(variants[name], calls, CONCURRENCY)
                    flush(name)  # deferred export work is charged to the variant that caused it
                cpu = time.process_time() - cpu_started
                wall = time.perf_counter() - started
                after = resource.getrusage(resource.RUSAGE_SELF)
                out["calls_per_second"][name].append(calls / wall)
                out["cpu_us"][name].append(cpu / calls * 1e6)
                out["system_us"][name].append((after.ru_stime - usage.ru_stime) / calls * 1e6)
                out["faults"][name].append((after.ru_minflt - usage.ru_minflt) / calls)
                out["gc_us"][name].append(timer.seconds / calls * 1e6)
                out["gc_per_1k"][name].append(timer.collections / calls * 1000)
    finally:
        for stage in stages.values():
            await stage.reranker.aclose()
        await session.close()
        for provider in providers.values():
            if hasattr(provider, "shutdown"):
                provider.shutdown()
    return out


def report(out: dict[str, dict[str, list[float]]]) -> str:
    """Markdown: each variant's numbers, then each layer's cost."""
    median = statistics.median
    cpu = out["cpu_us"]
    lines = [
        "| variant | calls/s | CPU µs/call (median, min) | system µs/call | faults/call "
        "| GC µs/call | collections/1k calls |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in LAYERS:
        lines.append(
            f"| {name} | {median(out['calls_per_second'][name]):.0f} "
            f"| {median(cpu[name]):.0f}, {min(cpu[name]):.0f} "
            f"| {median(out['system_us'][name]):.0f} | {median(out['faults'][name]):.2f} "
            f"| {median(out['gc_us'][name]):.1f} | {median(out['gc_per_1k'][name]):.1f} |"
        )
    lines += [
        "",
        "| layer | CPU µs/call (median of per-round differences) | in raw aiohttp calls |",
        "|---|---|---|",
    ]
    raw = cpu["raw aiohttp"]
    for before, name in itertools.pairwise(LAYERS[1:]):
        extra = [a - b for a, b in zip(cpu[name], cpu[before], strict=True)]
        units = [e / u for e, u in zip(extra, raw, strict=True)]
        lines.append(f"| {before} → {name} | {median(extra):.0f} | {median(units):.2f} |")
    total = [a - b for a, b in zip(cpu["exported"], cpu["sampled out"], strict=True)]
    units = [e / u for e, u in zip(total, raw, strict=True)]
    lines.append(f"| sampled out → exported | {median(total):.0f} | {median(units):.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies.traced_layers")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=1536, help="per variant per round")
    parser.add_argument("--json", help="also write every round's numbers to this file")
    args = parser.parse_args(argv)
    guard.install()
    calls = max(args.calls // CONCURRENCY, 1) * CONCURRENCY
    load = os.getloadavg()[0]
    server = LocalServer(max_seconds=900)
    try:
        out = asyncio.run(_measure(server, args.rounds, calls))
    finally:
        server.stop()
    print(
        f"{args.rounds} rounds of {calls} calls per variant, {CONCURRENCY} concurrent, "
        f"{DELAY_MS} ms, {DOCS} documents; 1-minute load average {load:.2f} at the start\n"
    )
    print(report(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
