"""What keeps the hot path cheap, pinned by counting, never by timing.

A sampled-out or no-op span must cost no document attributes on any outcome; a client makes
its httpx client once, not per call; each response body is decoded once. The benchmarks
(`python -m benchmarks`) measure the speed; these tests only keep the structure that makes it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import httpx
import pytest
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import NoOpTracerProvider

import retrieval_stage.spans.fit as fit_module
import retrieval_stage.spans.reranker as reranker_spans
from retrieval_stage import (
    AsyncRerankClient,
    Candidate,
    RerankClient,
    RerankStage,
    RerankTransportError,
)
from retrieval_stage.client import codec
from retrieval_stage.spans.deferred import DEFER_ENV, DeferredAttributes

from ..conftest import WireMock
from ..fakes import AsyncByLength, ByLength, Failing


def fifty() -> list[Candidate]:
    return [Candidate(f"doc-{i}", f"text number {i}", 1.0 - i / 50) for i in range(50)]


def by_length(fail: bool = False) -> ByLength | Failing:
    """A reranker scoring by text length, or failing when told to."""
    return Failing(RerankTransportError("down")) if fail else ByLength()


@pytest.fixture
def doc_attribute_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count calls of `outcome_plan` (the end-of-call attributes, the documents' record
    included) under the name the stage reaches it by."""
    calls: list[int] = []
    real = fit_module.outcome_plan

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(reranker_spans, "outcome_plan", counting)
    return calls


@pytest.fixture
def recording() -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    yield provider
    provider.shutdown()


NOT_RECORDING: dict[str, Callable[[], Any]] = {
    "sampler ALWAYS_OFF": lambda: TracerProvider(sampler=ALWAYS_OFF),
    "no-op provider": NoOpTracerProvider,
}


def test_recording_span_builds_document_attributes_once(
    doc_attribute_calls: list[int], recording: TracerProvider
) -> None:
    """The control: the counter sits where the stage really calls it."""
    RerankStage(ByLength(), tracer_provider=recording).run("q", fifty())
    assert doc_attribute_calls == [1]


@pytest.mark.parametrize("make_provider", NOT_RECORDING.values(), ids=list(NOT_RECORDING))
@pytest.mark.parametrize("on_error", ["fallback", "raise"])
@pytest.mark.parametrize("fail", [False, True], ids=["ok", "failing"])
def test_non_recording_span_builds_no_document_attributes(
    doc_attribute_calls: list[int],
    make_provider: Callable[[], Any],
    on_error: Any,
    fail: bool,
) -> None:
    stage = RerankStage(by_length(fail), tracer_provider=make_provider(), on_error=on_error)
    if fail and on_error == "raise":
        with pytest.raises(RerankTransportError):
            stage.run("q", fifty())
    else:
        assert len(stage.run("q", fifty())) == 50
    assert doc_attribute_calls == []


async def test_non_recording_async_stage_builds_no_document_attributes(
    doc_attribute_calls: list[int],
) -> None:
    stage = RerankStage(AsyncByLength(), tracer_provider=TracerProvider(sampler=ALWAYS_OFF))
    assert len(await stage.arun("q", fifty())) == 50
    assert doc_attribute_calls == []


TEI_TWO = [{"index": 1, "score": 0.9}, {"index": 0, "score": 0.1}]


@pytest.fixture
def http_clients_made(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the HTTP client classes (httpx's, aiohttp's session) made while the test runs."""
    made: list[str] = []
    for cls in (httpx.Client, httpx.AsyncClient, aiohttp.ClientSession):
        real_init = cls.__init__

        def init(self: Any, *args: Any, __real: Any = real_init, **kwargs: Any) -> None:
            made.append(type(self).__name__)
            __real(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", init)
    return made


def test_sync_client_makes_one_http_client_for_many_calls(
    wm: WireMock, http_clients_made: list[str]
) -> None:
    wm.stub_json("/hot/rerank", TEI_TWO)
    with RerankClient(wm.url + "/hot") as client:
        stage = RerankStage(client, tracer_provider=TracerProvider(sampler=ALWAYS_OFF))
        for _ in range(3):
            client.rerank("q", ["a", "b"])
            stage.run("q", [Candidate("a", "a"), Candidate("b", "b")])
    assert http_clients_made == ["Client"]
    assert len(wm.requests("/hot/rerank")) == 6


async def test_async_client_makes_one_http_client_for_many_calls(
    wm: WireMock, http_clients_made: list[str]
) -> None:
    wm.stub_json("/hot/rerank", TEI_TWO)
    async with AsyncRerankClient(wm.url + "/hot") as client:
        stage = RerankStage(client, tracer_provider=TracerProvider(sampler=ALWAYS_OFF))
        for _ in range(3):
            await client.rerank("q", ["a", "b"])
            await stage.arun("q", [Candidate("a", "a"), Candidate("b", "b")])
    assert http_clients_made == ["ClientSession"]  # one aiohttp session, opened on first use
    assert len(wm.requests("/hot/rerank")) == 6


@pytest.mark.parametrize(
    ("texts", "batch_size", "requests"),
    [(["a", "b"], None, 1), (["a", "b", "c", "d"], 2, 2)],
    ids=["one batch", "two batches"],
)
def test_each_response_body_is_decoded_once(
    wm: WireMock,
    monkeypatch: pytest.MonkeyPatch,
    texts: list[str],
    batch_size: int | None,
    requests: int,
) -> None:
    wm.stub_json("/hot/rerank", TEI_TWO)
    with RerankClient(wm.url + "/hot", batch_size=batch_size) as client:
        decoded: list[int] = []

        def counting(real_loads: Callable[..., Any]) -> Callable[..., Any]:
            def counting_loads(*args: Any, **kwargs: Any) -> Any:
                decoded.append(1)
                return real_loads(*args, **kwargs)

            return counting_loads

        # Either decoder the client's codec may use (orjson, else json) counts.
        monkeypatch.setattr(json, "loads", counting(json.loads))
        if codec.ORJSON is not None:
            monkeypatch.setattr(codec.ORJSON, "loads", counting(codec.ORJSON.loads))
        result = client.rerank_response("q", texts)
        monkeypatch.undo()
    assert result.requests == requests
    assert len(decoded) == requests


@pytest.fixture
def set_attributes_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of the attribute writes to SDK spans while the test runs: the SDK's
    `set_attributes`, the writer's shortcut past it (`otel_private.set_span_attributes`, as
    `spans.deferred` calls it, counted once even when it hands over to the SDK) and the one
    locked write of an outcome whose documents are kept as a record (its outcome counted)."""
    from opentelemetry.sdk.trace import Span as SdkSpan

    import retrieval_stage.spans.deferred as deferred

    sizes: list[int] = []
    real = SdkSpan.set_attributes
    real_shortcut = deferred.set_span_attributes
    real_store = deferred._store_and_keep
    inside: list[bool] = []

    def counting(self: Any, attributes: Any) -> None:
        if not inside:
            sizes.append(len(attributes))
        real(self, attributes)

    def counting_shortcut(span: Any, attributes: Any, **options: Any) -> None:
        sizes.append(len(attributes))
        inside.append(True)
        try:
            real_shortcut(span, attributes, **options)
        finally:
            inside.pop()

    def counting_store(bounded: Any, head: Any, record: Any) -> bool:
        kept = real_store(bounded, head, record)
        if kept and head:
            sizes.append(len(head))
        return kept

    monkeypatch.setattr(SdkSpan, "set_attributes", counting)
    monkeypatch.setattr(deferred, "set_span_attributes", counting_shortcut)
    monkeypatch.setattr(deferred, "_store_and_keep", counting_store)
    return sizes


@pytest.mark.parametrize("fail", [False, True], ids=["ok", "fallback"])
def test_a_recording_span_gets_its_outcome_in_one_call_and_its_documents_as_a_record(
    set_attributes_calls: list[int], fail: bool
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    RerankStage(by_length(fail), tracer_provider=provider).run("q", fifty())
    (size,) = set_attributes_calls
    assert size < 20  # the outcome alone
    (span,) = exporter.get_finished_spans()
    assert type(span._attributes) is DeferredAttributes  # nothing has read the span yet
    attributes = span.attributes or {}
    assert attributes["reranker.input_documents.0.document.id"] == "doc-0"  # 128 attributes:
    assert attributes["retrieval_stage.input_documents.omitted"] > 0  # not all of them fit
    assert type(span._attributes) is BoundedAttributes


@pytest.mark.parametrize("fail", [False, True], ids=["ok", "fallback"])
def test_with_deferring_off_the_documents_follow_the_outcome_in_one_more_call(
    set_attributes_calls: list[int],
    recording: TracerProvider,
    fail: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(DEFER_ENV, "0")
    RerankStage(by_length(fail), tracer_provider=recording).run("q", fifty())
    outcome, documents = set_attributes_calls
    assert outcome < 20
    assert documents >= 100  # 50 inputs of id, text and score at least


def test_document_keys_past_the_precomputed_bound_name_their_position() -> None:
    from opentelemetry.sdk.trace import SpanLimits

    n = fit_module.KEY_CACHE_BOUND + 10
    cands = [Candidate(f"doc-{i}", f"t{i}", float(i)) for i in range(n)]
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=SpanLimits.UNSET))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    RerankStage(ByLength(), tracer_provider=provider).run("q", cands)
    (span,) = exporter.get_finished_spans()
    attributes = span.attributes or {}
    for i in (0, fit_module.KEY_CACHE_BOUND - 1, fit_module.KEY_CACHE_BOUND, n - 1):
        assert attributes[f"reranker.input_documents.{i}.document.id"] == f"doc-{i}"
        assert attributes[f"reranker.input_documents.{i}.document.score"] == float(i)
    # ByLength: longer text first, then input order; position 0 of the output is doc-1000.
    assert attributes["reranker.output_documents.0.document.id"] == "doc-1000"
    assert attributes[f"reranker.output_documents.{n - 1}.document.id"] == "doc-9"
    assert attributes[f"reranker.output_documents.{n - 1}.document.score"] == 2.0


def test_the_frames_a_call_waits_in_make_no_closure_cells() -> None:
    """A function's closure variables are cell objects made when its frame starts. These
    frames stay alive through a call's whole request, so their cells would too, and at 64
    calls in flight every garbage collection walks them all (issue 38): the frames an async
    call waits in share nothing with a closure."""
    import retrieval_stage.protocols as protocols
    from retrieval_stage.client import aiohttp_io, flow

    waiting = [
        RerankStage.arun,
        RerankStage.arun_outcome,
        RerankStage._acall,
        protocols.acall_reranker,
        AsyncRerankClient.rerank,
        AsyncRerankClient.rerank_response,
        AsyncRerankClient._drive_until,
        AsyncRerankClient._drive,
        AsyncRerankClient._fork,
        AsyncRerankClient._send,
        aiohttp_io.AiohttpIO.request,
        flow.Call.flow,
        flow.Call._fork,
        flow.Call._batch,
    ]
    assert {f.__qualname__: f.__code__.co_cellvars for f in waiting if f.__code__.co_cellvars} == {}
