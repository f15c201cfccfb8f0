"""The server's request span as a RERANKER span for callers without one, read back over OTLP.

`create_app` runs on uvicorn in this process (the lexical reranker: no model to load) and
exports its spans over OTLP/HTTP to a receiver on loopback (`tests.otlp_receivers`), once with
the content flag off (the default) and once with ``trace_content`` on. Each test sends one
request as a client would (a plain httpx call is curl: no trace context) and decodes the spans
of that request's trace:

- with no marker, the request span is the rerank's RERANKER span: the served model, top_k,
  output documents best first whose ids are the input positions the response answered and whose
  scores are the ones it answered; no query or text unless the flag is on;
- with our client's marker (``x-rstage-reranker`` naming a span of the request's own trace)
  it stays a CHAIN, with no ``reranker.*`` key; a marker that names another trace, or the
  ``rstage`` ``tracestate`` entry that W3C propagation forwards from upstream, is ignored;
- every other server span (``GET /info``, ``rerank.batch``) is a CHAIN.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from retrieval_stage.server import ServerSettings, create_app
from retrieval_stage.server.reranker_span import CONTENT_OFF
from retrieval_stage.spans.handoff import HEADER
from tests.otlp_receivers import HttpReceiver, http_receiver

from .served import running_in_process
from .test_traces import Exported, exported_spans

uvicorn = pytest.importorskip("uvicorn")

MODEL = "lexical-coverage-proximity"
QUERY_MARKER = "QRYMARK2f7d"
TEXT_MARKER = "TXTMARK9b41"
QUERY = f"remove a directory tree {QUERY_MARKER}"
# Out of order on purpose: the best text is not the first, so a span that listed documents by
# response position instead of input index would name the wrong ones.
TEXTS = [
    f"json.dumps serializes an object {TEXT_MARKER}",
    f"shutil.rmtree removes a directory tree and all its contents {TEXT_MARKER}",
    f"pathlib.Path.unlink removes a file {TEXT_MARKER}",
    f"os.rmdir removes an empty directory {TEXT_MARKER}",
]
EXPORT_WAIT_S = 30.0
"""Generous: the span is exported right after the response, on a busy 2-core machine."""
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@dataclass
class App:
    url: str
    receiver: HttpReceiver


@contextmanager
def _run_app(receiver: HttpReceiver, settings: ServerSettings) -> Iterator[App]:
    provider = TracerProvider(resource=Resource.create({"service.name": "retrieval-stage-server"}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=receiver.url + "/v1/traces"))
    )
    app = create_app(settings, tracer_provider=provider)
    try:
        with running_in_process(app) as url:
            yield App(url, receiver)
    finally:
        provider.shutdown()


@pytest.fixture(scope="module")
def receiver() -> Iterator[HttpReceiver]:
    with http_receiver() as found:
        yield found


@pytest.fixture(scope="module")
def plain(receiver: HttpReceiver) -> Iterator[App]:
    with _run_app(receiver, ServerSettings(reranker="lexical")) as app:
        yield app


@pytest.fixture(scope="module")
def with_content(receiver: HttpReceiver) -> Iterator[App]:
    with _run_app(receiver, ServerSettings(reranker="lexical", trace_content=True)) as app:
        yield app


@dataclass
class Call:
    reply: httpx.Response
    spans: list[Exported]

    def one(self, name: str) -> dict[str, Any]:
        found = [s for s in self.spans if s.span.name == name]
        assert len(found) == 1, [s.span.name for s in self.spans]
        return found[0].attributes


def _call(
    app: App,
    path: str,
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    names: tuple[str, ...] = ("POST /rerank", "rerank.batch"),
) -> Call:
    """One request, and every span of its trace once `names` have all arrived."""
    before = {s.span.span_id for s in exported_spans(app.receiver)}
    if body is None:
        reply = httpx.get(app.url + path, headers=headers or {}, timeout=30.0)
    else:
        reply = httpx.post(app.url + path, json=body, headers=headers or {}, timeout=30.0)
    deadline = time.monotonic() + EXPORT_WAIT_S
    while True:
        new = [s for s in exported_spans(app.receiver) if s.span.span_id not in before]
        request = [s for s in new if s.span.name == names[0]]
        if request:
            trace_id = request[0].span.trace_id
            spans = [s for s in new if s.span.trace_id == trace_id]
            if {s.span.name for s in spans} >= set(names):
                return Call(reply, spans)
        assert time.monotonic() < deadline, [s.span.name for s in new]
        time.sleep(0.05)


def _documents(attributes: dict[str, Any], which: str) -> list[dict[str, Any]]:
    """The flattened ``reranker.<which>.<i>.document.*`` keys as one dict per position."""
    prefix = f"reranker.{which}."
    out: dict[int, dict[str, Any]] = {}
    for key, value in attributes.items():
        if key.startswith(prefix):
            position, _, field = key[len(prefix) :].partition(".document.")
            out.setdefault(int(position), {})[field] = value
    assert sorted(out) == list(range(len(out))), sorted(out)
    return [out[i] for i in range(len(out))]


def _no_text(call: Call) -> None:
    for exported in call.spans:
        text = str(exported.span)
        assert QUERY_MARKER not in text
        assert TEXT_MARKER not in text


def test_a_plain_call_makes_the_request_span_the_reranker_span(plain: App) -> None:
    call = _call(plain, "/rerank", {"query": QUERY, "texts": TEXTS})
    assert call.reply.status_code == 200
    answered = call.reply.json()
    assert answered[0]["index"] != 0, "the texts must be out of order for this test to bite"
    server = call.one("POST /rerank")
    assert server["openinference.span.kind"] == "RERANKER"
    assert server["reranker.model_name"] == MODEL
    assert server["reranker.top_k"] == len(TEXTS)
    outputs = _documents(server, "output_documents")
    assert outputs == [{"id": str(r["index"]), "score": r["score"]} for r in answered]
    assert _documents(server, "input_documents") == [{"id": str(i)} for i in range(len(TEXTS))]
    assert server["retrieval_stage.content"] == CONTENT_OFF
    assert "reranker.query" not in server
    assert "input.value" not in server
    _no_text(call)


def test_the_batch_and_info_spans_are_chains(plain: App) -> None:
    call = _call(plain, "/rerank", {"query": QUERY, "texts": TEXTS})
    assert call.one("rerank.batch")["openinference.span.kind"] == "CHAIN"
    info = _call(plain, "/info", names=("GET /info",))
    assert info.reply.status_code == 200
    assert info.one("GET /info")["openinference.span.kind"] == "CHAIN"


def test_a_caller_with_its_own_reranker_span_keeps_the_request_span_a_chain(plain: App) -> None:
    headers = {
        "traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01",
        "tracestate": "vendor=opaque7",
        HEADER: f"{TRACE_ID}-00f067aa0ba902b7",
    }
    call = _call(plain, "/rerank", {"query": QUERY, "texts": TEXTS}, headers)
    assert call.reply.status_code == 200
    assert {s.span.trace_id.hex() for s in call.spans} == {TRACE_ID}
    server = call.one("POST /rerank")
    assert server["openinference.span.kind"] == "CHAIN"
    assert not [key for key in server if key.startswith("reranker.")]
    assert server["retrieval_stage.documents"] == len(TEXTS)


def test_a_marker_naming_a_span_between_caller_and_request_is_honoured(plain: App) -> None:
    # An HTTP client instrumentation's CLIENT span sits between our RERANKER span and the
    # request: the header still comes from the direct caller, so it holds.
    headers = {
        "traceparent": f"00-{TRACE_ID}-00000000000000c1-01",
        HEADER: f"{TRACE_ID}-00f067aa0ba902b7",
    }
    call = _call(plain, "/rerank", {"query": QUERY, "texts": TEXTS}, headers)
    assert call.one("POST /rerank")["openinference.span.kind"] == "CHAIN"


@pytest.mark.parametrize(
    "marker",
    [
        "rstage=rr,vendor=opaque7",  # an earlier release's marker, forwarded from upstream
        "vendor=opaque7,rstage=other",
    ],
)
def test_a_tracestate_marker_is_not_this_hops_and_gets_a_reranker_span(
    plain: App, marker: str
) -> None:
    headers = {"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b8-01", "tracestate": marker}
    call = _call(plain, "/rerank", {"query": QUERY, "texts": TEXTS}, headers)
    assert call.one("POST /rerank")["openinference.span.kind"] == "RERANKER"


@pytest.mark.parametrize(
    "value",
    [
        f"{'1' * 32}-00f067aa0ba902b7",  # a span of another trace
        f"{TRACE_ID}-0000000000000000",  # no span
        f"{TRACE_ID}-00f067aa0ba902bz",  # not hex
        f"{TRACE_ID}00f067aa0ba902b7",  # no dash
        "rr",
    ],
)
def test_a_marker_that_names_no_span_of_this_trace_gets_a_reranker_span(
    plain: App, value: str
) -> None:
    headers = {"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b8-01", HEADER: value}
    call = _call(plain, "/rerank", {"query": QUERY, "texts": TEXTS}, headers)
    assert call.one("POST /rerank")["openinference.span.kind"] == "RERANKER"


def test_a_marker_without_trace_context_gets_a_reranker_span(plain: App) -> None:
    # No traceparent: the request starts a trace of its own, which the marker cannot name.
    headers = {HEADER: f"{TRACE_ID}-00f067aa0ba902b7"}
    call = _call(plain, "/rerank", {"query": QUERY, "texts": TEXTS}, headers)
    assert call.one("POST /rerank")["openinference.span.kind"] == "RERANKER"


def test_a_hosted_shape_lists_only_the_top_n_it_answered(plain: App) -> None:
    body = {"model": MODEL, "query": QUERY, "documents": TEXTS, "top_n": 2}
    call = _call(plain, "/v2/rerank", body, names=("POST /v2/rerank", "rerank.batch"))
    assert call.reply.status_code == 200, call.reply.text
    answered = call.reply.json()["results"]
    server = call.one("POST /v2/rerank")
    assert server["openinference.span.kind"] == "RERANKER"
    assert server["reranker.top_k"] == 2
    assert _documents(server, "output_documents") == [
        {"id": str(r["index"]), "score": r["relevance_score"]} for r in answered
    ]
    _no_text(call)


def _status(call: Call, name: str) -> int:
    (found,) = [s for s in call.spans if s.span.name == name]
    code: int = found.span.status.code
    return code


STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2  # OTLP's Status.StatusCode


def test_an_answered_rerank_and_its_batch_end_ok(plain: App) -> None:
    call = _call(plain, "/rerank", {"query": QUERY, "texts": TEXTS})
    assert _status(call, "POST /rerank") == STATUS_OK
    assert _status(call, "rerank.batch") == STATUS_OK


def test_an_answered_info_and_a_hop_under_the_callers_reranker_end_ok(plain: App) -> None:
    info = _call(plain, "/info", names=("GET /info",))
    assert _status(info, "GET /info") == STATUS_OK
    headers = {
        "traceparent": f"00-{TRACE_ID}-00f067aa0ba902c2-01",
        HEADER: f"{TRACE_ID}-00f067aa0ba902c2",
    }
    hop = _call(plain, "/rerank", {"query": QUERY, "texts": TEXTS}, headers)
    assert hop.one("POST /rerank")["openinference.span.kind"] == "CHAIN"
    assert _status(hop, "POST /rerank") == STATUS_OK


def test_a_refused_rerank_is_not_ok(plain: App) -> None:
    # A client's error: UNSET, as OpenTelemetry's HTTP conventions have it for a server.
    call = _call(plain, "/rerank", {"query": QUERY, "texts": []}, names=("POST /rerank",))
    assert call.reply.status_code == 400
    assert _status(call, "POST /rerank") == STATUS_UNSET


def test_a_refused_rerank_is_a_reranker_span_with_its_error_and_no_documents(plain: App) -> None:
    call = _call(plain, "/rerank", {"query": QUERY, "texts": []}, names=("POST /rerank",))
    assert call.reply.status_code == 400
    server = call.one("POST /rerank")
    assert server["openinference.span.kind"] == "RERANKER"
    assert server["error.type"] == "Empty"
    assert _documents(server, "output_documents") == []


def test_the_content_flag_puts_the_query_and_the_texts_on_the_span(with_content: App) -> None:
    call = _call(with_content, "/rerank", {"query": QUERY, "texts": TEXTS})
    answered = call.reply.json()
    server = call.one("POST /rerank")
    assert server["openinference.span.kind"] == "RERANKER"
    assert server["reranker.query"] == QUERY
    assert server["input.value"] == QUERY
    assert _documents(server, "input_documents") == [
        {"id": str(i), "content": text} for i, text in enumerate(TEXTS)
    ]
    assert _documents(server, "output_documents") == [
        {"id": str(r["index"]), "content": TEXTS[r["index"]], "score": r["score"]} for r in answered
    ]
    assert "retrieval_stage.content" not in server, "content is on: nothing to say"
    # The model batch under it still holds no text.
    batch = next(s for s in call.spans if s.span.name == "rerank.batch")
    assert TEXT_MARKER not in str(batch.span)


def test_input_positions_fit_under_the_span_limit_after_the_outputs() -> None:
    # 25 texts under a 64-attribute limit: the kind, the model, top_k and the content note stay,
    # the outputs (which carry the scores) come first, the positions fill what is left, and the
    # count of those cut says so; nothing is evicted.
    from opentelemetry.sdk.trace import SpanLimits
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from retrieval_stage.server.reranker_span import reranker_outcome

    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=64))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    texts = [f"t{i}" for i in range(25)]
    span = provider.get_tracer("t").start_span("POST /rerank")
    span.set_attributes({"openinference.span.kind": "RERANKER", "reranker.model_name": MODEL})
    reranker_outcome(
        span, query=QUERY, texts=texts, scores=[i / 25 for i in range(25)], top_n=None,
        model=MODEL, content=False,
    )  # fmt: skip
    span.end()
    (finished,) = exporter.get_finished_spans()
    attributes = dict(finished.attributes or {})
    assert len(attributes) <= 64
    assert attributes["openinference.span.kind"] == "RERANKER"
    assert attributes["retrieval_stage.content"] == CONTENT_OFF
    inputs = [k for k in attributes if k.startswith("reranker.input_documents.")]
    outputs = [k for k in attributes if k.startswith("reranker.output_documents.")]
    assert inputs, "some positions fit"
    assert len(inputs) + attributes["retrieval_stage.input_documents.omitted"] == len(texts)
    assert [attributes[k] for k in inputs] == [str(i) for i in range(len(inputs))]
    assert outputs[0] == "reranker.output_documents.0.document.id"


def test_the_content_flag_puts_nothing_on_a_span_whose_caller_has_the_reranker(
    with_content: App,
) -> None:
    headers = {
        "traceparent": f"00-{TRACE_ID}-00f067aa0ba902b9-01",
        HEADER: f"{TRACE_ID}-00f067aa0ba902b9",
    }
    call = _call(with_content, "/rerank", {"query": QUERY, "texts": TEXTS}, headers)
    assert call.one("POST /rerank")["openinference.span.kind"] == "CHAIN"
    _no_text(call)


def test_a_path_not_served_and_a_wrong_method_are_chains(plain: App) -> None:
    unknown = _call(plain, "/scanner/probe", names=("GET",))
    assert unknown.reply.status_code == 404
    assert unknown.one("GET")["openinference.span.kind"] == "CHAIN"
    wrong = _call(plain, "/rerank", names=("GET /rerank",))
    assert wrong.reply.status_code == 405
    assert wrong.one("GET /rerank")["openinference.span.kind"] == "CHAIN"


def test_openinferences_hide_variables_mask_the_content_flags_texts(
    receiver: HttpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENINFERENCE_HIDE_INPUTS", "true")
    monkeypatch.setenv("OPENINFERENCE_HIDE_OUTPUTS", "true")
    with _run_app(receiver, ServerSettings(reranker="lexical", trace_content=True)) as app:
        call = _call(app, "/rerank", {"query": QUERY, "texts": TEXTS})
        server = call.one("POST /rerank")
        assert server["openinference.span.kind"] == "RERANKER"
        assert server["reranker.top_k"] == len(TEXTS)
        assert _documents(server, "input_documents") == []
        assert _documents(server, "output_documents") == []
        _no_text(call)
