"""transports: the async client against raw aiohttp and raw httpx, side by side (issue 26).

Issue 26's targets, at 64 concurrent callers, 20 ms server latency, 50 documents per call, in one
run: `AsyncRerankClient` >= 0.85x a raw `aiohttp.ClientSession` loop's calls per second,
`RerankStage.arun` sampled out >= 0.8x, traced (every document exported through the fast OTLP
exporter to the benchmark server's loopback sink) >= 0.5x. For context, the same round also
runs raw httpx (default limits), httpx over `httpx-aiohttp`'s `AiohttpTransport`, and our client
driven through a caller's own `httpx.AsyncClient` (plain, and over `AiohttpTransport`: the other
way to put the client on aiohttp), and the traced stage with output documents as ids and scores
only (`output_content=False`), to show what the span's size costs. Every variant has its own
client, kept for the whole run, so a client that slows with age shows it in later rounds.
Variants take turns round by round, order rotating; ratios are per round, median and range
reported. CPU per call is process time (every thread, the exporter's included) over the block;
new connections per call come from the server's accept count.

The sync path's target (`RerankClient` <= 1.10x a raw `httpx.Client` call's CPU) is measured in
the same section, after the async rounds: both sequential at 0 ms, interleaved round by round.
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..fixtures import DOCS, QUERY, LocalServer, candidates, sampled_out_provider, traced_provider
from ..harness import Scale, drive, interleaved, per_round
from ..report import Row, verdict

SCALE = {
    "transports_rounds": (5, 1),
    "transports_calls": (1536, 256),
    "transports_sync_rounds": (9, 2),
    "transports_sync_calls": (100, 10),
}

CONCURRENCY = 64
DELAY_MS = 20

RAW_AIOHTTP = "raw aiohttp ClientSession"
RAW_HTTPX = "raw httpx AsyncClient"
RAW_HTTPX_AIOHTTP = "raw httpx AsyncClient + AiohttpTransport"
CLIENT = "AsyncRerankClient (default)"
CLIENT_HTTPX_AIOHTTP = "AsyncRerankClient, http_client=httpx + AiohttpTransport"
CLIENT_HTTPX = "AsyncRerankClient, http_client=httpx.AsyncClient()"
STAGE_OFF = "RerankStage.arun, sampled out"
STAGE_ON = "RerankStage.arun, traced (fast OTLP to loopback)"
STAGE_ON_IDS = "RerankStage.arun, traced, output_content=False"

TARGETS = {CLIENT: 0.85, STAGE_OFF: 0.8, STAGE_ON: 0.5}

SYNC_RAW = "raw httpx.Client"
SYNC_CLIENT = "RerankClient (sync)"
SYNC_TARGET = 1.10


def rounds_of(scale: Scale) -> tuple[int, int]:
    """Rounds, and calls per variant per round (a multiple of the concurrency)."""
    return scale.transports_rounds, scale.transports_calls // CONCURRENCY * CONCURRENCY


async def _measure(
    server: LocalServer,
    scale: Scale,
    extra: Callable[[str], dict[str, Callable[[], Awaitable[object]]]] | None = None,
) -> dict[str, dict[str, list[float]]]:
    import aiohttp
    import httpx
    from httpx_aiohttp import AiohttpTransport

    from retrieval_stage import AsyncRerankClient, RerankStage

    cands = candidates(DOCS)
    texts = [c.text for c in cands]
    base_url = server.delayed(DELAY_MS)
    url = base_url + "/rerank"
    payload = {"query": QUERY, "texts": texts}
    traced = traced_provider(server)

    session = aiohttp.ClientSession()
    raw_httpx = httpx.AsyncClient()
    raw_httpx_aiohttp = httpx.AsyncClient(transport=AiohttpTransport())
    own_httpx = httpx.AsyncClient()
    own_httpx_aiohttp = httpx.AsyncClient(transport=AiohttpTransport())
    stats_http = httpx.AsyncClient()
    clients = {
        CLIENT: AsyncRerankClient(base_url, batch_size=DOCS),
        CLIENT_HTTPX_AIOHTTP: AsyncRerankClient(
            base_url, batch_size=DOCS, http_client=own_httpx_aiohttp
        ),
        CLIENT_HTTPX: AsyncRerankClient(base_url, batch_size=DOCS, http_client=own_httpx),
    }
    off = RerankStage(
        AsyncRerankClient(base_url, batch_size=DOCS), tracer_provider=sampled_out_provider()
    )
    on = RerankStage(AsyncRerankClient(base_url, batch_size=DOCS), tracer_provider=traced)
    # The same span with output documents as ids and scores only (their text is on the input
    # documents): context for what the span's size costs, not a target.
    on_ids = RerankStage(
        AsyncRerankClient(base_url, batch_size=DOCS),
        tracer_provider=traced,
        output_content=False,
    )

    async def raw_aiohttp() -> object:
        async with session.post(url, json=payload) as response:
            return json.loads(await response.read())

    def raw_over(client: httpx.AsyncClient) -> Callable[[], Awaitable[object]]:
        async def call() -> object:
            return json.loads((await client.post(url, json=payload)).content)

        return call

    def ours(client: Any) -> Callable[[], Awaitable[object]]:
        return lambda: client.rerank(QUERY, texts)

    variants: dict[str, Callable[[], Awaitable[object]]] = {
        RAW_AIOHTTP: raw_aiohttp,
        RAW_HTTPX: raw_over(raw_httpx),
        RAW_HTTPX_AIOHTTP: raw_over(raw_httpx_aiohttp),
        **{name: ours(client) for name, client in clients.items()},
        STAGE_OFF: lambda: off.arun(QUERY, cands),
        STAGE_ON: lambda: on.arun(QUERY, cands),
        STAGE_ON_IDS: lambda: on_ids.arun(QUERY, cands),
    }
    if extra is not None:
        variants.update(extra(base_url))

    async def accepted() -> int:
        count: int = (await stats_http.get(server.url + "/stats")).json()["connections"]
        return count

    rounds, calls = rounds_of(scale)
    out: dict[str, dict[str, list[float]]] = {
        key: {name: [] for name in variants}
        for key in ("calls_per_second", "cpu_seconds_per_call", "new_connections")
    }
    try:
        for fn in variants.values():  # warm: connections, caches, the exporter's thread
            await drive(fn, CONCURRENCY * 4, CONCURRENCY)
        traced.force_flush()
        names = list(variants)
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                gc.collect()
                before = await accepted()
                started, cpu_started = time.perf_counter(), time.process_time()
                await drive(variants[name], calls, CONCURRENCY)
                if name in (STAGE_ON, STAGE_ON_IDS):
                    traced.force_flush()
                out["cpu_seconds_per_call"][name].append(
                    (time.process_time() - cpu_started) / calls
                )
                out["calls_per_second"][name].append(calls / (time.perf_counter() - started))
                out["new_connections"][name].append((await accepted() - before) / calls)
    finally:
        for client in (*clients.values(), off.reranker, on.reranker, on_ids.reranker):
            await client.aclose()
        for http in (raw_httpx, raw_httpx_aiohttp, own_httpx, own_httpx_aiohttp, stats_http):
            await http.aclose()
        await session.close()
        traced.shutdown()
    return out


def _measure_sync(server: LocalServer, scale: Scale) -> dict[str, list[float]]:
    """CPU seconds per call, per round: `RerankClient` and a raw `httpx.Client` loop, 0 ms."""
    import httpx

    from retrieval_stage import RerankClient

    texts = [c.text for c in candidates(DOCS)]
    url = server.url + "/rerank"
    with httpx.Client() as raw_http, RerankClient(server.url, batch_size=DOCS) as client:

        def raw() -> object:
            return json.loads(raw_http.post(url, json={"query": QUERY, "texts": texts}).content)

        variants: dict[str, Callable[[], object]] = {
            SYNC_RAW: raw,
            SYNC_CLIENT: lambda: client.rerank(QUERY, texts),
        }
        for fn in variants.values():  # warm connections and caches
            for _ in range(20):
                fn()
        rounds, calls = scale.transports_sync_rounds, scale.transports_sync_calls
        return interleaved(variants, rounds=rounds, calls=calls).cpu


def measure(
    server: LocalServer,
    scale: Scale,
    extra: Callable[[str], dict[str, Callable[[], Awaitable[object]]]] | None = None,
) -> dict[str, Any]:
    """Calls per second and CPU per call of every variant; the targets as per-round ratios."""
    samples = asyncio.run(_measure(server, scale, extra))
    sync_cpu = _measure_sync(server, scale)
    rates, cpu = samples["calls_per_second"], samples["cpu_seconds_per_call"]
    return {
        "concurrency": CONCURRENCY,
        "delay_ms": DELAY_MS,
        "samples": samples,
        "calls_per_second": {n: statistics.median(v) for n, v in rates.items()},
        "cpu_us_per_call": {n: statistics.median(v) * 1e6 for n, v in cpu.items()},
        "new_connections_per_call": {
            n: statistics.median(v) for n, v in samples["new_connections"].items()
        },
        "over_raw_aiohttp": {n: per_round(v, rates[RAW_AIOHTTP]) for n, v in rates.items()},
        "over_raw_httpx": {n: per_round(v, rates[RAW_HTTPX]) for n, v in rates.items()},
        "tracing_cpu_in_raw_aiohttp_calls": _extra_cost(cpu),
        "sync_cpu_samples": sync_cpu,
        "sync_cpu_us_per_call": {n: statistics.median(v) * 1e6 for n, v in sync_cpu.items()},
        "sync_client_cpu_over_raw": per_round(sync_cpu[SYNC_CLIENT], sync_cpu[SYNC_RAW]),
    }


def _extra_cost(cpu: dict[str, list[float]]) -> dict[str, float]:
    """Per round, (traced - sampled out) CPU per call in raw aiohttp calls of CPU."""
    ratios = sorted(
        (on - off) / raw
        for on, off, raw in zip(cpu[STAGE_ON], cpu[STAGE_OFF], cpu[RAW_AIOHTTP], strict=True)
    )
    return {"median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1]}


def targets(t: dict[str, Any], results: dict[str, Any]) -> list[Row]:
    """Issue 26's three throughput targets, each a per-round ratio to raw aiohttp."""
    out: list[Row] = []
    at = f"@{t['concurrency']}, {t['delay_ms']} ms"
    for name, target in TARGETS.items():
        ratio = t["over_raw_aiohttp"][name]
        out.append(
            (
                f"{name} / raw aiohttp, calls/s {at}",
                f"{ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f})",
                f">= {target}x",
                verdict(ratio["median"] >= target),
            )
        )
    sync = t.get("sync_client_cpu_over_raw")
    if sync is not None:  # results saved before the sync row existed lack it
        out.append(
            (
                f"{SYNC_CLIENT} / {SYNC_RAW}, CPU per call, sequential, 0 ms",
                f"{sync['median']:.2f}x ({sync['min']:.2f}-{sync['max']:.2f})",
                f"<= {SYNC_TARGET}x",
                verdict(sync["median"] <= SYNC_TARGET),
            )
        )
    return out


def rows(t: dict[str, Any], results: dict[str, Any]) -> list[Row]:
    """The tracing CPU in raw aiohttp calls, then every variant's rate, CPU and connections."""
    out: list[Row] = []
    at = f"@{t['concurrency']}, {t['delay_ms']} ms"
    extra = t["tracing_cpu_in_raw_aiohttp_calls"]
    out.append(
        (
            f"async tracing CPU per call (traced - sampled out) {at}, in raw aiohttp calls",
            f"{extra['median']:.2f} ({extra['min']:.2f}-{extra['max']:.2f})",
            "(context)",
            "",
        )
    )
    for name in t["calls_per_second"]:
        vs_httpx = t["over_raw_httpx"][name]["median"]
        out.append(
            (
                f"{name} {at}: calls/s, CPU us/call, new connections/call, / raw httpx",
                f"{t['calls_per_second'][name]:.0f}, {t['cpu_us_per_call'][name]:.0f}, "
                f"{t['new_connections_per_call'][name]:.2f}, {vs_httpx:.2f}x",
                "(context)",
                "",
            )
        )
    for name, us in t.get("sync_cpu_us_per_call", {}).items():
        out.append((f"{name}, sequential, 0 ms: CPU us/call", f"{us:.0f}", "(context)", ""))
    return out
