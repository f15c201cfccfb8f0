"""memory: target (e): RSS over 10,000 traced async stage calls at 64 concurrent.

Read after a warm-up and after every slice of 1,024 calls (spans flushed, `gc.collect()`
first): the growth over all of them and over the second half.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from ..fixtures import DOCS, QUERY, LocalServer, candidates, traced_provider
from ..harness import Scale, drive, rss_bytes
from ..report import Row, verdict

SCALE = {"memory_warmup": (1024, 128), "memory_calls": (10_000, 512)}


def measure(server: LocalServer, scale: Scale, concurrency: int = 64) -> dict[str, Any]:
    """RSS over 10,000 traced async stage calls, after a warm-up at the same load.

    Read after every slice of 1,024 calls (spans flushed, `gc.collect()` first), so that
    "flat" can be told from "grew a little once": the growth over the second half of the run
    is reported beside the growth over all of it.
    """
    from retrieval_stage import AsyncRerankClient, RerankStage

    cands = candidates(DOCS)
    traced = traced_provider(server)

    async def main() -> tuple[int, int, list[tuple[int, int]]]:
        before_warmup = rss_bytes()
        stage = RerankStage(AsyncRerankClient(server.url, batch_size=DOCS), tracer_provider=traced)

        async def call() -> object:
            return await stage.arun(QUERY, cands)

        await drive(call, scale.memory_warmup, concurrency)
        traced.force_flush()
        gc.collect()
        after_warmup = rss_bytes()
        done, readings = 0, [(0, after_warmup)]
        while done < scale.memory_calls:  # in slices, flushing, like a steady service
            step = min(1024, scale.memory_calls - done)
            await drive(call, step, min(concurrency, step))
            done += step
            traced.force_flush()
            gc.collect()
            readings.append((done, rss_bytes()))
        return before_warmup, after_warmup, readings

    cold, warm, readings = asyncio.run(main())
    traced.shutdown()
    mib = 1024 * 1024
    end = readings[-1][1]
    half = min(readings, key=lambda r: abs(r[0] - scale.memory_calls / 2))
    return {
        "calls": scale.memory_calls,
        "rss_growth_mib": (end - warm) / mib,
        "rss_growth_second_half_mib": (end - half[1]) / mib,
        "second_half_from_call": half[0],
        "rss_growth_from_cold_mib": (end - cold) / mib,
        "rss_end_mib": end / mib,
        "rss_readings_mib": [(n, rss / mib) for n, rss in readings],
    }


def targets(m: dict[str, Any], results: dict[str, Any]) -> list[Row]:
    """(e) RSS growth after warm-up < 20 MB (decimal megabytes, from MiB)."""
    growth = m["rss_growth_mib"] * 1.048576
    second = m["rss_growth_second_half_mib"] * 1.048576
    return [
        (
            f"(e) memory: RSS growth over {m['calls']:,} traced async calls after warm-up "
            f"(over the last {m['calls'] - m['second_half_from_call']:,}: {second:.1f} MB)",
            f"{growth:.1f} MB",
            "< 20 MB",
            verdict(growth < 20),
        )
    ]
