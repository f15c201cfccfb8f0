"""A RERANKER span whose documents stay a record is, to every reader, the span written eagerly.

Each span here is written twice by the real writer (`RerankerSpans`) on a real SDK provider:
once with its documents deferred (the default) and once written at the end of the call
(``defer_documents`` off, the path every release before issue 38 took). The two must hold the
same attributes in the same order with the same drop counts, whatever reads them and whenever,
and our encoder's bytes for the deferred one, written straight from the record, must be the
SDK's own encoding of it. Inputs are drawn as `test_span_shortcuts` draws them: non-ASCII, lone
surrogates, over-long ids and texts, metadata, missing scores, strangers among the outputs,
limits that cut both lists, hidden inputs and outputs.
"""

from __future__ import annotations

import copy
import gc
import json
import threading
from collections.abc import Callable
from enum import Enum
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openinference.instrumentation import TraceConfig, using_attributes
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import INVALID_SPAN

import retrieval_stage.spans.deferred as deferred_module
import retrieval_stage.spans.fit as fit
from retrieval_stage import Candidate, RerankStage
from retrieval_stage.errors import RerankTransportError
from retrieval_stage.models import Reranked, Usage
from retrieval_stage.spans.deferred import DEFER_ENV, DeferredAttributes, defer, snapshot
from retrieval_stage.spans.keys import ATTR_INPUT_OMITTED, ATTR_OUTPUT_OMITTED
from retrieval_stage.spans.reranker import RerankerSpans
from retrieval_stage.telemetry import otlp_encoder
from retrieval_stage.telemetry.otlp_encoder import encode_spans_fast, sdk_serialize_spans

from ..fakes import Reverse
from ..native import LOOPS, use_loops
from .test_span_shortcuts import TEXTS, calls

# -- writing one span ---------------------------------------------------------------------------


@pytest.fixture(params=LOOPS)
def loops(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The encoder with its C loops (documents written from the record) or its Python ones
    (the record flattened first)."""
    return use_loops(request, monkeypatch, otlp_encoder)


def write(
    cands: list[Candidate],
    outputs: list[Reranked],
    *,
    defer_documents: bool = True,
    limits: SpanLimits | None = None,
    config: TraceConfig | None = None,
    max_bytes: int = 2000,
    output_content: bool = True,
    fell_back: bool = False,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> ReadableSpan:
    """One RERANKER span as the stage writes it, `before` set on it before its outcome and
    `after` once its outcome is written, both while it records; `extra` goes with the outcome
    (the stage's ``gen_ai.*`` names and the like)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=limits or SpanLimits(max_span_attributes=2048))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    writer = RerankerSpans(
        provider,
        trace_config=config or TraceConfig(),
        max_content_length=max_bytes,
        output_content=output_content,
    )
    writer.defer_documents = defer_documents
    with (
        using_attributes(session_id="s-1", metadata={"team": "search"}),
        writer.start("q", cands, model_name="m", top_k=None, provider="p") as span,
    ):
        for key, value in (before or {}).items():
            span.span.set_attribute(key, value)
        if fell_back:
            span.fell_back(RerankTransportError("down"), outputs, model="m")
        else:
            span.succeeded(
                outputs,
                model="m",
                top1_changed=True,
                requests=1,
                retries=0,
                batches=1,
                usage=Usage(total_tokens=7),
                extra=extra,
            )
        for key, value in (after or {}).items():
            span.span.set_attribute(key, value)
    (finished,) = exporter.get_finished_spans()
    provider.shutdown()
    return finished


def fifty() -> tuple[list[Candidate], list[Reranked]]:
    cands = [Candidate(f"doc-{i}", f"passage {i} é", 1.0 - i / 50) for i in range(50)]
    return cands, [Reranked(cands[i], 0.5 + i / 100, i) for i in reversed(range(50))]


def is_deferred(span: ReadableSpan) -> bool:
    return type(span._attributes) is DeferredAttributes


# -- the same span, however it is read ----------------------------------------------------------

LIMITS = st.sampled_from([SpanLimits.UNSET, 12, 20, 40, 128, 2048])


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    call=calls(),
    limit=LIMITS,
    hide=st.tuples(st.booleans(), st.booleans()),
    max_bytes=st.sampled_from([16, 24, 64, 2000]),
    output_content=st.booleans(),
    fell_back=st.booleans(),
)
def test_a_deferred_span_is_the_eager_span_and_encodes_as_the_sdk_encodes_it(
    loops: str,
    call: tuple[list[Candidate], list[Reranked]],
    limit: Any,
    hide: tuple[bool, bool],
    max_bytes: int,
    output_content: bool,
    fell_back: bool,
) -> None:
    cands, outputs = call
    options: dict[str, Any] = {
        "limits": SpanLimits(max_span_attributes=limit),
        "config": TraceConfig(hide_inputs=hide[0], hide_outputs=hide[1]),
        "max_bytes": max_bytes,
        "output_content": output_content,
        "fell_back": fell_back,
    }
    deferred = write(cands, outputs, **options)
    eager = write(cands, outputs, defer_documents=False, **options)
    assert not is_deferred(eager)
    first = encode_spans_fast([deferred])  # as the exporter meets it: still a record
    assert list((deferred.attributes or {}).items()) == list((eager.attributes or {}).items())
    assert deferred.dropped_attributes == eager.dropped_attributes
    assert first == sdk_serialize_spans([deferred])


def test_fifty_documents_are_deferred_by_default_and_read_back_in_full(loops: str) -> None:
    cands, outputs = fifty()
    span = write(cands, outputs)
    assert is_deferred(span)
    first = encode_spans_fast([span])
    attributes = dict(span.attributes or {})
    assert not is_deferred(span)
    assert attributes["reranker.input_documents.49.document.content"] == "passage 49 é"
    assert attributes["reranker.output_documents.0.document.id"] == "doc-49"
    assert attributes["reranker.output_documents.0.document.score"] == pytest.approx(0.99)
    assert sum(key.startswith("reranker.") and ".document." in key for key in attributes) == 300
    assert first == sdk_serialize_spans([span])


def test_the_stage_defers_a_recording_spans_documents() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=2048))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    RerankStage(Reverse(), tracer_provider=provider).run("q", fifty()[0])
    (span,) = exporter.get_finished_spans()
    assert is_deferred(span)
    assert (span.attributes or {})["reranker.output_documents.0.document.id"] == "doc-49"


READS: dict[str, Callable[[ReadableSpan], object]] = {
    "len(span.attributes)": lambda s: len(s.attributes or {}),
    "iterating": lambda s: list(s.attributes or {}),
    "one key": lambda s: (s.attributes or {})["openinference.span.kind"],
    "a missing key": lambda s: (s.attributes or {}).get("nothing"),
    "in": lambda s: "reranker.query" in (s.attributes or {}),
    "items": lambda s: list((s.attributes or {}).items()),
    "values": lambda s: list((s.attributes or {}).values()),
    "copy": lambda s: (s.attributes or {}).copy(),
    "dict()": lambda s: dict(s.attributes or {}),
    "==": lambda s: (s.attributes or {}) == {},
    "the store's repr": lambda s: repr(s._attributes),
    "the store's deepcopy": lambda s: copy.deepcopy(s._attributes),
    "the store's len": lambda s: len(s._attributes),
    "the store's copy": lambda s: s._attributes.copy(),
    "to_json": lambda s: s.to_json(),
}


@pytest.mark.parametrize("read", READS.values(), ids=list(READS))
def test_any_read_sees_every_document_in_the_eager_order(
    read: Callable[[ReadableSpan], object],
) -> None:
    cands, outputs = fifty()
    span = write(cands, outputs)
    assert is_deferred(span)
    read(span)
    assert type(span._attributes) is BoundedAttributes
    eager = write(cands, outputs, defer_documents=False)
    assert list(span._attributes._dict.items()) == list((eager.attributes or {}).items())


def test_to_json_holds_the_documents() -> None:
    span = write(*fifty())
    attributes = json.loads(span.to_json())["attributes"]
    assert attributes["reranker.input_documents.0.document.id"] == "doc-0"
    assert len(attributes) == len(write(*fifty(), defer_documents=False).attributes or {})


def test_an_attribute_set_after_the_outcome_lands_where_the_eager_write_puts_it() -> None:
    cands, outputs = fifty()
    late = {"retrieval_stage.cancelled": True, "reranker.model_name": "m2"}
    deferred = write(cands, outputs, after=late)
    eager = write(cands, outputs, defer_documents=False, after=late)
    keys = list(deferred.attributes or {})
    assert keys == list(eager.attributes or {})
    assert keys[-2:] == list(late)  # after every document, the set-again key moved to the end


def test_a_tight_limit_keeps_the_same_documents_and_counts_either_way() -> None:
    cands, outputs = fifty()
    limits = SpanLimits(max_span_attributes=128)
    deferred = write(cands, outputs, limits=limits)
    eager = write(cands, outputs, defer_documents=False, limits=limits)
    assert is_deferred(deferred)
    assert list((deferred.attributes or {}).items()) == list((eager.attributes or {}).items())
    attributes = deferred.attributes or {}
    assert len(attributes) <= 128
    assert attributes["retrieval_stage.input_documents.omitted"] > 0
    assert deferred.dropped_attributes == 0


# -- when it is not deferred ---------------------------------------------------------------------


def test_a_value_length_limit_writes_the_documents_at_once() -> None:
    limits = SpanLimits(max_span_attributes=2048, max_span_attribute_length=8)
    span = write(*fifty(), limits=limits)
    assert not is_deferred(span)
    assert (span.attributes or {})["reranker.input_documents.0.document.content"] == "passage "


def test_a_span_already_holding_a_document_key_writes_the_documents_at_once() -> None:
    before = {"reranker.input_documents.0.document.id": "someone else's"}
    span = write(*fifty(), before=before)
    eager = write(*fifty(), before=before, defer_documents=False)
    assert not is_deferred(span)
    assert list((span.attributes or {}).items()) == list((eager.attributes or {}).items())


def test_every_key_a_record_flattens_to_holds_the_mark_defer_looks_for() -> None:
    """`defer` refuses a span holding any key with ``_documents.`` in it: every key a record
    can flatten to must have it, or a key already on the span could be written twice."""
    cands = [Candidate(f"d{i}", "t", 0.5, {"m": i}) for i in range(3)]
    outputs = [Reranked(c, 0.5, i) for i, c in enumerate(cands)]
    limits_cut = fit._plan(9, cands, outputs, TraceConfig(), 2000, True)
    keys = list(record_of(cands, outputs).attributes()) + list(limits_cut.attributes())
    assert ATTR_INPUT_OMITTED in keys
    assert ATTR_OUTPUT_OMITTED in keys
    assert all(deferred_module._DOCUMENT_MARK in key for key in keys)


def test_the_environment_switch_writes_the_documents_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(DEFER_ENV, "0")
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=2048))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    RerankStage(Reverse(), tracer_provider=provider).run("q", fifty()[0])
    (span,) = exporter.get_finished_spans()
    assert not is_deferred(span)


def test_an_unparseable_switch_keeps_deferring_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    logged: list[tuple[str, dict[str, Any]]] = []

    class Log:
        def warning(self, event: str, **fields: Any) -> None:
            logged.append((event, fields))

    monkeypatch.setattr(deferred_module, "log", Log())
    monkeypatch.setenv(DEFER_ENV, "maybe")
    writer = RerankerSpans(TracerProvider(), trace_config=TraceConfig())
    assert writer.defer_documents
    assert logged == [("rerank.config_invalid", {"variable": DEFER_ENV, "value": "maybe"})]


def record_of(cands: list[Candidate], outputs: list[Reranked]) -> fit.DocumentsRecord:
    return fit._plan(None, cands, outputs, TraceConfig(), 2000, True)


def test_defer_refuses_an_ended_span_a_full_one_and_a_non_sdk_one() -> None:
    cands, outputs = fifty()
    record = record_of(cands, outputs)
    tracer = TracerProvider(span_limits=SpanLimits(max_span_attributes=2048)).get_tracer("t")
    ended = tracer.start_span("s")
    ended.end()
    assert not defer(ended, record)
    small = TracerProvider(span_limits=SpanLimits(max_span_attributes=100)).get_tracer("t")
    full = small.start_span("s")
    assert not defer(full, record)  # 300 document attributes cannot fit in 100
    assert not defer(INVALID_SPAN, record)
    live = tracer.start_span("s")
    assert not defer(live, record_of([], []))  # no documents: nothing to defer
    assert defer(live, record)
    live.end()


@pytest.mark.parametrize("spare", [-1, 0])
def test_defer_keeps_a_record_only_where_its_bound_fits_the_limit(spare: int) -> None:
    cands, outputs = fifty()
    record = record_of(cands, outputs)
    limit = 1 + record.bound + spare  # the span's one attribute, the record's bound, spare
    tracer = TracerProvider(span_limits=SpanLimits(max_span_attributes=limit)).get_tracer("t")
    span = tracer.start_span("s", attributes={"a": 1})
    assert defer(span, record) is (spare >= 0)
    span.end()


def test_a_snapshot_is_the_head_and_the_record_until_the_store_is_flattened() -> None:
    span = write(*fifty())
    held = snapshot(span._attributes)
    assert held is not None
    head, record = held
    assert head["openinference.span.kind"] == "RERANKER"
    assert not any(".document." in key for key in head)
    assert record.n_in == 50
    len(span.attributes or {})
    assert snapshot(span._attributes) is None


class Tier(str, Enum):
    GOLD = "gold"


def test_a_head_that_is_not_plain_is_cleaned_as_the_sdk_cleans_it_before_the_record(
    loops: str,
) -> None:
    """Outcome values the writer cannot vouch for (a list, a tuple, a str Enum) are stored as
    the SDK's `BoundedAttributes` stores them, the documents still kept as a record after them:
    a list becomes a tuple of its own (the caller's list may change later), the rest as given;
    and the bytes, the documents written from the record, are the SDK's encoding."""
    tags = ["a", "b"]
    extra = {"app.tags": tags, "app.pair": (1, 2.5), "app.tier": Tier.GOLD}
    deferred, eager = (write(*fifty(), defer_documents=d, extra=extra) for d in (True, False))
    tags.append("changed later")
    held = snapshot(deferred._attributes)
    assert held is not None
    head = held[0]
    typed = {key: (type(head[key]), head[key]) for key in extra}
    assert typed == {
        "app.tags": (tuple, ("a", "b")),
        "app.pair": (tuple, (1, 2.5)),
        "app.tier": (Tier, Tier.GOLD),
    }
    assert list(head) == [k for k in eager.attributes or {} if k in head]
    body = encode_spans_fast([deferred])  # before anything flattens the record
    assert body == sdk_serialize_spans([deferred])
    assert encode_spans_fast([eager]) == sdk_serialize_spans([eager])
    attributes = dict(deferred.attributes or {})
    assert {k: (type(v), v) for k, v in attributes.items()} == {
        k: (type(v), v) for k, v in (eager.attributes or {}).items()
    }


# -- what the record holds -----------------------------------------------------------------------


def test_a_mapping_changed_after_the_call_does_not_change_the_span(loops: str) -> None:
    metadata = {"src": "wiki"}
    cands = [Candidate("a", "x", 0.5, metadata), Candidate("b", "y", 0.4)]
    outputs = [Reranked(cands[1], 0.9, 1), Reranked(cands[0], 0.1, 0)]
    span = write(cands, outputs)
    assert is_deferred(span)
    metadata["src"] = "changed later"
    metadata["extra"] = "added later"
    body = encode_spans_fast([span])
    attributes = span.attributes or {}
    assert attributes["reranker.input_documents.0.document.metadata"] == '{"src": "wiki"}'
    assert attributes["reranker.output_documents.1.document.metadata"] == '{"src": "wiki"}'
    assert body == sdk_serialize_spans([span])


def test_the_callers_output_list_changed_after_the_call_does_not_change_the_span() -> None:
    cands, outputs = fifty()
    span = write(cands, outputs)
    expected = list((write(cands, list(outputs), defer_documents=False).attributes or {}).items())
    outputs.clear()
    cands.reverse()
    assert list((span.attributes or {}).items()) == expected


class Embedding(list):  # type: ignore[type-arg]
    """Something a caller's metadata may hold that is heavy to keep: weakly referable."""


def test_a_deferred_span_keeps_none_of_the_callers_objects_alive() -> None:
    """The record holds the capped strings and numbers the eager write would store, nothing
    else: a span waiting in an export queue (a collector down for minutes fills it) keeps no
    `Candidate`, no `Reranked`, no full text and no metadata mapping of the caller's alive."""
    import weakref

    long_text = "long " * 2000  # 10 KB: the span keeps its capped 2,000 bytes only
    embedding = Embedding([0.5] * 384)
    cands = [Candidate(f"doc-{i}", long_text, 0.5, {"embedding": embedding}) for i in range(3)]
    outputs = [Reranked(cands[i], 0.9 - i / 10, i) for i in range(3)]
    alive = [weakref.ref(embedding)]
    span = write(cands, outputs)
    assert is_deferred(span)
    record = deferred_module.snapshot(span._attributes)[1]  # type: ignore[index]
    assert {type(value) for value in record.documents} <= {str, float}
    assert all(len(value) <= 2000 for value in record.documents if type(value) is str)
    del cands, outputs, embedding, record
    gc.collect()
    assert [ref() for ref in alive] == [None]
    attributes = span.attributes or {}
    assert attributes["reranker.output_documents.2.document.id"] == "doc-2"
    assert attributes["reranker.input_documents.0.document.metadata"].startswith(
        '{"embedding": [0.5, 0.5'
    )


# -- concurrent readers ---------------------------------------------------------------------------


def test_readers_on_many_threads_flatten_once_and_all_see_every_document(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    flattened: list[int] = []
    real = fit.DocumentsRecord.attributes

    def counting(self: fit.DocumentsRecord) -> dict[str, Any]:
        flattened.append(1)
        return real(self)

    monkeypatch.setattr(fit.DocumentsRecord, "attributes", counting)
    span = write(*fifty())
    expected = list((write(*fifty(), defer_documents=False).attributes or {}).items())
    flattened.clear()
    start = threading.Barrier(8)
    seen: list[list[tuple[str, Any]]] = []

    def read() -> None:
        start.wait()
        seen.append(list((span.attributes or {}).items()))

    threads = [threading.Thread(target=read) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert flattened == [1]
    assert seen == [expected] * 8


@settings(max_examples=40, deadline=None)
@given(text=TEXTS, identifier=TEXTS)
def test_texts_the_record_caps_are_capped_as_the_eager_write_caps_them(
    text: str, identifier: str
) -> None:
    cands = [Candidate(identifier, text, 0.5), Candidate("b", text * 3, None)]
    outputs = [Reranked(cands[1], 0.5, 1), Reranked(cands[0], -0.5, 0)]
    options: dict[str, Any] = {"max_bytes": 24}
    deferred = write(cands, outputs, **options)
    body = encode_spans_fast([deferred])
    eager = write(cands, outputs, defer_documents=False, **options)
    assert list((deferred.attributes or {}).items()) == list((eager.attributes or {}).items())
    assert body == sdk_serialize_spans([deferred])
