"""The fast OTLP encoder is byte-identical to the SDK's, and the exporter posts those bytes.

Spans come from a real SDK TracerProvider; the reference is the installed SDK's
``encode_spans(spans).SerializePartialToString()``. The exporter is checked over a real HTTP
connection to a receiver on 127.0.0.1, against the SDK exporter's body for the same spans.
"""

from __future__ import annotations

import gzip
import hashlib
import inspect
import math
import os
import threading
from collections.abc import Iterator, Sequence
from enum import Enum, IntEnum, IntFlag
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from retrieval_stage import Candidate, RerankStage
from retrieval_stage._native import SPEEDUPS_ENV
from retrieval_stage.errors import RerankTransportError
from retrieval_stage.telemetry import otlp_encoder
from retrieval_stage.telemetry.otlp_encoder import (
    UnsupportedValue,
    encode_spans_fast,
    sdk_serialize_spans,
    serialize_spans,
)
from retrieval_stage.telemetry.otlp_exporter import FAST_OTLP_ENV, FastOTLPSpanExporter

from ..fakes import Failing, Reverse
from ..native import LOOPS, use_loops

# -- helpers ----------------------------------------------------------------------------------


def recorded(
    resource: Resource | None = None, limits: SpanLimits | None = None
) -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=resource or Resource({}), span_limits=limits)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@pytest.fixture(autouse=True, params=LOOPS)
def loops(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs twice: the encoder with its C loops, and with its Python ones."""
    return use_loops(request, monkeypatch, otlp_encoder)


def assert_identical(spans: Sequence[ReadableSpan]) -> bytes:
    """The fast encoder's bytes equal the SDK's, with no fallback involved: first as the
    exporter meets the spans (a RERANKER span's documents still a record), then again once
    the SDK's encoder has read them (flattened)."""
    first = encode_spans_fast(spans)
    expected = sdk_serialize_spans(spans)
    assert first == expected
    assert encode_spans_fast(spans) == expected
    return expected


# -- hypothesis: every attribute type, events, links, status, parent, resource and scope ----

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
EDGE_INTS = st.sampled_from([0, 1, -1, 127, 128, 2**31, -(2**31), 2**63 - 1, -(2**63)])
FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324]
)
TEXT = st.text(max_size=12) | st.sampled_from(["", "é", "日本語", "\U0001f600", "\x00", "a" * 200])
SCALARS: list[st.SearchStrategy[Any]] = [
    TEXT,
    st.booleans(),
    INT64 | EDGE_INTS,
    FLOATS,
    st.binary(max_size=8),
]
VALUES = st.one_of(
    *SCALARS,
    st.none(),
    *[st.lists(s, max_size=4) for s in SCALARS],
    st.lists(st.none() | TEXT, max_size=3),
    st.just([]),
)
KEYS = st.text(min_size=1, max_size=16) | st.sampled_from(
    ["reranker.input_documents.0.document.id", "k", "é"]
)
ATTRIBUTES = st.dictionaries(KEYS, VALUES, max_size=6)
TIMES = st.none() | st.integers(min_value=0, max_value=2**64 - 1)
TRACE_STATES = st.sampled_from([[], [("a", "1")], [("vendor", "x-y"), ("b", "2")]])
STATUSES = st.sampled_from(
    [None, Status(StatusCode.UNSET), Status(StatusCode.OK), Status(StatusCode.ERROR)]
) | st.builds(lambda d: Status(StatusCode.ERROR, d), TEXT)

LINKS = st.builds(
    lambda trace_id, span_id, remote, state, attrs: Link(
        SpanContext(trace_id, span_id, remote, TraceFlags(1), TraceState(state)), attrs
    ),
    st.integers(1, 2**128 - 1),
    st.integers(1, 2**64 - 1),
    st.booleans(),
    TRACE_STATES,
    ATTRIBUTES,
)
EVENTS = st.tuples(TEXT, ATTRIBUTES, TIMES)
SPANS = st.fixed_dictionaries(
    {
        "tracer": st.integers(0, 5),
        "name": TEXT,
        "kind": st.sampled_from(list(SpanKind)),
        "attributes": ATTRIBUTES,
        "events": st.lists(EVENTS, max_size=3),
        "links": st.lists(LINKS, max_size=2),
        "status": STATUSES,
        "parent": st.sampled_from(["none", "previous", "remote"]),
        "start": TIMES,
        "end": TIMES,
    }
)
RESOURCES = st.builds(
    lambda attrs, schema: Resource(attrs, schema), ATTRIBUTES, st.sampled_from(["", "https://s/1"])
)
SCOPES = st.tuples(
    TEXT,
    st.none() | TEXT,
    st.none() | st.sampled_from(["", "https://scope/1"]),
    st.none() | ATTRIBUTES,
)
TIGHT = SpanLimits(
    max_span_attributes=3,
    max_events=2,
    max_links=1,
    max_event_attributes=2,
    max_link_attributes=2,
)


@settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,  # `loops`: set once per test, not per example
    ],
)
@given(
    resources=st.lists(RESOURCES, min_size=1, max_size=2),
    scopes=st.lists(SCOPES, min_size=1, max_size=3),
    specs=st.lists(SPANS, min_size=1, max_size=6),
    tight=st.booleans(),
)
def test_generated_spans_encode_byte_identical_to_the_sdk(
    resources: list[Resource], scopes: list[Any], specs: list[dict[str, Any]], tight: bool
) -> None:
    exporter = InMemorySpanExporter()
    providers = []
    for resource in resources:
        provider = TracerProvider(resource=resource, span_limits=TIGHT if tight else None)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        providers.append(provider)
    tracers = [
        providers[i % len(providers)].get_tracer(name, version, schema_url, attributes)
        for i, (name, version, schema_url, attributes) in enumerate(scopes)
    ]
    previous: Any = None
    for spec in specs:
        tracer = tracers[spec["tracer"] % len(tracers)]
        context = None
        if spec["parent"] == "previous" and previous is not None:
            context = trace.set_span_in_context(previous)
        elif spec["parent"] == "remote":
            remote = SpanContext(0xABC, 0xDEF, True, TraceFlags(1), TraceState([("r", "1")]))
            context = trace.set_span_in_context(NonRecordingSpan(remote))
        span = tracer.start_span(
            spec["name"],
            context=context,
            kind=spec["kind"],
            attributes=spec["attributes"],
            links=spec["links"],
            start_time=spec["start"],
        )
        for name, attributes, timestamp in spec["events"]:
            span.add_event(name, attributes, timestamp)
        if spec["status"] is not None:
            span.set_status(spec["status"])
        span.end(end_time=spec["end"])
        previous = span
    assert_identical(exporter.get_finished_spans())


# -- examples: our RERANKER span, a fallback span, a 64-span batch ----------------------------


# The fakes' names, as the stage copies them into the spans encoded here.
FAKE = {"provider": "fake", "model_name": "fake-reranker"}


def down() -> Failing:
    """A provider that is down: every call falls back."""
    return Failing(RerankTransportError("connection refused"), **FAKE)


def documents(n: int) -> list[Candidate]:
    return [
        Candidate(
            f"doc-{i}", f"passage {i}: " + "text é " * 20, 1.0 / (i + 1), {"src": "wiki", "n": i}
        )
        for i in range(n)
    ]


def service_provider(
    limits: SpanLimits | None = None,
) -> tuple[TracerProvider, InMemorySpanExporter]:
    resource = Resource.create(
        {"service.name": "retrieval-stage", "deployment.environment": "test"}
    )
    return recorded(resource, limits or SpanLimits(max_span_attributes=2048))


def test_fifty_document_reranker_span_is_byte_identical() -> None:
    provider, exporter = service_provider()
    RerankStage(Reverse(**FAKE), tracer_provider=provider).run("what moved?", documents(50))
    spans = exporter.get_finished_spans()
    (span,) = spans
    assert span.attributes is not None
    assert len(span.attributes) > 300
    assert span.attributes["openinference.span.kind"] == "RERANKER"
    body = assert_identical(spans)
    decoded = ExportTraceServiceRequest.FromString(body)
    (kv,) = [
        a
        for a in decoded.resource_spans[0].scope_spans[0].spans[0].attributes
        if a.key == "reranker.output_documents.0.document.id"
    ]
    assert kv.value.string_value == "doc-49"


def test_fallback_span_with_exception_event_is_byte_identical() -> None:
    provider, exporter = service_provider()
    out = RerankStage(down(), tracer_provider=provider).run("q", documents(5))
    assert [r.candidate.id for r in out] == [f"doc-{i}" for i in range(5)]
    spans = exporter.get_finished_spans()
    (span,) = spans
    assert span.status.status_code is StatusCode.ERROR
    assert [e.name for e in span.events] == ["exception"]
    assert_identical(spans)


def test_sixty_four_span_batch_across_two_resources_and_scopes_is_byte_identical() -> None:
    exporter = InMemorySpanExporter()
    tracers = []
    for service in ("a", "b"):
        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracers.append(
            provider.get_tracer("retrieval_stage", "1.0", "https://opentelemetry.io/schemas/1.21.0")
        )
        tracers.append(provider.get_tracer("other", attributes={"scope.attr": 1}))
    for i in range(64):
        with tracers[i % 4].start_as_current_span(f"span-{i}", attributes={"i": i, "s": "x" * i}):
            pass
    spans = exporter.get_finished_spans()
    body = assert_identical(spans)
    decoded = ExportTraceServiceRequest.FromString(body)
    assert [len(rs.scope_spans) for rs in decoded.resource_spans] == [2, 2]
    assert sum(len(ss.spans) for rs in decoded.resource_spans for ss in rs.scope_spans) == 64


def test_equal_resources_from_different_providers_are_grouped_as_the_sdk_groups_them() -> None:
    exporter = InMemorySpanExporter()
    for _ in range(2):
        provider = TracerProvider(resource=Resource({"service.name": "same"}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        provider.get_tracer("t").start_span("s").end()
    spans = exporter.get_finished_spans()
    assert spans[0].resource is not spans[1].resource
    decoded = ExportTraceServiceRequest.FromString(assert_identical(spans))
    assert len(decoded.resource_spans) == 1


def test_equal_resources_in_either_order_are_grouped_under_the_batchs_first() -> None:
    """Equal resources whose attributes were set in another order encode differently; the
    SDK keeps the first one of each batch, whatever earlier batches saw first."""
    exporter = InMemorySpanExporter()
    for attributes in ({"a": "1", "b": "2"}, {"b": "2", "a": "1"}):
        provider = TracerProvider(resource=Resource(attributes))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        provider.get_tracer("t").start_span("s").end()
    first, second = exporter.get_finished_spans()
    assert first.resource == second.resource
    for batch in ([first, second], [second, first], [first, second]):
        decoded = ExportTraceServiceRequest.FromString(assert_identical(batch))
        (resource_spans,) = decoded.resource_spans
        assert [a.key for a in resource_spans.resource.attributes] == list(
            batch[0].resource.attributes
        )


def test_repeated_batches_reuse_cached_resource_and_scope_bytes_correctly() -> None:
    provider, exporter = service_provider()
    tracer = provider.get_tracer("t", "1")
    for _ in range(3):
        tracer.start_span("s", attributes={"k": "v"}).end()
        assert_identical(exporter.get_finished_spans())
        exporter.clear()


# -- fallback: what the fast encoder leaves to the SDK ----------------------------------------


def one_span(
    attributes: dict[str, Any], name: str = "s", limits: SpanLimits | None = None
) -> Sequence[ReadableSpan]:
    provider, exporter = recorded(limits=limits)
    provider.get_tracer("t").start_span(name, attributes=attributes).end()
    return exporter.get_finished_spans()


@pytest.mark.parametrize(
    "value",
    [
        "lone \ud800 surrogate",
        ["ok", "\udfff"],
        2**63,
        -(2**63) - 1,
        {"nested": "mapping"},
    ],
    ids=["lone-surrogate", "surrogate-in-list", "above-int64", "below-int64", "mapping"],
)
def test_values_the_fast_encoder_does_not_handle_fall_back_to_the_sdk_bytes(value: Any) -> None:
    spans = one_span({"before": 1, "odd": value, "after": "x"})
    with pytest.raises((UnsupportedValue, UnicodeEncodeError)):
        encode_spans_fast(spans)
    assert serialize_spans(spans) == sdk_serialize_spans(spans)


def test_a_lone_surrogate_attribute_is_dropped_by_both_paths_keeping_the_others() -> None:
    spans = one_span({"before": 1, "odd": "\ud800", "after": "x"})
    decoded = ExportTraceServiceRequest.FromString(serialize_spans(spans))
    keys = [a.key for a in decoded.resource_spans[0].scope_spans[0].spans[0].attributes]
    assert keys == ["before", "after"]


def test_a_lone_surrogate_span_name_fails_like_the_sdk() -> None:
    spans = one_span({}, name="bad \udc80")
    with pytest.raises(UnicodeEncodeError):
        sdk_serialize_spans(spans)
    with pytest.raises(UnicodeEncodeError):
        serialize_spans(spans)


def test_an_exception_inside_the_fast_encoder_falls_back_to_the_sdk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spans = one_span({"k": "v"})

    def broken(span: ReadableSpan) -> list[bytes]:
        raise RuntimeError("bug")

    monkeypatch.setattr(otlp_encoder, "_span_parts", broken)
    assert serialize_spans(spans) == sdk_serialize_spans(spans)


# -- the attribute paths: size tables, the general path, remembered layouts, per-tag keys ------


@pytest.mark.parametrize("size", [0, 1, 127, 128, 4095, 4096, 16383, 16384, 20_000])
def test_strings_on_both_sides_of_every_size_table_encode_byte_identical(size: int) -> None:
    """Under 4096 bytes a string takes the precomputed framing; from 4096 on (and lengths
    whose varints grow: 128, 16384) the whole mapping is written by the general path."""
    spans = one_span(
        {
            "before": 1.5,
            "ascii": "a" * size,
            "é": "é" * (size // 2),  # two UTF-8 bytes per character
            "": "\U0001f600" * (size // 4),
            "after": "x",
            "n": 7,
        }
    )
    assert_identical(spans)


@pytest.mark.parametrize(
    "value", [0, 1, 127, 128, 1023, 1024, 16383, 16384, 2**63 - 1, -1, -(2**63), True, False]
)
def test_ints_and_bools_either_side_of_the_int_table_encode_byte_identical(value: int) -> None:
    assert_identical(one_span({"before": "x", "n": value, "m": value, "after": 0.5}))


def test_a_key_too_long_for_the_length_table_takes_the_general_path() -> None:
    key = "k" * 400  # with a 4000-byte string the KeyValue is longer than the tag table
    assert_identical(one_span({"first": "v", key: "v" * 4000, "f": 2.5, "last": "w" * 4000}))


def test_spans_sharing_a_key_sequence_with_other_values_and_types_encode_identically() -> None:
    keys = [
        f"reranker.input_documents.{i}.document.{field}"
        for i in range(4)
        for field in ("id", "content", "score")
    ]
    value_sets: list[list[Any]] = [
        [f"doc-{i}" if i % 3 != 2 else i / 7 for i in range(12)],
        [f"é{i}" * i if i % 3 != 2 else float(i) for i in range(12)],
        list(range(12)),
        [True, 1, 1.0, "1", [1, 2], ["a"], [True], [0.5], "", -1, 2**40, "x" * 5000],
        [f"doc-{i}" if i % 3 != 2 else i / 7 for i in range(12)],
    ]
    provider, exporter = recorded()
    tracer = provider.get_tracer("t")
    for values in value_sets:
        tracer.start_span("s", attributes=dict(zip(keys, values, strict=True))).end()
    spans = exporter.get_finished_spans()
    for span in spans:
        assert_identical([span])
    assert_identical(spans)


def test_key_sequences_of_one_length_that_differ_are_not_confused() -> None:
    first = one_span({"a": 1.0, "b": "x", "c": 2.0})
    second = one_span({"a": 1.0, "b": "x", "d": 2.0})
    assert_identical(first)
    assert_identical(second)
    assert_identical(first)


def test_more_key_sequences_than_remembered_layouts_encode_identically(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(otlp_encoder, "_c", None)  # the layouts are the Python loops'
    monkeypatch.setattr(otlp_encoder, "_layouts", {})
    remembered = otlp_encoder._LAYOUTS_PER_TAG
    for _ in range(2):
        for n in range(remembered + 3):
            attributes: dict[str, Any] = {f"k{n}.{i}": float(i) for i in range(n + 1)}
            attributes["shared"] = f"v{n}"
            assert_identical(one_span(attributes))
    assert all(len(known) <= remembered for known in otlp_encoder._layouts.values())


def test_one_key_under_every_attribute_field_encodes_identically() -> None:
    """Resource, scope, span, event and link attributes each have their own field tag, which
    the per-key cached heads include."""
    attributes = {"k": 1.5, "s": "v", "i": 3}
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource(attributes))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t", attributes=attributes)
    link = Link(SpanContext(1, 2, False, TraceFlags(1)), attributes)
    span = tracer.start_span("s", attributes=attributes, links=[link])
    span.add_event("e", attributes)
    span.end()
    assert_identical(exporter.get_finished_spans())


class Text(str):
    """A str subclass: a valid attribute value the fast loop leaves to the general path."""


class Number(float):
    """A float subclass (numpy.float64 is one)."""


def test_str_and_float_subclasses_encode_byte_identical() -> None:
    assert_identical(one_span({"s": Text("sub é"), "f": Number(0.25), "plain": "x", "g": 0.5}))


# -- subclasses of the attribute types: what the SDK writes is the value, never a method's ------


class Tier(str, Enum):
    """A str Enum, the common case: ``str()`` gives "Tier.GOLD", the SDK writes "gold"."""

    GOLD = "gold"
    SILVER = "silver é"
    NONE = ""


class Level(IntEnum):
    LOW = 1
    HIGH = 2**40
    BELOW = -3


class Perm(IntFlag):
    R = 4
    W = 2


class Share(float, Enum):
    HALF = 0.5
    TINY = 5e-324


class Loud(str):
    """A str subclass overriding every way back to text but its characters."""

    def __str__(self) -> str:
        return "LOUD"

    def __repr__(self) -> str:
        return "LOUD"

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return b"LOUD"

    def __len__(self) -> int:
        return 4


class Counted(int):
    """An int subclass whose conversions all answer something else."""

    def __int__(self) -> int:
        return 0

    def __index__(self) -> int:
        return 0

    def __str__(self) -> str:
        return "0"


class Scaled(float):
    """A float subclass whose conversions all answer something else."""

    def __float__(self) -> float:
        return 0.0

    def __repr__(self) -> str:
        return "0.0"


class Blob(bytes):
    def __bytes__(self) -> bytes:
        return b"blob"


SUBCLASS_SCALARS: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from(list(Tier)),
    st.sampled_from([*Level, Perm.R, Perm.R | Perm.W, Perm(0)]),
    st.sampled_from(list(Share)),
    st.builds(Loud, TEXT),
    st.builds(Counted, INT64 | EDGE_INTS),
    st.builds(Scaled, FLOATS),
    st.builds(Blob, st.binary(max_size=8)),
    st.builds(Text, TEXT),
    st.booleans(),  # bool cannot be subclassed: the exact ones, beside the int subclasses
    TEXT,
    INT64,
    FLOATS,
)
SUBCLASS_VALUES = st.one_of(
    SUBCLASS_SCALARS,
    st.lists(SUBCLASS_SCALARS, max_size=4),
    st.lists(SUBCLASS_SCALARS, max_size=4).map(tuple),
    st.lists(st.lists(SUBCLASS_SCALARS, max_size=3).map(tuple), max_size=2),
)


@settings(
    max_examples=200,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    attributes=st.dictionaries(KEYS, SUBCLASS_VALUES, max_size=8),
    event=st.dictionaries(KEYS, SUBCLASS_VALUES, max_size=3),
)
def test_subclass_values_encode_as_the_sdks_encode_spans_writes_them(
    attributes: dict[str, Any], event: dict[str, Any]
) -> None:
    """str, int and float subclasses and Enums (alone, in lists, in tuples, nested), whatever
    their ``__str__``, ``__int__``, ``__float__`` or ``encode`` say: the fast encoder writes
    them itself, byte for byte what the SDK's own ``encode_spans`` serialises."""
    from opentelemetry.exporter.otlp.proto.common._internal.trace_encoder import encode_spans

    provider, exporter = recorded()
    span = provider.get_tracer("t").start_span("s", attributes=attributes)
    span.add_event("e", event)
    span.end()
    spans = exporter.get_finished_spans()
    expected = encode_spans(spans).SerializeToString()
    assert encode_spans_fast(spans) == expected  # no fallback: it would raise here


@pytest.mark.parametrize(
    ("value", "field", "expected"),
    [
        (Tier.GOLD, "string_value", "gold"),
        (Tier.NONE, "string_value", ""),
        (Loud("é"), "string_value", "é"),
        (Level.BELOW, "int_value", -3),
        (Perm.R | Perm.W, "int_value", 6),
        (Counted(300), "int_value", 300),
        (Share.HALF, "double_value", 0.5),
        (Scaled(2.5), "double_value", 2.5),
    ],
    ids=[
        "str-enum",
        "empty-str-enum",
        "str-overriding-str",
        "int-enum",
        "int-flag",
        "int-overriding-int",
        "float-enum",
        "float-overriding-float",
    ],
)
def test_an_enum_or_subclass_value_is_written_as_its_own_value(
    value: Any, field: str, expected: Any
) -> None:
    body = encode_spans_fast(one_span({"v": value, "l": [value, value]}))
    (span,) = ExportTraceServiceRequest.FromString(body).resource_spans[0].scope_spans[0].spans
    alone, listed = span.attributes
    assert getattr(alone.value, field) == expected
    assert [getattr(v, field) for v in listed.value.array_value.values] == [expected] * 2


# -- the exporter, over real HTTP --------------------------------------------------------------


class Receiver:
    """An OTLP/HTTP receiver on 127.0.0.1 that records bodies and answers with queued statuses."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.encodings: list[str | None] = []
        self.statuses: list[int] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.encodings.append(self.headers.get("Content-Encoding"))
                receiver.bodies.append(body)
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def decoded(self, index: int) -> bytes:
        body = self.bodies[index]
        return gzip.decompress(body) if self.encodings[index] == "gzip" else body


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.thread.start()
    yield r
    r.server.shutdown()
    r.server.server_close()


def close(*exporters: Any) -> None:
    """Shut exporters down (the SDK's `shutdown` is untyped)."""
    for exporter in exporters:
        exporter.shutdown()


def reranker_spans() -> Sequence[ReadableSpan]:
    provider, exporter = service_provider()
    stage = RerankStage(Reverse(**FAKE), tracer_provider=provider)
    stage.run("q", documents(50))
    RerankStage(down(), tracer_provider=provider).run("q", documents(3))
    return exporter.get_finished_spans()


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_exporter_posts_the_sdk_exporters_body(
    receiver: Receiver, compression: Compression
) -> None:
    spans = reranker_spans()
    fast = FastOTLPSpanExporter(endpoint=receiver.url, compression=compression, timeout=5)
    sdk = OTLPSpanExporter(endpoint=receiver.url, compression=compression, timeout=5)
    assert fast.fast_encoding
    assert fast.export(spans) is SpanExportResult.SUCCESS
    assert sdk.export(spans) is SpanExportResult.SUCCESS
    expected_encoding = "gzip" if compression is Compression.Gzip else None
    assert receiver.encodings == [expected_encoding, expected_encoding]
    assert receiver.decoded(0) == receiver.decoded(1)
    request = ExportTraceServiceRequest.FromString(receiver.decoded(0))
    names = [s.name for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert len(names) == 2
    close(fast, sdk)


def test_exporter_falls_back_to_the_sdk_bytes_for_a_batch_it_cannot_encode(
    receiver: Receiver,
) -> None:
    spans = one_span({"odd": "\ud800", "ok": 1})
    exporter = FastOTLPSpanExporter(endpoint=receiver.url)
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    assert receiver.bodies == [sdk_serialize_spans(spans)]


def test_exporter_keeps_the_sdks_retry_on_a_transient_status(receiver: Receiver) -> None:
    receiver.statuses = [503]
    exporter = FastOTLPSpanExporter(endpoint=receiver.url, timeout=10)
    spans = one_span({"k": "v"})
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    assert len(receiver.bodies) == 2
    assert receiver.bodies[0] == receiver.bodies[1] == sdk_serialize_spans(spans)


def test_exporter_reports_failure_on_a_permanent_status(receiver: Receiver) -> None:
    receiver.statuses = [400]
    exporter = FastOTLPSpanExporter(endpoint=receiver.url)
    assert exporter.export(one_span({})) is SpanExportResult.FAILURE
    assert len(receiver.bodies) == 1


def test_exporter_drops_a_batch_over_max_request_size(receiver: Receiver) -> None:
    exporter = FastOTLPSpanExporter(endpoint=receiver.url, max_request_size=100)
    assert exporter.export(reranker_spans()) is SpanExportResult.FAILURE
    assert receiver.bodies == []


def test_exporter_after_shutdown_exports_nothing(receiver: Receiver) -> None:
    exporter = FastOTLPSpanExporter(endpoint=receiver.url)
    close(exporter)
    assert exporter.export(one_span({})) is SpanExportResult.FAILURE
    assert receiver.bodies == []


@pytest.mark.parametrize(
    ("env", "keyword", "fast"),
    [
        (None, None, True),
        ("0", None, False),
        ("off", None, False),
        ("1", None, True),
        ("0", True, True),
        (None, False, False),
        ("garbage", None, True),
    ],
)
def test_switch_keyword_wins_over_environment(
    monkeypatch: pytest.MonkeyPatch, env: str | None, keyword: bool | None, fast: bool
) -> None:
    if env is None:
        monkeypatch.delenv(FAST_OTLP_ENV, raising=False)
    else:
        monkeypatch.setenv(FAST_OTLP_ENV, env)
    assert (
        FastOTLPSpanExporter(
            endpoint="http://127.0.0.1:9/v1/traces", fast_encoding=keyword
        ).fast_encoding
        is fast
    )


def test_switched_off_the_exporter_never_calls_the_fast_encoder(
    monkeypatch: pytest.MonkeyPatch, receiver: Receiver
) -> None:
    def forbidden(spans: Sequence[ReadableSpan]) -> bytes:
        raise AssertionError("fast encoder used while switched off")

    monkeypatch.setattr("retrieval_stage.telemetry.otlp_exporter.serialize_spans", forbidden)
    monkeypatch.setenv(FAST_OTLP_ENV, "0")
    spans = one_span({"k": "v"})
    assert FastOTLPSpanExporter(endpoint=receiver.url).export(spans) is SpanExportResult.SUCCESS
    assert receiver.bodies == [sdk_serialize_spans(spans)]


def test_exporter_takes_every_keyword_of_the_sdk_exporter() -> None:
    sdk_keywords = set(inspect.signature(OTLPSpanExporter.__init__).parameters) - {"self"}
    assert {
        "endpoint",
        "headers",
        "timeout",
        "compression",
        "session",
        "max_request_size",
    } <= sdk_keywords
    exporter = FastOTLPSpanExporter(
        endpoint="http://127.0.0.1:9/v1/traces",
        certificate_file=None,
        client_key_file=None,
        client_certificate_file=None,
        headers={"x-tenant": "t"},
        timeout=1.5,
        compression=Compression.Gzip,
        session=None,
        max_request_size=1000,
        meter_provider=None,
    )
    assert isinstance(exporter, OTLPSpanExporter)


# The SDK 1.45.2 `OTLPSpanExporter.export` that `_export_serialized` mirrors. When this fails the
# SDK changed its export: re-read it, bring `FastOTLPSpanExporter._export_serialized` in line,
# then update the hash.
SDK_EXPORT_SHA256 = "0968825cd72fb0bde91a72f0607e4e71d622816a087107f6a7053d679aa02f8e"


def test_sdk_export_is_the_one_the_fast_exporter_mirrors() -> None:
    source = inspect.getsource(OTLPSpanExporter.export)
    assert "encode_spans(spans).SerializePartialToString()" in source
    assert hashlib.sha256(source.encode()).hexdigest() == SDK_EXPORT_SHA256, (
        "the SDK's OTLPSpanExporter.export changed: re-sync "
        "FastOTLPSpanExporter._export_serialized with it, then update SDK_EXPORT_SHA256"
    )


def test_output_stays_identical_when_the_key_cache_overflows(
    monkeypatch: pytest.MonkeyPatch, loops: str
) -> None:
    if loops == "c":  # the C loops' bound is compiled in: go past it
        monkeypatch.setattr(otlp_encoder, "_c_key_caches", {})
        limit = C_KEY_CACHE_LIMIT
        spans = one_span(
            {f"k{i}": (1.5 if i % 2 else "v") for i in range(limit + 10)},
            limits=SpanLimits(max_span_attributes=limit + 10),
        )
        caches = otlp_encoder._c_key_caches
    else:
        monkeypatch.setattr(otlp_encoder, "_KEY_CACHE_LIMIT", 3)
        monkeypatch.setattr(otlp_encoder, "_key_caches", {})
        monkeypatch.setattr(otlp_encoder, "_layouts", {})
        limit = 3
        spans = one_span({f"k{i}": (1.5 if i % 2 else "v") for i in range(10)})
        caches = otlp_encoder._key_caches
    assert_identical(spans)
    assert_identical(spans)  # again, with the keys the overflow left in the cache
    (cache,) = caches.values()
    assert 0 < len(cache) <= limit


C_KEY_CACHE_LIMIT = 8192
"""KEY_CACHE_LIMIT in _speedups.c: keys remembered per field tag."""


def test_the_c_loops_are_built() -> None:
    """`pip install` compiles them wherever a C compiler and Python's headers are found (this
    project's machines and CI have both); an install without them would run every traced
    call's encoding several times slower, unnoticed. RETRIEVAL_STAGE_SPEEDUPS=0 runs the
    Python loops on purpose."""
    if os.environ.get(SPEEDUPS_ENV, "").strip() == "0":
        assert not otlp_encoder.speedups
    else:
        assert otlp_encoder.speedups, (
            "retrieval_stage._speedups is not built: reinstall with a C compiler and Python's "
            "headers (pip install -e . shows the compiler's error)"
        )


def test_configure_tracing_with_the_fast_exporter_delivers_the_reranker_span(
    receiver: Receiver,
) -> None:
    from retrieval_stage.telemetry import configure_tracing

    provider = configure_tracing(exporter=FastOTLPSpanExporter(endpoint=receiver.url))
    RerankStage(Reverse(**FAKE), tracer_provider=provider).run("q", documents(50))
    provider.shutdown()
    (body,) = receiver.bodies
    request = ExportTraceServiceRequest.FromString(body)
    (span,) = request.resource_spans[0].scope_spans[0].spans
    kinds = [a.value.string_value for a in span.attributes if a.key == "openinference.span.kind"]
    assert kinds == ["RERANKER"]
    assert len(span.attributes) > 300


def test_configure_tracings_http_exporter_uses_the_fast_encoder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The exporter the library builds for OTLP/HTTP is ours; gRPC keeps the SDK's."""
    from retrieval_stage.telemetry import otlp_span_exporter

    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
    exporter = otlp_span_exporter(endpoint="http://127.0.0.1:9")
    try:
        assert isinstance(exporter, FastOTLPSpanExporter)
    finally:
        exporter.shutdown()


def test_the_c_frame_is_the_python_frame_or_leaves_the_span_to_it(loops: str) -> None:
    """`_speedups.span_frame` writes the fields around a span's attributes for a span with no
    trace state, events or links, and hands any other back: each case, byte for byte."""
    native = otlp_encoder.SPEEDUPS  # the C frame, whichever loops encode the spans below
    if native is None:
        pytest.skip("the C loops are not built here: see test_the_c_loops_are_built")
    provider, exporter = recorded()
    tracer = provider.get_tracer("t")
    remote = SpanContext(0xABC, 0xDEF, True, TraceFlags(1), TraceState([("r", "1")]))
    plain = tracer.start_span("plain", start_time=1, attributes={"k": "v"})
    plain.set_status(Status(StatusCode.ERROR, "why é"))
    plain.end(end_time=2**64 - 1)
    child = tracer.start_span("", context=trace.set_span_in_context(plain), kind=SpanKind.CLIENT)
    child.end()
    under_remote = tracer.start_span(
        "r", context=trace.set_span_in_context(NonRecordingSpan(remote))
    )
    under_remote.end()
    with_event = tracer.start_span("e")
    with_event.add_event("x")
    with_event.end()
    framed, left = [], []
    for span in exporter.get_finished_spans():
        frame = native.span_frame(span)
        (left if frame is None else framed).append(span.name)
        if frame is not None:
            head, tail = frame
            python = otlp_encoder._python_span_parts(span)
            assert head == bytes(python[0])
            assert tail == bytes(python[-1])
        assert_identical([span])
    assert framed == ["plain", ""]
    assert left == ["r", "e"]  # a trace state from the remote parent; an event


@pytest.mark.parametrize(
    "trace_id", [1, 2**64 - 1, 2**64, 2**127 + 0x0102, 2**128 - 1], ids=lambda i: hex(i)
)
@pytest.mark.parametrize("parent_id", [1, 0x80, 2**63, 2**64 - 1], ids=lambda i: hex(i))
def test_the_c_frame_writes_every_id_as_the_python_does(trace_id: int, parent_id: int) -> None:
    """The ids are read as ints, not through ``to_bytes``: each byte of a 16-byte trace id
    and an 8-byte parent id in place, big-endian, at the edges of their halves."""
    native = otlp_encoder.SPEEDUPS
    if native is None:
        pytest.skip("the C loops are not built here: see test_the_c_loops_are_built")
    provider, exporter = recorded()
    parent = SpanContext(trace_id, parent_id, True, TraceFlags(1))
    provider.get_tracer("t").start_span(
        "s", context=trace.set_span_in_context(NonRecordingSpan(parent))
    ).end()
    (span,) = exporter.get_finished_spans()
    frame = native.span_frame(span)
    assert frame is not None
    assert frame[0] == bytes(otlp_encoder._python_span_parts(span)[0])
    assert frame[0][2:18] == trace_id.to_bytes(16, "big")
    assert parent_id.to_bytes(8, "big") in frame[0]


@pytest.mark.parametrize(
    ("trace_id", "span_id", "parent_id"),
    [
        (-1, 7, None),
        (2**128, 7, None),
        (2**200, 7, None),
        (5, -1, None),
        (5, 2**64, None),
        (5, 7, 2**64),
        (5, 7, -3),
    ],
    ids=str,
)
def test_an_id_that_does_not_fit_leaves_the_span_to_the_python(
    trace_id: int, span_id: int, parent_id: int | None
) -> None:
    """What ``to_bytes`` would refuse (negative, too long) is not written by the C frame: the
    span goes to the Python writer, which raises as it always has."""
    from opentelemetry.sdk.trace import ReadableSpan

    native = otlp_encoder.SPEEDUPS
    if native is None:
        pytest.skip("the C loops are not built here: see test_the_c_loops_are_built")
    parent = None if parent_id is None else SpanContext(5, parent_id, False)
    span = ReadableSpan(
        "s", context=SpanContext(trace_id, span_id, False), parent=parent, events=(), links=()
    )
    assert native.span_frame(span) is None
    with pytest.raises(OverflowError):
        otlp_encoder._python_span_parts(span)
