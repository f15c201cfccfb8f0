"""overhead: targets (a) and (b): what tracing costs a sync 50-document call, TEI shape.

At 0 ms server latency: the CPU tracing adds, in raw httpx calls of CPU, with the fast OTLP
encoder and the SDK's (``RETRIEVAL_STAGE_FAST_OTLP=0``), ``output_content=False`` and documents
hidden beside; at 0, 10 and 20 ms: wall time traced / sampled out.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..fixtures import DOCS, QUERY, LocalServer, candidates, sampled_out_provider, traced_provider
from ..harness import Samples, Scale, interleaved, per_round, per_round_extra
from ..report import Row, ratio, verdict

SCALE = {
    "overhead_rounds": (15, 3),
    "overhead_calls": (60, 10),
    "latency_rounds": (9, 2),
    "latency_calls": (20, 5),
}

RAW = "raw httpx"
CLIENT = "RerankClient"
OFF = "stage, sampled out"
ON = "stage, traced (fast OTLP)"
ON_SDK = "stage, traced (RETRIEVAL_STAGE_FAST_OTLP=0)"
ON_LEAN = "stage, traced, output_content=False"
HIDDEN = "stage, traced, documents hidden"
TRACED = (ON, ON_SDK, ON_LEAN, HIDDEN)


def _overhead_at(
    server: LocalServer, delay_ms: int, rounds: int, calls: int, *, full: bool
) -> Samples:
    """Per-round seconds per call (wall and CPU) of raw httpx and our layers, behind `delay_ms`.

    `full` adds the client alone, the stage with output content off and with documents hidden.
    """
    import httpx
    from openinference.instrumentation import TraceConfig

    from retrieval_stage import RerankClient, RerankStage

    base_url = server.delayed(delay_ms) if delay_ms else server.url
    cands = candidates(DOCS)
    texts = [c.text for c in cands]
    raw_http = httpx.Client()
    url = base_url + "/rerank"

    def raw() -> object:
        response = raw_http.post(url, json={"query": QUERY, "texts": texts})
        return json.loads(response.content)

    def stage(provider: Any, **kwargs: Any) -> Any:
        # batch_size=DOCS: one request per call on every side (TEI's own default cap is 32).
        return RerankStage(
            RerankClient(base_url, batch_size=DOCS), tracer_provider=provider, **kwargs
        )

    client = RerankClient(base_url, batch_size=DOCS)
    fast, sdk = traced_provider(server), traced_provider(server, fast=False)
    stage_off, stage_on, stage_sdk = stage(sampled_out_provider()), stage(fast), stage(sdk)
    variants: dict[str, Callable[[], object]] = {
        RAW: raw,
        OFF: lambda: stage_off.run(QUERY, cands),
        ON: lambda: stage_on.run(QUERY, cands),
        ON_SDK: lambda: stage_sdk.run(QUERY, cands),
    }
    flush = {ON: fast.force_flush, ON_SDK: sdk.force_flush}
    if full:
        stage_lean = stage(fast, output_content=False)
        stage_hidden = stage(fast, trace_config=TraceConfig(hide_inputs=True, hide_outputs=True))
        variants[CLIENT] = lambda: client.rerank(QUERY, texts)
        variants[ON_LEAN] = lambda: stage_lean.run(QUERY, cands)
        variants[HIDDEN] = lambda: stage_hidden.run(QUERY, cands)
        flush |= {ON_LEAN: fast.force_flush, HIDDEN: fast.force_flush}
    for fn in variants.values():  # warm connections and caches
        for _ in range(10):
            fn()
    fast.force_flush()
    sdk.force_flush()
    samples = interleaved(variants, rounds=rounds, calls=calls, after_block=flush)
    fast.shutdown()
    sdk.shutdown()
    raw_http.close()
    client.close()
    return samples


def measure(server: LocalServer, scale: Scale) -> dict[str, Any]:
    """Sync, TEI shape, 50 documents: the CPU tracing costs, and traced / sampled out by latency.

    At 0 ms server latency every variant runs, and CPU time (process time, the exporter's
    thread included) gives tracing's cost in raw httpx calls: per round,
    (CPU traced - CPU sampled out) / CPU raw. At 0, 10 and 20 ms the wall-time ratio traced /
    sampled out is what a caller feels.
    """
    at0 = _overhead_at(server, 0, scale.overhead_rounds, scale.overhead_calls, full=True)
    result: dict[str, Any] = {
        "seconds_per_call": at0.median_wall(),
        "cpu_seconds_per_call": at0.median_cpu(),
        "samples": {"wall": at0.wall, "cpu": at0.cpu},
        "ratio_to_raw": {n: per_round(v, at0.wall[RAW]) for n, v in at0.wall.items()},
        "cpu_ratio_to_raw": {n: per_round(v, at0.cpu[RAW]) for n, v in at0.cpu.items()},
        "tracing_cpu_in_raw_calls": {
            n: per_round_extra(at0.cpu[n], at0.cpu[OFF], at0.cpu[RAW]) for n in TRACED
        },
        "traced_over_sampled_out": {0: {n: per_round(at0.wall[n], at0.wall[OFF]) for n in TRACED}},
    }
    for delay in (10, 20):
        s = _overhead_at(server, delay, scale.latency_rounds, scale.latency_calls, full=False)
        result["traced_over_sampled_out"][delay] = {
            n: per_round(s.wall[n], s.wall[OFF]) for n in (ON, ON_SDK)
        }
        result[f"seconds_per_call_{delay}ms"] = s.median_wall()
        result[f"tracing_cpu_in_raw_calls_{delay}ms"] = {
            n: per_round_extra(s.cpu[n], s.cpu[OFF], s.cpu[RAW]) for n in (ON, ON_SDK)
        }
    return result


def targets(o: dict[str, Any], results: dict[str, Any]) -> list[Row]:
    """(a) tracing CPU in raw calls; (b) wall time traced / sampled out at 0, 10, 20 ms."""
    cost = o["tracing_cpu_in_raw_calls"][ON]
    raw_us = o["cpu_seconds_per_call"][RAW] * 1e6
    out: list[Row] = [
        (
            f"(a) tracing CPU per traced 50-document call, exported (BSP + fast OTLP/HTTP), "
            f"in raw httpx calls of CPU (1 = {raw_us:.0f} us)",
            ratio(o["tracing_cpu_in_raw_calls"][ON], suffix=""),
            "<= 0.50",
            verdict(cost["median"] <= 0.5),
        )
    ]
    for delay, limit in ((0, 1.5), (10, 1.03), (20, 1.02)):
        r = o["traced_over_sampled_out"][delay][ON]
        out.append(
            (
                f"(b) wall time traced / sampled out, {delay} ms server latency",
                ratio(r, 3 if delay else 2),
                f"<= {limit}x",
                verdict(r["median"] <= limit),
            )
        )
    return out


def rows(o: dict[str, Any], results: dict[str, Any]) -> list[Row]:
    cpu, wall = o["cpu_ratio_to_raw"], o["ratio_to_raw"]
    out: list[Row] = []
    for name in (CLIENT, OFF, ON, ON_SDK, ON_LEAN, HIDDEN):
        out.append(
            (
                f"0 ms, {name} / raw httpx: wall, CPU",
                f"{ratio(wall[name])}, {ratio(cpu[name])}",
                "",
                "",
            )
        )
    for name in (ON_SDK, ON_LEAN, HIDDEN):
        out.append(
            (
                f"tracing CPU in raw httpx calls, {name}",
                ratio(o["tracing_cpu_in_raw_calls"][name], suffix=""),
                "(context)",
                "",
            )
        )
    for delay in (10, 20):
        out.append(
            (
                f"tracing CPU in raw httpx calls at {delay} ms, fast / SDK encoder",
                f"{o[f'tracing_cpu_in_raw_calls_{delay}ms'][ON]['median']:.2f} / "
                f"{o[f'tracing_cpu_in_raw_calls_{delay}ms'][ON_SDK]['median']:.2f}",
                "(context)",
                "",
            )
        )
    for delay in (0, 10, 20):
        out.append(
            (
                f"wall time traced / sampled out at {delay} ms, RETRIEVAL_STAGE_FAST_OTLP=0",
                ratio(o["traced_over_sampled_out"][delay][ON_SDK], 3),
                "(context)",
                "",
            )
        )
    return out
