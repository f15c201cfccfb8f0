"""breakdown: context: where a traced call's CPU goes, measured in-process (no HTTP).

The stage over an in-memory reranker sampled out and recording on an SDK provider with no
processor; our document attributes alone (`spans.fit.outcome_attributes` with no stats); the
OTLP encoding of one finished span by the SDK's encoder and by ours, and whether the bytes are
equal. Shown in raw httpx calls of CPU when overhead ran too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..fixtures import DOCS, MODEL, QUERY, LocalServer, candidates, sampled_out_provider
from ..harness import Scale, interleaved
from ..report import Row
from .overhead import RAW

SCALE = {"breakdown_rounds": (9, 2)}

SDK_ENCODE = "OTLP encoding per span, SDK encode_spans + SerializePartialToString"
FAST_ENCODE = "OTLP encoding per span, our encode_spans_fast"


def measure(server: LocalServer, scale: Scale) -> dict[str, Any]:
    """Where a traced call's extra time goes, per 50-document call, measured in-process.

    The stage runs over an in-memory reranker (no HTTP) so that only its own work is timed:
    sampled out, and recording on an SDK provider with no processor; then our document
    attributes alone (`outcome_attributes` with no stats, so only the 50 input and 50 output
    documents), and the OTLP protobuf encoding of the finished spans by the SDK's encoder and
    by ours. CPU time (process time) per call.
    """
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from retrieval_stage import RerankStage
    from retrieval_stage.models import Reranked, RerankResponse
    from retrieval_stage.protocols import map_results
    from retrieval_stage.spans.fit import outcome_attributes
    from retrieval_stage.telemetry import DEFAULT_SPAN_ATTRIBUTE_LIMIT
    from retrieval_stage.telemetry.otlp_encoder import encode_spans_fast, sdk_serialize_spans

    cands = candidates(DOCS)
    scored = [(c, 1.0 - ((i * 7919) % DOCS) / DOCS) for i, c in enumerate(cands)]

    class InMemory:
        """A reranker answering at once, shaped like our clients."""

        model_name = MODEL
        provider = "tei"

        def rerank(self, query: str, items: Any, **_: Any) -> Any:
            return list(scored)

        def rerank_response(self, query: str, items: Any, **_: Any) -> Any:
            return RerankResponse(results=list(scored), requests=1, batches=1)

    limits = SpanLimits(max_span_attributes=DEFAULT_SPAN_ATTRIBUTE_LIMIT)
    recording = TracerProvider(span_limits=limits)
    memory_exporter = InMemorySpanExporter()
    collecting = TracerProvider(span_limits=limits)
    collecting.add_span_processor(SimpleSpanProcessor(memory_exporter))
    off = RerankStage(InMemory(), tracer_provider=sampled_out_provider())
    on = RerankStage(InMemory(), tracer_provider=recording)
    outputs = [Reranked(cands[i], score, i) for i, score in map_results(cands, scored)]
    span = recording.get_tracer("bench").start_span("rerank")
    config = on.trace_config
    for _ in range(10):
        RerankStage(InMemory(), tracer_provider=collecting).run(QUERY, cands)
    finished = list(memory_exporter.get_finished_spans())
    per_span = 1.0 / len(finished)
    variants: dict[str, Callable[[], object]] = {
        "stage, sampled out (own work)": lambda: off.run(QUERY, cands),
        "stage, recording, no processor (own work + SDK attributes)": lambda: on.run(QUERY, cands),
        "outcome_attributes, documents only (ours)": lambda: outcome_attributes(
            span, {}, cands, outputs, config=config, max_content_length=2000
        ),
        "outcome_attributes, documents only, output_content=False (ours)": lambda: (
            outcome_attributes(
                span,
                {},
                cands,
                outputs,
                config=config,
                max_content_length=2000,
                output_content=False,
            )
        ),
        SDK_ENCODE: lambda: sdk_serialize_spans(finished),
        FAST_ENCODE: lambda: encode_spans_fast(finished),
    }
    t = interleaved(variants, rounds=scale.breakdown_rounds, calls=20).median_cpu()
    t[SDK_ENCODE] *= per_span
    t[FAST_ENCODE] *= per_span
    span.end()
    collecting.shutdown()
    return {
        "cpu_seconds_per_call": t,
        "attributes_per_span": len(finished[0].attributes or {}),
        "otlp_bytes_per_span": len(encode_spans_fast(finished)) * per_span,
        "fast_equals_sdk": encode_spans_fast(finished) == sdk_serialize_spans(finished),
    }


def rows(b: dict[str, Any], results: dict[str, Any]) -> list[Row]:
    """Each figure in µs, and in raw httpx calls of CPU when the overhead section ran too."""
    raw_cpu = results.get("overhead", {}).get("cpu_seconds_per_call", {}).get(RAW)
    out: list[Row] = []
    for name, seconds in b["cpu_seconds_per_call"].items():
        share = f" = {seconds / raw_cpu:.2f} raw calls" if raw_cpu else ""
        out.append((f"breakdown (CPU): {name}", f"{seconds * 1e6:.0f} us{share}", "", ""))
    attributes = b["attributes_per_span"]
    for name in (SDK_ENCODE, FAST_ENCODE):
        seconds = b["cpu_seconds_per_call"][name]
        out.append(
            (
                f"breakdown (CPU): {name}, per attribute ({attributes} per span)",
                f"{seconds * 1e9 / attributes:.0f} ns",
                "",
                "",
            )
        )
    out.append(
        (
            "breakdown: attributes / OTLP bytes per 50-document span; fast bytes == SDK bytes",
            f"{b['attributes_per_span']} / {b['otlp_bytes_per_span'] / 1024:.0f} KiB; "
            f"{b['fast_equals_sdk']}",
            "",
            "",
        )
    )
    return out
