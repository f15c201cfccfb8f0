"""pool: context for throughput: httpx's default pool against one keeping 64 connections idle.

Raw httpx at 64 concurrent behind 20 ms; calls/s, CPU per call and new TCP connections per
call show why every throughput variant keeps httpx's default.
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..fixtures import DOCS, QUERY, LocalServer, candidates
from ..harness import Scale, drive
from ..report import Row

SCALE = {"pool_rounds": (3, 1), "pool_calls": (1024, 256)}

POOL_LIMITS = {"httpx default (20 kept idle)": 20, "64 kept idle": 64}


def measure(server: LocalServer, scale: Scale, concurrency: int = 64) -> dict[str, Any]:
    """Raw httpx at 64 concurrent behind 20 ms: the default pool against one keeping 64 idle.

    With 20 kept idle, answers arriving in waves of 64 close the surplus and the next wave
    reconnects; keeping 64 idle stops that, but httpcore then scans more connections (each a
    socket readability check) for every request. CPU per call and new TCP connections per call
    say which costs more; this is why every throughput variant keeps httpx's default.
    """
    import httpx

    texts = [c.text for c in candidates(DOCS)]
    url = server.delayed(20) + "/rerank"

    async def main() -> dict[str, dict[str, list[float]]]:
        stats_http = httpx.AsyncClient()
        clients = {
            name: httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=idle))
            for name, idle in POOL_LIMITS.items()
        }
        out: dict[str, dict[str, list[float]]] = {
            name: {"calls_per_second": [], "cpu_us_per_call": [], "new_connections_per_call": []}
            for name in clients
        }

        def caller(client: httpx.AsyncClient) -> Callable[[], Awaitable[object]]:
            async def call() -> object:
                response = await client.post(url, json={"query": QUERY, "texts": texts})
                return json.loads(response.content)

            return call

        async def opened() -> int:
            count: int = (await stats_http.get(server.url + "/stats")).json()["connections"]
            return count

        for client in clients.values():
            await drive(caller(client), concurrency * 4, concurrency)
        calls = scale.pool_calls // concurrency * concurrency
        for _ in range(scale.pool_rounds):
            for name, client in clients.items():
                gc.collect()
                before, cpu = await opened(), time.process_time()
                rate = await drive(caller(client), calls, concurrency)
                out[name]["cpu_us_per_call"].append((time.process_time() - cpu) / calls * 1e6)
                out[name]["calls_per_second"].append(rate)
                out[name]["new_connections_per_call"].append((await opened() - before) / calls)
        for client in (*clients.values(), stats_http):
            await client.aclose()
        return out

    samples = asyncio.run(main())
    return {
        "samples": samples,
        "median": {
            name: {key: statistics.median(v) for key, v in values.items()}
            for name, values in samples.items()
        },
    }


def rows(p: dict[str, Any], results: dict[str, Any]) -> list[Row]:
    return [
        (
            f"raw httpx @64, 20 ms, {name}: calls/s, CPU us/call, new connections/call",
            f"{m['calls_per_second']:.0f}, {m['cpu_us_per_call']:.0f}, "
            f"{m['new_connections_per_call']:.2f}",
            "(context)",
            "",
        )
        for name, m in p["median"].items()
    ]
