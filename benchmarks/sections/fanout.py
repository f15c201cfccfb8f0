"""fanout: target (e): 512 texts in batches of 32 behind 20 ms, bound 8, against raw httpx.

`AsyncRerankClient` with its default `max_concurrency` against the same 16 requests sent by raw
`httpx.AsyncClient` under the same semaphore; the sync client beside.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from typing import Any

from ..fixtures import QUERY, LocalServer, passage
from ..harness import Scale
from ..report import Row, verdict

SCALE = {"fanout_async_reps": (15, 3), "fanout_sync_reps": (3, 1)}


def measure(server: LocalServer, scale: Scale) -> dict[str, Any]:
    """512 texts, batch size 32 (16 requests), 20 ms server delay, max_concurrency 8.

    Beside the ideal, the same 16 requests sent by raw httpx under the same semaphore: the
    ceiling httpx itself allows on this machine.
    """
    import httpx

    from retrieval_stage import AsyncRerankClient, RerankClient

    texts = [passage(i) for i in range(512)]
    base = server.delayed(20)
    batches, delay = math.ceil(512 / 32), 0.020

    async def run_async() -> tuple[list[float], list[float], int]:
        raw_http = httpx.AsyncClient()
        async with AsyncRerankClient(base, batch_size=32) as client:
            bound = client.max_concurrency
            gate = asyncio.Semaphore(bound)

            async def one(a: int) -> object:
                async with gate:
                    body = {"query": QUERY, "texts": texts[a : a + 32]}
                    response = await raw_http.post(base + "/rerank", json=body)
                    return json.loads(response.content)

            async def raw() -> object:
                return await asyncio.gather(*(one(a) for a in range(0, 512, 32)))

            for _ in range(2):
                await client.rerank(QUERY, texts)
                await raw()
            ours, ceiling = [], []
            for _ in range(scale.fanout_async_reps):
                started = time.perf_counter()
                response = await client.rerank_response(QUERY, texts)
                ours.append(time.perf_counter() - started)
                assert response.batches == batches
                assert len(response.results) == 512
                started = time.perf_counter()
                await raw()
                ceiling.append(time.perf_counter() - started)
        await raw_http.aclose()
        return ours, ceiling, bound

    async_times, raw_times, bound = asyncio.run(run_async())
    ideal = math.ceil(batches / bound) * delay
    with RerankClient(base, batch_size=32) as sync_client:
        sync_client.rerank(QUERY, texts)
        sync_times = []
        for _ in range(scale.fanout_sync_reps):
            started = time.perf_counter()
            sync_client.rerank(QUERY, texts)
            sync_times.append(time.perf_counter() - started)
    a, s = statistics.median(async_times), statistics.median(sync_times)
    r = statistics.median(raw_times)
    return {
        "batches": batches,
        "max_concurrency": bound,
        "ideal_seconds": ideal,
        "async_seconds": a,
        "raw_httpx_same_bound_seconds": r,
        "raw_httpx_efficiency": ideal / r,
        "async_over_raw_httpx": a / r,
        "sync_seconds": s,
        "async_efficiency": ideal / a,
        "sync_efficiency_vs_sequential_ideal": batches * delay / s,
        "sync_over_async": s / a,
    }


def targets(f: dict[str, Any], results: dict[str, Any]) -> list[Row]:
    """(e) async client wall / raw httpx under the same semaphore <= 1.05x."""
    return [
        (
            f"(e) fan-out 512 texts / 32 per batch, 20 ms, bound {f['max_concurrency']}: "
            "async client wall / raw httpx under the same semaphore",
            f"{f['async_over_raw_httpx']:.3f}x",
            "<= 1.05x",
            verdict(f["async_over_raw_httpx"] <= 1.05),
        )
    ]


def rows(f: dict[str, Any], results: dict[str, Any]) -> list[Row]:
    return [
        (
            f"fan-out: ideal / async wall (ideal = ceil(16/{f['max_concurrency']}) x 20 ms)",
            f"{f['async_efficiency']:.2f}",
            "(context)",
            "",
        ),
        (
            "fan-out: ideal / raw httpx wall, same 16 requests under the same semaphore",
            f"{f['raw_httpx_efficiency']:.2f}",
            "(ceiling)",
            "",
        ),
        ("fan-out: sync client wall / async client wall", f"{f['sync_over_async']:.1f}x", "", ""),
    ]
