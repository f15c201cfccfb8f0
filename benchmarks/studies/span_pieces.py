"""What each piece of a recording RERANKER span costs in process, and per attribute (issue 38).

``python -m benchmarks.studies.span_pieces [--rounds R] [--calls N] [--batch B]``

No I/O: `span_cost.Instant` answers 50 documents (`fixtures.candidates`) at once, so what is
timed is the stage's own CPU on its thread (``time.thread_time``), min of R rounds of N calls,
every variant once per round in turn. Three parts:

- **pieces on the caller's thread**: `RerankStage.arun` sampled out (``ALWAYS_OFF``), recording
  (a limit of 2,048 attributes, so every document is kept; no span processor), and recording
  with one piece of the span writer replaced by a no-op, one at a time: the name each piece
  has in the module that calls it is swapped for the duration of the block and restored.
  A piece's cost is recording minus recording without it (the documents' record planned, kept
  on the span, the outcome stored, ``output.value``, the quality signals, the context
  attributes); what the pieces leave is the SDK span's own life (start, context attach and
  detach, identity attributes, end) and the outcome's few values.
- **per attribute**: writing the finished span's outcome as the writer does (`fit.outcome_plan`,
  `deferred.write_outcome`) against the SDK's floor for the same span's attributes
  (``span.set_attributes`` on a fresh span with the same limit), per attribute the span ends up
  with.
- **exporter thread**: `otlp_encoder.serialize_spans` per span over a batch of B finished spans
  (512: the BatchSpanProcessor's default batch), as the exporter meets them (the documents a
  record) and flattened, with the C loops and the Python ones, and the SDK's `encode_spans`.
- **the documents** (`documents`): what the writer plans on the caller's thread, what
  flattening them costs wherever it happens, and encoding them from the record (C) against
  encoding the flattened mapping (C, Python).

The machine is shared: the run prints the load average; read pieces of a few µs as noise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import timeit
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .. import guard
from ..fixtures import DOCS, QUERY, candidates
from .span_cost import Instant, per_call

LIMIT = 2048
"""Every document fits: the span as `configure_tracing`'s providers keep it."""

_OVERLAPPING = "\0"
"""The prefix of a piece whose cost overlaps another's, left out of the sum that leaves "the
rest" (none since the documents became a record: planning it and storing it are apart)."""


@contextmanager
def _without(module: Any, name: str, replacement: Any) -> Iterator[None]:
    """`module.name` is `replacement` inside the block, whatever happens in it."""
    saved = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, saved)


def _knockouts() -> dict[str, tuple[Any, str, Any]]:
    """Each piece: the module that calls it, the name it is called by, a no-op in its place."""
    from retrieval_stage import stage
    from retrieval_stage.spans import fit, reranker

    empty = fit.DocumentsRecord([], 0, None, None, (), (), (), 0)
    return {
        "the documents' record planned (fit._plan)": (fit, "_plan", lambda *a: empty),
        "the outcome stored and the record kept (deferred.write_outcome)": (
            reranker,
            "write_outcome",
            lambda *a, **k: None,
        ),
        "output.value JSON (output_value)": (reranker, "output_value", lambda *a, **k: "{}"),
        "quality signals (stage.rerank_quality)": (stage, "rerank_quality", lambda *a, **k: None),
        "context attributes (context_attributes)": (reranker, "context_attributes", dict),
    }


def pieces(rounds: int, calls: int) -> dict[str, float]:
    """Min over rounds of thread-CPU µs per call for each variant."""
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    from retrieval_stage import RerankStage

    cands = candidates(DOCS)
    off = RerankStage(Instant(), tracer_provider=TracerProvider(sampler=ALWAYS_OFF))
    on = RerankStage(
        Instant(), tracer_provider=TracerProvider(span_limits=SpanLimits(max_span_attributes=LIMIT))
    )
    knockouts = _knockouts()
    clock = time.thread_time
    for stage in (off, on):
        per_call(stage, cands, 20, clock)
    best: dict[str, float] = {}

    def keep(name: str, value: float) -> None:
        best[name] = min(best.get(name, value), value)

    for _ in range(rounds):
        keep("sampled out", per_call(off, cands, calls, clock))
        keep("recording", per_call(on, cands, calls, clock))
        for name, (module, attr, replacement) in knockouts.items():
            with _without(module, attr, replacement):
                keep(name, per_call(on, cands, calls, clock))
    return best


def _finished_spans(count: int) -> list[Any]:
    """`count` finished RERANKER spans as the stage writes them (every document kept)."""
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from retrieval_stage import RerankStage

    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=LIMIT))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    stage = RerankStage(Instant(), tracer_provider=provider)
    cands = candidates(DOCS)

    async def loop() -> None:
        for _ in range(count):
            await stage.arun(QUERY, cands)

    asyncio.run(loop())
    return list(exporter.get_finished_spans())


def _best(fn: Callable[[], object], number: int, rounds: int) -> float:
    """Min over rounds of seconds per call (`timeit` turns the garbage collector off)."""
    return min(timeit.repeat(fn, number=number, repeat=rounds)) / number


def per_attribute(rounds: int) -> dict[str, float]:
    """µs per attribute: the writer's outcome write against the SDK's ``set_attributes``."""
    from openinference.instrumentation import TraceConfig
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider

    from retrieval_stage.models import Reranked
    from retrieval_stage.spans.deferred import write_outcome
    from retrieval_stage.spans.fit import outcome_attributes, outcome_plan
    from retrieval_stage.spans.otel_private import plain_attributes

    (finished,) = _finished_spans(1)
    stored = dict(finished.attributes or {})
    tracer = TracerProvider(span_limits=SpanLimits(max_span_attributes=LIMIT)).get_tracer("pieces")
    cands = candidates(DOCS)
    outputs = [
        Reranked(c, 1.0 - i / (2 * DOCS), DOCS - 1 - i) for i, c in enumerate(reversed(cands))
    ]
    config = TraceConfig()
    stats: dict[str, Any] = {"rerank.fallback": False, "rerank.requests": 1}

    def ours() -> None:
        span = tracer.start_span("rerank")
        head, record = outcome_plan(
            span, stats, cands, outputs, config=config, max_content_length=2000
        )
        write_outcome(span, head, record, vouched=plain_attributes(stats))

    def sdk_floor() -> None:
        tracer.start_span("rerank").set_attributes(stored)

    def empty_span() -> None:
        tracer.start_span("rerank")

    n_ours = len(
        outcome_attributes(
            tracer.start_span("x"), stats, cands, outputs, config=config, max_content_length=2000
        )
    )
    start = _best(empty_span, 300, rounds)
    return {
        "attributes (ours, outcome)": float(n_ours),
        "attributes (SDK floor, whole span)": float(len(stored)),
        "ours µs/attribute": (_best(ours, 300, rounds) - start) / n_ours * 1e6,
        "SDK set_attributes µs/attribute": (_best(sdk_floor, 300, rounds) - start)
        / len(stored)
        * 1e6,
    }


def encoding(rounds: int, batch: int) -> dict[str, float]:
    """µs per span of our encoder and the SDK's over one batch, and the batch's bytes: spans
    whose documents are still a record (as the exporter meets them), then the same spans
    flattened (as after any other reader), with the C loops and with the Python ones."""
    from retrieval_stage.telemetry import otlp_encoder
    from retrieval_stage.telemetry.otlp_encoder import sdk_serialize_spans, serialize_spans

    batches = [_finished_spans(batch) for _ in range(rounds)]
    records = [serialize_spans(spans) for spans in batches[:1]]
    size = len(records[0])
    if records[0] != sdk_serialize_spans(batches[0]):  # flattens them, for the SDK
        raise RuntimeError("the two encoders disagree on this batch")
    fresh = iter(batches[1:])
    deferred = min(
        (_once(lambda: serialize_spans(next(fresh))) for _ in batches[1:]), default=float("nan")
    )
    spans = batches[0]
    out = {
        "ours, documents as a record, µs/span": deferred / batch * 1e6,
        "ours, flattened, µs/span": _best(lambda: serialize_spans(spans), 1, rounds) / batch * 1e6,
    }
    saved = otlp_encoder._c
    otlp_encoder._c = None
    try:
        out["ours, flattened, Python loops, µs/span"] = (
            _best(lambda: serialize_spans(spans), 1, rounds) / batch * 1e6
        )
    finally:
        otlp_encoder._c = saved
    out["SDK µs/span"] = (
        _best(lambda: sdk_serialize_spans(spans), 1, max(rounds // 3, 1)) / batch * 1e6
    )
    out["KiB/span"] = size / batch / 1024
    return out


def _once(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def documents(rounds: int) -> dict[str, float]:
    """One call's 50 input and 50 output documents (300 attributes): what the writer does on
    the caller's thread (`fit._plan`), what flattening them costs wherever it happens
    (`DocumentsRecord.attributes`), and encoding them from the record (the C loops) against
    encoding the flattened mapping (the C loops, the Python ones). The bytes are checked
    equal before anything is timed."""
    from openinference.instrumentation import TraceConfig

    from retrieval_stage.models import Reranked
    from retrieval_stage.spans import fit
    from retrieval_stage.telemetry import otlp_encoder as enc

    tag = b"\x4a"  # Span.attributes
    cands = candidates(DOCS)
    outputs = [
        Reranked(c, 1.0 - i / (2 * DOCS), DOCS - 1 - i) for i, c in enumerate(reversed(cands))
    ]
    config = TraceConfig()

    def plan() -> fit.DocumentsRecord:
        return fit._plan(None, cands, outputs, config, 2000, True)

    record = plan()
    flat = record.attributes()
    out = {
        "planned on the caller's thread (fit._plan) µs": _best(plan, 300, rounds) * 1e6,
        "flattened (DocumentsRecord.attributes) µs": _best(record.attributes, 300, rounds) * 1e6,
    }
    c = enc._c
    if c is not None:

        def direct() -> bytes:
            return enc.documents_bytes(record)

        if direct() != enc._attributes_bytes(tag, flat):
            raise RuntimeError("the record's encoding differs from the flattened one")
        out["encoded from the record (C) µs"] = _best(direct, 300, rounds) * 1e6
        out["flattened, encoded (C) µs"] = (
            _best(lambda: enc._attributes_bytes(tag, flat), 300, rounds) * 1e6
        )
    enc._c = None
    try:
        out["flattened, encoded (Python loops) µs"] = (
            _best(lambda: enc._attributes_bytes(tag, flat), 300, rounds) * 1e6
        )
    finally:
        enc._c = c
    return out


def report(
    best: dict[str, float],
    attr: dict[str, float],
    enc: dict[str, float],
    deferred: dict[str, float],
) -> str:
    off, on = best["sampled out"], best["recording"]
    lines = [
        "| variant | thread CPU µs/call (min) | piece: recording minus this |",
        "|---|---|---|",
        f"| sampled out | {off:.1f} | |",
        f"| recording (limit {LIMIT}, no processor) | {on:.1f} | {on - off:.1f} over sampled out |",
    ]
    accounted = 0.0
    for name, value in best.items():
        if name in ("sampled out", "recording"):
            continue
        overlaps = name.startswith(_OVERLAPPING)
        if not overlaps:
            accounted += on - value
        note = " (its documents are also in the first row)" if overlaps else ""
        lines.append(f"| recording without {name}{note} | {value:.1f} | {on - value:.1f} |")
    rest = on - off - accounted
    lines.append(f"| the rest: the SDK span's own life, the outcome's few values | | {rest:.1f} |")
    lines += ["", "| per attribute | value |", "|---|---|"]
    lines += [
        f"| {name} | {value:.0f} |"
        if name.startswith("attributes")
        else f"| {name} | {value:.3f} |"
        for name, value in attr.items()
    ]
    lines += ["", "| exporter thread | value |", "|---|---|"]
    lines += [f"| {name} | {value:.1f} |" for name, value in enc.items()]
    lines += [
        "",
        "| the documents (100 documents, 300 attributes) | value |",
        "|---|---|",
    ]
    lines += [f"| {name} | {value:.1f} |" for name, value in deferred.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies.span_pieces")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--batch", type=int, default=512)
    args = parser.parse_args(argv)
    guard.install()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    best = pieces(args.rounds, args.calls)
    attr = per_attribute(args.rounds)
    enc = encoding(args.rounds, args.batch)
    deferred = documents(args.rounds)
    print(f"load average {load} at the start; {DOCS} documents, min of {args.rounds} rounds\n")
    print(report(best, attr, enc, deferred))


if __name__ == "__main__":
    main()
