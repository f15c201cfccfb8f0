"""throughput: target (c): async calls per second at 64 concurrent behind 20 ms (and 0 ms).

Raw `httpx.AsyncClient` + `json.loads`, `RerankStage.arun` sampled out and traced, every
variant on httpx's default pool; per round calls/s, CPU per call and new TCP connections.
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
from ..harness import Scale, drive, per_round
from ..report import Row, ratio, verdict

SCALE = {
    "throughput_rounds": (5, 1),
    "throughput_rounds_0ms": (3, 1),  # context only; the target is at 20 ms
    "throughput_calls": (1536, 256),  # a multiple of 64
}

T_RAW = "raw httpx AsyncClient"
T_OFF = "RerankStage.arun, sampled out"
T_ON = "RerankStage.arun, traced (fast OTLP)"


def _throughput_at(
    server: LocalServer, scale: Scale, delay_ms: int, concurrency: int, rounds: int
) -> dict[str, dict[str, list[float]]]:
    """Per-round calls per second and CPU seconds per call of each variant behind `delay_ms`."""
    import httpx

    from retrieval_stage import AsyncRerankClient, RerankStage

    cands = candidates(DOCS)
    texts = [c.text for c in cands]
    base_url = server.delayed(delay_ms) if delay_ms else server.url
    traced = traced_provider(server)

    async def main() -> dict[str, dict[str, list[float]]]:
        raw_http = httpx.AsyncClient()
        url = base_url + "/rerank"
        stats_http = httpx.AsyncClient()  # its own connection, opened once

        async def stats() -> dict[str, int]:
            counts: dict[str, int] = (await stats_http.get(server.url + "/stats")).json()
            return counts

        async def raw() -> object:
            response = await raw_http.post(url, json={"query": QUERY, "texts": texts})
            return json.loads(response.content)

        on = RerankStage(AsyncRerankClient(base_url, batch_size=DOCS), tracer_provider=traced)
        off = RerankStage(
            AsyncRerankClient(base_url, batch_size=DOCS), tracer_provider=sampled_out_provider()
        )
        variants: dict[str, Callable[[], Awaitable[object]]] = {
            T_RAW: raw,
            T_OFF: lambda: off.arun(QUERY, cands),
            T_ON: lambda: on.arun(QUERY, cands),
        }
        for fn in variants.values():
            await drive(fn, concurrency * 4, concurrency)
        traced.force_flush()
        rates: dict[str, list[float]] = {name: [] for name in variants}
        cpu: dict[str, list[float]] = {name: [] for name in variants}
        opened: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        calls = scale.throughput_calls // concurrency * concurrency
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                gc.collect()
                connections = (await stats())["connections"]
                started, cpu_started = time.perf_counter(), time.process_time()
                await drive(variants[name], calls, concurrency)
                if name == T_ON:
                    traced.force_flush()
                cpu[name].append((time.process_time() - cpu_started) / calls)
                rates[name].append(calls / (time.perf_counter() - started))
                opened[name].append(((await stats())["connections"] - connections) / calls)
        await raw_http.aclose()
        await stats_http.aclose()
        return {"calls_per_second": rates, "cpu_seconds_per_call": cpu, "new_connections": opened}

    samples = asyncio.run(main())
    traced.shutdown()
    return samples


def measure(server: LocalServer, scale: Scale, concurrency: int = 64) -> dict[str, Any]:
    """Async calls per second at 64 concurrency, 20 ms server latency (and 0 ms for context).

    Every variant gets httpx's default pool limits (the client's default too). Ratios are taken
    round by round (each round runs every variant once, back to back), median and range
    reported, because httpx's own rate at this concurrency swings between runs. CPU per call
    (process time, the exporter's thread included) says whether a variant is CPU-bound.
    """
    result: dict[str, Any] = {"concurrency": concurrency}
    for delay, rounds in ((20, scale.throughput_rounds), (0, scale.throughput_rounds_0ms)):
        s = _throughput_at(server, scale, delay, concurrency, rounds)
        rates, cpu = s["calls_per_second"], s["cpu_seconds_per_call"]
        result[f"{delay}ms"] = {
            "samples": s,
            "calls_per_second": {n: statistics.median(v) for n, v in rates.items()},
            "cpu_us_per_call": {n: statistics.median(v) * 1e6 for n, v in cpu.items()},
            "new_connections_per_call": {
                n: statistics.median(v) for n, v in s["new_connections"].items()
            },
            "sampled_out_over_raw": per_round(rates[T_OFF], rates[T_RAW]),
            "traced_over_sampled_out": per_round(rates[T_ON], rates[T_OFF]),
            "traced_over_raw": per_round(rates[T_ON], rates[T_RAW]),
        }
    return result


def targets(t: dict[str, Any], results: dict[str, Any]) -> list[Row]:
    """(c) at 20 ms: sampled out / raw >= 0.8x, traced / sampled out >= 0.9x."""
    at20 = t["20ms"]
    off, on = at20["sampled_out_over_raw"], at20["traced_over_sampled_out"]
    return [
        (
            f"(c) throughput @{t['concurrency']}, 20 ms: stage sampled out / raw httpx "
            "AsyncClient loop",
            ratio(off, 3),
            ">= 0.80x",
            verdict(off["median"] >= 0.8),
        ),
        (
            f"(c) throughput @{t['concurrency']}, 20 ms: stage traced / stage sampled out",
            ratio(on, 3),
            ">= 0.90x",
            verdict(on["median"] >= 0.9),
        ),
    ]


def rows(t: dict[str, Any], results: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    for delay in ("20ms", "0ms"):
        d = t[delay]
        rates, cpu = d["calls_per_second"], d["cpu_us_per_call"]
        out.append(
            (
                f"throughput @{t['concurrency']}, {delay}: calls/s raw, sampled out, traced",
                " / ".join(f"{rates[n]:.0f}" for n in (T_RAW, T_OFF, T_ON)),
                "(context)",
                "",
            )
        )
        out.append(
            (
                f"throughput @{t['concurrency']}, {delay}: CPU us/call raw, sampled out, traced",
                " / ".join(f"{cpu[n]:.0f}" for n in (T_RAW, T_OFF, T_ON)),
                "(context)",
                "",
            )
        )
        opened = d["new_connections_per_call"]
        out.append(
            (
                f"throughput @{t['concurrency']}, {delay}: new TCP connections per call "
                "(httpx keeps 20 idle), raw, sampled out, traced",
                " / ".join(f"{opened[n]:.2f}" for n in (T_RAW, T_OFF, T_ON)),
                "(context)",
                "",
            )
        )
        if delay == "0ms":
            out.append(
                (
                    f"throughput @{t['concurrency']}, 0 ms: "
                    "sampled out / raw; traced / sampled out",
                    f"{ratio(d['sampled_out_over_raw'])}; {ratio(d['traced_over_sampled_out'])}",
                    "(context)",
                    "",
                )
            )
    return out
