"""The harness: the command line, the runner that calls each section, and how to measure.

`main` parses ``python -m benchmarks``'s flags, installs `benchmarks.guard`, starts the local
server and calls each chosen section of `benchmarks.sections` in registry order, then prints
`benchmarks.report`'s tables. The helpers every section times with live here: `Scale` (the
repetition counts each section declares), `interleaved` (variants in rotating rounds, wall and
CPU time), `per_round` / `per_round_extra` (ratios within a round), `drive` (async workers)
and `rss_bytes`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from . import guard, report
from .fixtures import LocalServer
from .sections import NAMES, load

DESCRIPTION = """\
The benchmark: our stage against raw httpx and peer clients, side by side, as ratios.

Run with ``python -m benchmarks`` from the repository root (see benchmarks/README.md). It starts
`benchmarks.server` in a child process on 127.0.0.1 and reports issue 15's targets in one run:

- overhead: sync, 0 ms: the CPU tracing adds per 50-document call in raw httpx calls of CPU
  (fast OTLP encoder, and the SDK's with ``RETRIEVAL_STAGE_FAST_OTLP=0``); wall time traced /
  sampled out at 0, 10 and 20 ms server latency;
- throughput: async calls per second at 64 concurrent behind 20 ms (and 0 ms): the stage
  sampled out vs a raw httpx `AsyncClient` loop, traced vs sampled out;
- peer_tracing: our tracing CPU per call vs openinference-instrumentation-cohere's over the
  cohere SDK, same provider and exporter;
- fanout: 512 texts in batches of 32 behind 20 ms, async client vs raw httpx under the same
  bound; memory: RSS over 10,000 traced async calls;
- context: untraced peer clients (peers) and an in-process CPU breakdown (breakdown);
- quality: the label-free quality signals per 50-document call (issue 28's <= 20 µs), min of
  many short rounds; quality_corpus: their values on the bundled corpus per reranker.

Variants are interleaved round by round (so drift hits all of them alike); wall and CPU time
(process time: every thread, so the exporter's counts) are kept per round, and ratios are
taken within a round, the median over rounds reported with its range. Every traced block ends
with `force_flush()` inside the timed region, so the exporter's work is charged to tracing.
Nothing here asserts; targets are reported as met or not met.
"""


# -- scale --------------------------------------------------------------------------------------


class Scale:
    """How many repetitions each section runs, by name (``scale.overhead_rounds``).

    Each section declares its own counts as ``SCALE = {"name": (full, quick)}``; `quick`
    (``--quick``) is a smoke test, not a measurement. Two sections may share a count (peers and
    peer_tracing share ``peer_rounds``) as long as they declare the same values.
    """

    def __init__(self, counts: Mapping[str, int]) -> None:
        self.counts = dict(counts)

    @classmethod
    def of(cls, sections: Iterable[ModuleType], *, quick: bool) -> Scale:
        counts: dict[str, int] = {}
        declared: dict[str, tuple[int, int]] = {}
        for section in sections:
            pairs: Mapping[str, tuple[int, int]] = getattr(section, "SCALE", {})
            for name, pair in pairs.items():
                if declared.setdefault(name, pair) != pair:
                    raise ValueError(
                        f"{section.__name__}: {name} = {pair}, elsewhere {declared[name]}"
                    )
                counts[name] = pair[1] if quick else pair[0]
        return cls(counts)

    def __getattr__(self, name: str) -> int:
        counts: dict[str, int] = self.__dict__.get("counts", {})
        if name not in counts:
            raise AttributeError(f"no section declares the count {name!r} in its SCALE")
        return counts[name]


# -- measuring ----------------------------------------------------------------------------------


@dataclass
class Samples:
    """Per-round seconds per call of each variant: wall clock and process CPU (all threads)."""

    wall: dict[str, list[float]]
    cpu: dict[str, list[float]]

    def median_wall(self) -> dict[str, float]:
        return {name: statistics.median(v) for name, v in self.wall.items()}

    def median_cpu(self) -> dict[str, float]:
        return {name: statistics.median(v) for name, v in self.cpu.items()}


def per_round(a: list[float], b: list[float]) -> dict[str, float]:
    """Median, min and max over rounds of a[r] / b[r] (both taken in the same round)."""
    ratios = sorted(x / y for x, y in zip(a, b, strict=True))
    return {"median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1]}


def per_round_extra(on: list[float], off: list[float], unit: list[float]) -> dict[str, float]:
    """Median, min and max over rounds of (on[r] - off[r]) / unit[r]: an added cost in units."""
    ratios = sorted((x - y) / u for x, y, u in zip(on, off, unit, strict=True))
    return {"median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1]}


def interleaved(
    variants: dict[str, Callable[[], object]],
    *,
    rounds: int,
    calls: int,
    after_block: dict[str, Callable[[], object]] | None = None,
) -> Samples:
    """Seconds per call of each variant, per round; variants take turns, order rotating.

    Wall time (`perf_counter`) and CPU time (`process_time`: every thread of this process,
    so the BatchSpanProcessor's exporter thread counts; the server is another process).
    `after_block` runs inside the timed region after a variant's block (a traced variant's
    `force_flush`), so deferred work is charged to the variant that caused it.
    """
    after = after_block or {}
    names = list(variants)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = variants[name]
            gc.collect()
            started, cpu_started = time.perf_counter(), time.process_time()
            for _ in range(calls):
                fn()
            if name in after:
                after[name]()
            cpu[name].append((time.process_time() - cpu_started) / calls)
            wall[name].append((time.perf_counter() - started) / calls)
    return Samples(wall, cpu)


async def drive(fn: Callable[[], Awaitable[object]], calls: int, concurrency: int) -> float:
    """Calls per second with `concurrency` workers looping on `fn`."""
    per_worker = calls // concurrency

    async def worker() -> None:
        for _ in range(per_worker):
            await fn()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return per_worker * concurrency / (time.perf_counter() - started)


def rss_bytes() -> int:
    """This process's resident set size."""
    try:
        import psutil  # type: ignore[import-untyped]

        return int(psutil.Process().memory_info().rss)
    except ImportError:  # Linux fallback, no extra package
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def machine() -> dict[str, str]:
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpus": str(os.cpu_count()),
        "cpu_model": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


# -- the runner ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Command line: run the sections, print the table, optionally write JSON."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=DESCRIPTION)
    parser.add_argument("--quick", action="store_true", help="a smoke run, not a measurement")
    parser.add_argument("--only", action="append", choices=sorted(NAMES), help="repeatable")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args(argv)
    guard.install()
    sections = {name: load(name) for name in NAMES}
    scale = Scale.of(sections.values(), quick=args.quick)
    chosen = args.only or list(NAMES)
    results: dict[str, Any] = {"machine": machine(), "scale": scale.counts}
    results["load_average_before"] = os.getloadavg()
    server = LocalServer(max_seconds=900)
    started = time.perf_counter()
    try:
        for name in chosen:
            t0 = time.perf_counter()
            print(f"-- {name} ...", file=sys.stderr, flush=True)
            results.setdefault("section_load", {})[name] = os.getloadavg()[0]
            results[name] = sections[name].measure(server, scale)
            print(f"   {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
        results["server_requests"] = server.stats()
    finally:
        server.stop()
    results["wall_seconds"] = time.perf_counter() - started
    results["load_average_after"] = os.getloadavg()
    print(report.text(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return 0
