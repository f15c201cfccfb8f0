"""The SDK's OTLP trace encoder against ours, side by side in one run.

``python -m benchmarks.studies.encoder [--rounds N] [--profile]``

Encodes the same finished spans with ``encode_spans(spans).SerializePartialToString()`` (the
SDK's OTLP/HTTP exporter does exactly this) and with `retrieval_stage.telemetry.otlp_encoder`, in
interleaved rounds so both see the same machine load, and prints the median process CPU per
span of each and their ratio. Two workloads: one 50-document RERANKER span as `RerankStage`
writes it (a fake reranker, no HTTP), and a 64-span batch of such spans (what a
BatchSpanProcessor hands its exporter under load). ``--profile`` prints cProfile's top entries
for our encoder on the batch.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ..fixtures import DOCS, QUERY, candidates


class _Reverse:
    """A reranker without I/O: the candidates reversed, with descending scores."""

    provider = "tei"
    model_name = "bge-reranker-base"

    def rerank(self, query: str, items: Sequence[Any], **_: Any) -> list[tuple[Any, float]]:
        return [(item, 1.0 - i / 100) for i, item in enumerate(reversed(items))]


def reranker_spans(count: int) -> Sequence[ReadableSpan]:
    """`count` finished 50-document RERANKER spans, with configure_tracing's resource and limits."""
    from retrieval_stage import RerankStage

    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "retrieval-stage"}),
        span_limits=SpanLimits(max_span_attributes=2048),
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    stage = RerankStage(_Reverse(), tracer_provider=provider)
    cands = candidates(DOCS)
    for _ in range(count):
        stage.run(QUERY, cands)
    return exporter.get_finished_spans()


def _cpu_per_call_us(fn: Callable[[], object], calls: int) -> float:
    started = time.process_time_ns()
    for _ in range(calls):
        fn()
    return (time.process_time_ns() - started) / calls / 1000


def compare(spans: Sequence[ReadableSpan], rounds: int, calls: int) -> dict[str, float]:
    """Median CPU µs per span of each encoder over interleaved rounds (order alternating)."""
    from retrieval_stage.telemetry.otlp_encoder import encode_spans_fast, sdk_serialize_spans

    assert encode_spans_fast(spans) == sdk_serialize_spans(spans), "outputs differ"
    contenders: dict[str, Callable[[], object]] = {
        "sdk": lambda: sdk_serialize_spans(spans),
        "fast": lambda: encode_spans_fast(spans),
    }
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for fn in contenders.values():  # warm-up: caches, allocator
        _cpu_per_call_us(fn, 2)
    for r in range(rounds):
        order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
        for name in order:
            samples[name].append(_cpu_per_call_us(contenders[name], calls) / len(spans))
    sdk = statistics.median(samples["sdk"])
    fast = statistics.median(samples["fast"])
    return {"sdk_us": sdk, "fast_us": fast, "ratio": fast / sdk}


def main(argv: list[str] | None = None) -> int:
    """Command line: print the table (and optionally a profile of our encoder)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.studies.encoder", description=__doc__
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    from retrieval_stage.telemetry.otlp_encoder import encode_spans_fast

    one = reranker_spans(1)
    batch = reranker_spans(64)
    attributes = len(one[0].attributes or {})
    size = len(encode_spans_fast(one))
    print(f"50-document RERANKER span: {attributes} attributes, {size} bytes encoded")
    print("| workload | SDK encode_spans µs/span | fast µs/span | fast / SDK |")
    print("|---|---:|---:|---:|")
    for label, spans, calls in (("1 span", one, 20), ("64-span batch", batch, 1)):
        r = compare(spans, args.rounds, calls)
        print(f"| {label} | {r['sdk_us']:.0f} | {r['fast_us']:.0f} | {r['ratio']:.2f} |")
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(10):
            encode_spans_fast(batch)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(12)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
