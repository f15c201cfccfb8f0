"""peer_tracing: target (d): our tracing CPU against openinference-instrumentation-cohere's.

Cohere v2 shape, same 50 documents, same provider and exporter; skipped (and said so) when
cohere or the instrumentor is not installed.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from ..fixtures import (
    DOCS,
    MODEL,
    QUERY,
    LocalServer,
    candidates,
    sampled_out_provider,
    traced_provider,
)
from ..harness import Scale, interleaved, per_round
from ..report import Row, ratio, verdict

SCALE = {"peer_rounds": (9, 2), "peer_calls": (30, 5)}  # shared with peers

OURS_OFF = "ours: stage sampled out (Cohere shape)"
OURS_ON = "ours: stage traced (Cohere shape)"
CO_OFF = "cohere ClientV2.rerank, uninstrumented"
CO_ON = "cohere ClientV2.rerank + openinference-instrumentation-cohere"


def _their_span(co: Any, texts: list[str]) -> tuple[int, int]:
    """Attributes and OTLP bytes of one openinference-instrumentation-cohere rerank span."""
    from openinference.instrumentation.cohere import CohereInstrumentor
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from retrieval_stage.telemetry import DEFAULT_SPAN_ATTRIBUTE_LIMIT
    from retrieval_stage.telemetry.otlp_encoder import encode_spans_fast

    exporter = InMemorySpanExporter()  # configure_tracing's limits, so nothing is evicted
    provider = TracerProvider(
        span_limits=SpanLimits(max_span_attributes=DEFAULT_SPAN_ATTRIBUTE_LIMIT)
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = CohereInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        co.rerank(model=MODEL, query=QUERY, documents=texts)
    finally:
        instrumentor.uninstrument()
    spans = exporter.get_finished_spans()
    if len(spans) != 1:
        raise RuntimeError(f"the cohere instrumentor made {len(spans)} spans, not 1")
    return len(spans[0].attributes or {}), len(encode_spans_fast(spans))


def measure(server: LocalServer, scale: Scale) -> dict[str, Any]:
    """Our tracing's CPU per call against openinference-instrumentation-cohere's.

    Same 50 documents, same server (Cohere v2 shape), same provider: configure_tracing's
    BatchSpanProcessor and fast OTLP/HTTP exporter. Each side's tracing cost is its traced CPU
    minus its untraced CPU, per round: ours sampled out; theirs the cohere SDK's own `rerank`
    with the instrumentor's wrapper bypassed (`__wrapped__`).
    """
    try:
        import cohere
        from openinference.instrumentation.cohere import CohereInstrumentor
    except ImportError as exc:
        return {"skipped": f"not installed: {exc}"}
    from importlib.metadata import version

    from retrieval_stage import RerankClient, RerankStage

    cands = candidates(DOCS)
    texts = [c.text for c in cands]
    co = cohere.ClientV2(api_key="bench-key", base_url=server.url, timeout=30)
    their_attributes, their_bytes = _their_span(co, texts)
    traced = traced_provider(server)

    def ours(provider: Any) -> Any:
        client = RerankClient(server.url, provider="cohere", model=MODEL, api_key="bench-key")
        return RerankStage(client, tracer_provider=provider)

    ours_off, ours_on = ours(sampled_out_provider()), ours(traced)
    instrumentor = CohereInstrumentor()
    instrumentor.instrument(tracer_provider=traced)
    try:
        # the SDK's own method, past the instrumentor's wrapper
        untraced: Any = getattr(co.rerank, "__wrapped__")  # noqa: B009
        variants: dict[str, Callable[[], object]] = {
            OURS_OFF: lambda: ours_off.run(QUERY, cands),
            OURS_ON: lambda: ours_on.run(QUERY, cands),
            CO_OFF: lambda: untraced(model=MODEL, query=QUERY, documents=texts),
            CO_ON: lambda: co.rerank(model=MODEL, query=QUERY, documents=texts),
        }
        for fn in variants.values():
            for _ in range(10):
                fn()
        traced.force_flush()
        s = interleaved(
            variants,
            rounds=scale.peer_rounds,
            calls=scale.peer_calls,
            after_block={OURS_ON: traced.force_flush, CO_ON: traced.force_flush},
        )
    finally:
        instrumentor.uninstrument()
        traced.shutdown()
    ours_cost = [on - off for on, off in zip(s.cpu[OURS_ON], s.cpu[OURS_OFF], strict=True)]
    their_cost = [on - off for on, off in zip(s.cpu[CO_ON], s.cpu[CO_OFF], strict=True)]
    wall_ours = [on - off for on, off in zip(s.wall[OURS_ON], s.wall[OURS_OFF], strict=True)]
    wall_theirs = [on - off for on, off in zip(s.wall[CO_ON], s.wall[CO_OFF], strict=True)]
    return {
        "cpu_seconds_per_call": s.median_cpu(),
        "seconds_per_call": s.median_wall(),
        "tracing_cpu_us": {
            "ours": statistics.median(ours_cost) * 1e6,
            "theirs": statistics.median(their_cost) * 1e6,
        },
        "ours_over_theirs_cpu": per_round(ours_cost, their_cost),
        "ours_over_theirs_wall": per_round(wall_ours, wall_theirs),
        "their_attributes_per_span": their_attributes,
        "their_otlp_bytes_per_span": their_bytes,
        "versions": {
            "cohere": cohere.__version__,
            "openinference-instrumentation-cohere": version("openinference-instrumentation-cohere"),
        },
    }


def targets(p: dict[str, Any], results: dict[str, Any]) -> list[Row]:
    """(d) our tracing CPU / theirs <= 0.25x (nothing when the peer is not installed)."""
    if "skipped" in p:
        return []
    r = p["ours_over_theirs_cpu"]
    us = p["tracing_cpu_us"]
    return [
        (
            "(d) tracing CPU per call, ours / openinference-instrumentation-cohere over "
            f"cohere ClientV2.rerank ({us['ours']:.0f} us / {us['theirs']:.0f} us)",
            ratio(r),
            "<= 0.25x",
            verdict(r["median"] <= 0.25),
        )
    ]


def rows(p: dict[str, Any], results: dict[str, Any]) -> list[Row]:
    if "skipped" in p:
        return [("traced peer (openinference-instrumentation-cohere)", p["skipped"], "", "")]
    cpu = p["cpu_seconds_per_call"]
    return [
        (
            f"traced peer, CPU per call: {name}",
            f"{cpu[name] * 1e6:.0f} us",
            "(context)",
            "",
        )
        for name in (OURS_OFF, OURS_ON, CO_OFF, CO_ON)
    ] + [
        (
            "traced peer: tracing wall time per call, ours / theirs",
            ratio(p["ours_over_theirs_wall"]),
            "(context)",
            "",
        ),
        (
            "traced peer: attributes / OTLP bytes per span, theirs (ours: see breakdown)",
            f"{p['their_attributes_per_span']} / {p['their_otlp_bytes_per_span'] / 1024:.0f} KiB",
            "(context)",
            "",
        ),
    ]
