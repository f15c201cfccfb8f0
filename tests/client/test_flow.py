"""The one flow and its two drivers at their edges: trace context on the wire, closed clients,
messages that name what happened, /info, and the public-API transport under the sync client."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator

import anyio
import httpcore
import httpx
import pytest
from opentelemetry import baggage, context, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from structlog.testing import capture_logs

from retrieval_stage import (
    AsyncRerankClient,
    RerankClient,
    RerankStatusError,
    RerankTransportError,
)
from retrieval_stage.client.deadline_io import DeadlineTransport, httpx_error
from retrieval_stage.errors import RerankClientClosedError, RerankError
from tests.hooks import hooked

from ..conftest import WireMock

Spans = tuple[TracerProvider, InMemorySpanExporter]


def traceparent_of(span: trace.Span) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


@pytest.fixture
def with_baggage() -> Iterator[None]:
    token = context.attach(baggage.set_baggage("tenant", "acme"))
    yield
    context.detach(token)


def test_rerank_request_carries_the_callers_trace_context(
    wm: WireMock, spans: Spans, with_baggage: None
) -> None:
    provider, _ = spans
    tracer = provider.get_tracer("caller")  # not the global provider: the span is current
    with tracer.start_as_current_span("search") as span, RerankClient(wm.url + "/tei") as client:
        client.rerank("what is rust", ["rust is a language", "bananas"])
    (request,) = wm.requests("/tei/rerank")
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert headers["traceparent"] == traceparent_of(span)
    assert headers["baggage"] == "tenant=acme"


async def test_async_requests_and_info_carry_the_callers_trace_context(
    wm: WireMock, spans: Spans
) -> None:
    provider, _ = spans
    tracer = provider.get_tracer("caller")
    texts = ["t0", "t1", "t2", "t3", "t4"]
    with tracer.start_as_current_span("search") as span:
        async with AsyncRerankClient(wm.url + "/tei/split", batch_size="auto") as client:
            await client.rerank("split", texts)
    sent = wm.requests("/tei/split/info") + wm.requests("/tei/split/rerank")
    assert len(sent) == 1 + 3  # /info, then 5 texts in batches of 2 (concurrent sub-batches)
    for request in sent:
        headers = {k.lower(): v for k, v in request["headers"].items()}
        assert headers["traceparent"] == traceparent_of(span)


def test_no_trace_context_is_invented_outside_a_span(wm: WireMock) -> None:
    with RerankClient(wm.url + "/tei") as client:
        client.rerank("q", ["a", "b"])
    (request,) = wm.requests("/tei/rerank")
    assert "traceparent" not in {k.lower() for k in request["headers"]}


def test_a_closed_client_says_not_to_reuse_it() -> None:
    client = RerankClient("http://127.0.0.1:9")
    client.close()
    with pytest.raises(RerankClientClosedError, match="closed: create a new client"):
        client.rerank("q", ["a"])
    assert issubclass(RerankClientClosedError, RerankError)


async def test_a_closed_async_client_says_not_to_reuse_it() -> None:
    client = AsyncRerankClient("http://127.0.0.1:9")
    await client.aclose()
    with pytest.raises(RerankClientClosedError, match="closed"):
        await client.rerank("q", ["a"])


def test_an_async_client_from_a_closed_loop_says_where_to_create_it(wm: WireMock) -> None:
    client = AsyncRerankClient(wm.url + "/tei")

    async def use() -> object:
        return await client.rerank("q", ["a", "b"])

    asyncio.run(use())
    with pytest.raises(RerankClientClosedError, match="create the client inside the running loop"):
        asyncio.run(use())


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def rerank_once(flavour: str, url: str, **kw: object) -> None:
    """One call through the sync or the async client, built with `kw`."""
    if flavour == "sync":
        with RerankClient(url, **kw) as client:  # type: ignore[arg-type]
            client.rerank("q", ["A"])
        return

    async def call() -> None:
        async with AsyncRerankClient(url, **kw) as client:  # type: ignore[arg-type]
            await client.rerank("q", ["A"])

    asyncio.run(call())


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_refused_connection_names_the_url(flavour: str) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(
        RerankTransportError, match=f"could not connect to {url} \\(ConnectError"
    ) as caught:
        rerank_once(flavour, url, max_retries=0)
    assert caught.value.kind == "connect"
    assert caught.value.cause == "ConnectError"


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_server_that_never_answers_names_the_deadline_and_the_setting(
    wm: WireMock, flavour: str
) -> None:
    wm.stub_json("/tei/slow/rerank", [{"index": 0, "score": 1.0}], fixedDelayMilliseconds=3000)
    says = r"no answer within the 0.5 s deadline \(timeout=0.5\) after 1 request"
    with pytest.raises(RerankTransportError, match=says) as caught:
        rerank_once(flavour, wm.url + "/tei/slow", timeout=0.5)
    assert caught.value.requests == 1
    assert caught.value.kind == "deadline"


def test_tei_model_comes_from_info_when_none_was_given(wm: WireMock) -> None:
    with RerankClient(wm.url + "/tei/split", batch_size="auto") as client:
        response = client.rerank_response("split", ["t0", "t1"])
    assert response.model == "BAAI/bge-reranker-base"


def test_a_given_model_wins_over_info(wm: WireMock) -> None:
    with RerankClient(wm.url + "/tei/split", batch_size="auto", model="mine") as client:
        response = client.rerank_response("split", ["t0", "t1"])
    assert response.model == "mine"


@pytest.mark.parametrize(
    ("answer", "cause"),
    [
        ({"status": 500, "body": "boom"}, "HTTP 500"),
        (
            {"status": 200, "headers": {"Content-Type": "text/html"}, "body": "<html></html>"},
            "not JSON (text/html)",
        ),
    ],
)
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_info_failing_keeps_the_default_cap_with_one_event(
    wm: WireMock, answer: dict[str, object], cause: str, flavour: str
) -> None:
    wm.stub({"request": {"method": "GET", "urlPath": "/tei/noinfo/info"}, "response": answer})
    wm.stub_json("/tei/noinfo/rerank", [{"index": 0, "score": 0.5}, {"index": 1, "score": 0.25}])
    with capture_logs() as logs:
        if flavour == "sync":
            with RerankClient(wm.url + "/tei/noinfo", batch_size="auto") as client:
                client.rerank("q", ["a", "b"])
                client.rerank("q", ["a", "b"])
                assert client.batch_size == 32
        else:

            async def twice() -> None:
                async with AsyncRerankClient(wm.url + "/tei/noinfo", batch_size="auto") as ac:
                    await ac.rerank("q", ["a", "b"])
                    await ac.rerank("q", ["a", "b"])
                    assert ac.batch_size == 32

            asyncio.run(twice())
    events = [e for e in logs if e["event"] == "rerank.info_unavailable"]
    assert [(e["caused_by"], e["batch_size"]) for e in events] == [(cause, 32)]
    assert len(wm.requests("/tei/noinfo/info")) == 1


def test_auto_batch_for_a_provider_without_info_says_so_once_and_asks_nothing(
    wm: WireMock,
) -> None:
    wm.stub_json("/inf/rerank", {"results": [{"index": 0, "relevance_score": 0.5}]})
    with (
        capture_logs() as logs,
        RerankClient(wm.url + "/inf", provider="infinity", batch_size="auto") as client,
    ):
        client.rerank("q", ["a"])
        client.rerank("q", ["a"])
    events = [e for e in logs if e["event"] == "rerank.info_unavailable"]
    assert [e["caused_by"] for e in events] == ["infinity exposes no batch cap"]
    assert wm.requests("/inf/info") == []


def test_an_already_expired_deadline_sends_nothing(wm: WireMock) -> None:
    ticks = iter([0.0, 100.0])  # the deadline starts, then the clock is already past it

    def clock() -> float:
        return next(ticks, 100.0)

    with (
        hooked(RerankClient(wm.url + "/tei", timeout=1.0), clock=clock) as client,
        pytest.raises(RerankTransportError, match="after 0 request"),
    ):
        client.rerank("q", ["a", "b"])
    assert wm.requests("/tei/rerank") == []


def test_every_httpcore_error_has_an_httpx_twin() -> None:
    """`DeadlineTransport` maps httpcore's errors to httpx's by class name: if httpcore adds or
    renames one, this fails loudly instead of letting an httpcore error escape the client."""
    errors = [
        cls
        for cls in vars(httpcore).values()
        if isinstance(cls, type) and issubclass(cls, Exception) and cls.__module__ == "httpcore"
    ]
    assert errors
    for cls in errors:
        if cls.__name__ == "ConnectionNotAvailable":  # internal to the pool, never raised out
            continue
        mapped = httpx_error(cls("x"))
        assert mapped is not None, cls
        assert type(mapped).__name__ == cls.__name__, cls


def test_the_sync_transport_maps_a_refused_connect_to_httpx() -> None:
    with httpx.Client(transport=DeadlineTransport()) as http, pytest.raises(httpx.ConnectError):
        http.get(f"http://127.0.0.1:{closed_port()}/")


class InFlight:
    """An async TEI stand-in that counts concurrent requests and cancelled ones."""

    def __init__(self, fail_first_text: str | None = None, hold_s: float = 0.05) -> None:
        self.now = 0
        self.most = 0
        self.cancelled = 0
        self.fail_first_text = fail_first_text
        self.hold_s = hold_s

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        texts = json.loads(request.content)["texts"]
        if texts[0] == self.fail_first_text:
            return httpx.Response(400, json={"error": "bad batch", "error_type": "Validation"})
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(self.hold_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.now -= 1
        return httpx.Response(200, json=[{"index": i, "score": 0.5} for i in range(len(texts))])


async def test_async_sub_batches_run_concurrently_up_to_max_concurrency() -> None:
    server = InFlight()
    http = httpx.AsyncClient(transport=httpx.MockTransport(server))
    texts = [f"t{i}" for i in range(20)]
    async with AsyncRerankClient(
        "http://r.test", model="m", http_client=http, batch_size=2, max_concurrency=3
    ) as client:
        response = await client.rerank_response("q", texts)
    assert server.most == 3
    assert response.batches == 10
    assert sorted(t for t, _ in response.results) == sorted(texts)


async def test_one_failed_async_sub_batch_cancels_the_others_and_fails_the_call() -> None:
    server = InFlight(fail_first_text="t6", hold_s=30.0)
    http = httpx.AsyncClient(transport=httpx.MockTransport(server))
    texts = [f"t{i}" for i in range(8)]
    async with AsyncRerankClient(
        "http://r.test", model="m", http_client=http, batch_size=2, max_concurrency=8
    ) as client:
        with anyio.fail_after(10), pytest.raises(RerankStatusError, match="bad batch"):
            await client.rerank("q", texts)
    assert server.cancelled == 3
    assert server.now == 0


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_the_stages_rerank_request_names_the_exported_reranker_span(
    wm: WireMock, spans: Spans, flavour: str
) -> None:
    """The server's spans join the caller's trace under the RERANKER span the stage exported:
    the header's trace id is the span's trace id and its parent id is the span's own id."""
    from retrieval_stage import Candidate, RerankStage

    provider, exporter = spans
    candidates = [Candidate("a", "rust is a language", 0.2), Candidate("b", "bananas", 0.9)]
    if flavour == "sync":
        with RerankClient(wm.url + "/tei") as client:
            RerankStage(client, tracer_provider=provider).run("what is rust", candidates)
    else:
        async with AsyncRerankClient(wm.url + "/tei") as aclient:
            await RerankStage(aclient, tracer_provider=provider).arun("what is rust", candidates)
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes["openinference.span.kind"] == "RERANKER"
    (request,) = wm.requests("/tei/rerank")
    headers = {k.lower(): v for k, v in request["headers"].items()}
    version, trace_id, parent_id, flags = headers["traceparent"].split("-")
    assert version == "00"
    assert int(trace_id, 16) == span.context.trace_id
    assert int(parent_id, 16) == span.context.span_id
    assert int(flags, 16) & 0x01, "sampled"
