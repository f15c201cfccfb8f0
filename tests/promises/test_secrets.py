"""Secrets and privacy: the API key goes out in one header and nowhere else.

The stage runs with a key through WireMock while spans leave over real OTLP/HTTP to a WireMock
``/v1/traces`` stub and logs go to a buffer; then the exported bytes, the log text, every span
attribute and event, the reprs and the exception messages are searched for the key. The same
file pins the privacy switches (OPENINFERENCE_HIDE_INPUTS/OUTPUTS), the cap on document content
on spans, that logs carry no query or document text, and that TLS verification is on.
"""

from __future__ import annotations

import gzip
import io
import json
import ssl
import traceback
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import structlog
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from retrieval_stage import (
    AsyncRerankClient,
    Candidate,
    RerankClient,
    RerankError,
    RerankProtocolError,
    RerankStage,
    RerankStatusError,
)
from retrieval_stage.spans import DEFAULT_MAX_CONTENT_BYTES, TRUNCATION_MARKER
from retrieval_stage.telemetry import configure_logging, configure_tracing
from tests.hooks import hooked

from ..conftest import WireMock

Spans = tuple[TracerProvider, InMemorySpanExporter]

SECRET = "sk-live-7Qm2Xv9Lr4Tz8Wp1Nc6Hb3Jd5Fg0Ks"
QUERY = "which insulin dose is safe for my daughter"
TEXTS = ["patient record alpha: glucose high", "patient record beta: glucose normal"]


def leaks(haystack: str | bytes, secret: str = SECRET, shortest: int = 8) -> bool:
    """Whether `haystack` holds the secret or any piece of it `shortest` characters long.

    Pieces matter: a message cut in the middle of the key would still give half of it away.
    """
    text = haystack.decode("utf-8", errors="replace") if isinstance(haystack, bytes) else haystack
    return any(secret[i : i + shortest] in text for i in range(len(secret) - shortest + 1))


def test_leaks_finds_whole_and_partial_keys() -> None:
    assert leaks(f"token={SECRET}")
    assert leaks(b"..." + SECRET[:10].encode())
    assert leaks(SECRET[-9:])
    assert not leaks("sk-live"), "seven characters are not a piece"
    assert not leaks("nothing here")


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    """structlog configured as an application would (DEBUG, JSON) into a buffer."""
    stream = io.StringIO()
    configure_logging("DEBUG", stream=stream)
    try:
        yield stream
    finally:
        structlog.reset_defaults()


def cands() -> list[Candidate]:
    return [
        Candidate("a", TEXTS[0], 0.9, metadata={"source": "ehr"}),
        Candidate("b", TEXTS[1], 0.4),
    ]


def stub_otlp(wm: WireMock) -> None:
    wm.stub(
        {
            "request": {"method": "POST", "urlPath": "/v1/traces"},
            "response": {"status": 200, "headers": {"Content-Type": "application/x-protobuf"}},
        }
    )


def stub_scenarios(wm: WireMock) -> None:
    """/ok answers; /flaky fails with 503 once; /echo is a 401 whose body quotes the key."""
    ok = [{"index": 1, "score": 0.97}, {"index": 0, "score": 0.02}]
    wm.stub_json("/ok/rerank", ok)
    for state, response in (
        ("Started", {"status": 503, "body": '{"error": "loading", "error_type": "Unhealthy"}'}),
        ("recovered", {"status": 200, "body": json.dumps(ok)}),
    ):
        wm.stub(
            {
                "scenarioName": "flaky",
                "requiredScenarioState": state,
                **({"newScenarioState": "recovered"} if state == "Started" else {}),
                "request": {"method": "POST", "urlPath": "/flaky/rerank"},
                "response": {**response, "headers": {"Content-Type": "application/json"}},
            }
        )
    wm.stub_json(
        "/echo/rerank",
        {"error": f"invalid api key {SECRET} for this deployment", "error_type": "Unauthorized"},
        status=401,
    )


def exported_payloads(wm: WireMock) -> list[bytes]:
    """The raw OTLP request bodies WireMock received, un-gzipped if they were compressed."""
    out = []
    for request, raw in zip(wm.requests("/v1/traces"), wm.raw_bodies("/v1/traces"), strict=True):
        headers = {k.lower(): v for k, v in request["headers"].items()}
        encoding = str(headers.get("content-encoding", ""))
        out.append(gzip.decompress(raw) if "gzip" in encoding else raw)
    return out


def every_span_value(span: ReadableSpan) -> list[str]:
    """Every string a span carries: attributes, event attributes, status, name."""
    values: list[str] = [span.name, str(span.status.description or "")]
    for key, value in (span.attributes or {}).items():
        values += [key, str(value)]
    for event in span.events:
        values.append(event.name)
        for key, value in (event.attributes or {}).items():
            values += [key, str(value)]
    return values


# -- the key appears in the outgoing header and nowhere else -------------------------------


def test_api_key_appears_only_in_the_outgoing_header(wm: WireMock, log_stream: io.StringIO) -> None:
    stub_otlp(wm)
    stub_scenarios(wm)
    memory = InMemorySpanExporter()
    provider = configure_tracing("secrets-test", endpoint=wm.url)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    errors: list[BaseException] = []
    reprs: list[str] = []
    try:
        for path in ("/ok", "/flaky", "/echo"):
            with hooked(
                RerankClient(wm.url + path, api_key=SECRET, model="bge"), random=lambda: 1.0
            ) as client:
                stage = RerankStage(client, tracer_provider=provider)
                reprs += [repr(client), str(client), repr(stage), repr(stage.trace_config)]
                stage.run(QUERY, cands())
                raising = RerankStage(client, tracer_provider=provider, on_error="raise")
                try:
                    raising.run(QUERY, cands())
                except RerankError as exc:
                    errors.append(exc)
        assert provider.force_flush(10_000)
    finally:
        provider.shutdown()

    # The positive control: the key did go out, in the apikey header of every rerank request.
    rerank_requests = [r for r in wm.requests() if r["url"].endswith("/rerank")]
    assert len(rerank_requests) == 2 + 3 + 2, "ok twice, flaky 503+200+200, echo twice"
    for request in rerank_requests:
        headers = {k.lower(): v for k, v in request["headers"].items()}
        assert headers["apikey"] == SECRET
        without_key = {k: v for k, v in headers.items() if k != "apikey"}
        assert not leaks(json.dumps(without_key)), "only the apikey header holds it"
        assert not leaks(request["body"])

    # The OTLP payload is real (it carries the query) and holds no piece of the key.
    payloads = exported_payloads(wm)
    assert payloads
    assert any(QUERY.encode() in p for p in payloads)
    assert not any(leaks(p) for p in payloads)

    # Every span attribute, event and status.
    finished = memory.get_finished_spans()
    assert len(finished) == 6
    assert any("rerank.retry_scheduled" in every_span_value(s) for s in finished)
    for span in finished:
        assert not any(leaks(v) for v in every_span_value(span)), span.name

    # The logs (the retry and both fallbacks were logged).
    logged = log_stream.getvalue()
    assert "rerank.retry_scheduled" in logged
    assert "rerank.fallback" in logged
    assert not leaks(logged)

    # Reprs, and the exception the server's echo produced.
    assert "api_key=<set>" in reprs[0]
    assert not any(leaks(r) for r in reprs)
    (error,) = errors
    assert isinstance(error, RerankStatusError)
    assert error.status_code == 401
    assert "invalid api key *** for this deployment" in str(error)
    text = "".join(traceback.format_exception(error))
    assert not leaks(text)
    assert not leaks(repr(error))


def test_bearer_header_carries_the_key_and_nothing_else_does(wm: WireMock) -> None:
    stub_scenarios(wm)
    with RerankClient(wm.url + "/ok", api_key=SECRET, api_key_header="Authorization") as c:
        c.rerank(QUERY, TEXTS)
    (request,) = wm.requests("/ok/rerank")
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert headers["authorization"] == f"Bearer {SECRET}"
    assert not leaks(json.dumps({k: v for k, v in headers.items() if k != "authorization"}))


ECHOES: dict[str, dict[str, Any]] = {
    "json error": {
        "status": 401,
        "headers": {"Content-Type": "application/json"},
        "body": json.dumps({"message": f"key {SECRET} revoked"}),
    },
    "key cut by the 500-character message limit": {
        "status": 403,
        "headers": {"Content-Type": "text/plain"},
        "body": "x" * 490 + SECRET,
    },
    "2xx html page": {
        "status": 200,
        "headers": {"Content-Type": "text/html"},
        "body": f"<html>{SECRET}</html>",
    },
    "2xx html page cutting the key": {
        "status": 200,
        "headers": {"Content-Type": "text/html"},
        "body": "<html>" + "." * 40 + SECRET + "</html>",
    },
    "2xx json quoting the key in a result": {
        "status": 200,
        "headers": {"Content-Type": "application/json"},
        "body": json.dumps([{"index": SECRET, "score": 1.0}, {"index": 0, "score": 0.5}]),
    },
    "2xx json quoting the key in the envelope": {
        "status": 200,
        "headers": {"Content-Type": "application/json"},
        "body": json.dumps({SECRET: []}),
    },
}


@pytest.mark.parametrize("case", sorted(ECHOES))
def test_a_server_echoing_the_key_cannot_put_it_in_an_exception(wm: WireMock, case: str) -> None:
    wm.stub({"request": {"method": "POST", "urlPath": "/echo/rerank"}, "response": ECHOES[case]})
    with (
        RerankClient(wm.url + "/echo", api_key=SECRET) as client,
        pytest.raises(RerankError) as caught,
    ):
        client.rerank(QUERY, TEXTS)
    error = caught.value
    assert isinstance(error, (RerankStatusError, RerankProtocolError))
    texts = [str(error), repr(error), "".join(traceback.format_exception(error))]
    if isinstance(error, RerankStatusError):
        texts.append(error.server_message)
    assert not any(leaks(t) for t in texts), texts[0]


async def test_async_client_redacts_the_echo_too(wm: WireMock) -> None:
    wm.stub(
        {
            "request": {"method": "POST", "urlPath": "/echo/rerank"},
            "response": ECHOES["2xx html page"],
        }
    )
    async with AsyncRerankClient(wm.url + "/echo", api_key=SECRET) as client:
        with pytest.raises(RerankProtocolError) as caught:
            await client.rerank(QUERY, TEXTS)
    assert not leaks(str(caught.value))
    assert "***" in str(caught.value)


@pytest.mark.parametrize("bad", [SECRET + "\n", " " + SECRET, SECRET + "\r\nX-Injected: 1", "ключ"])
def test_a_key_that_could_not_be_a_header_is_refused_without_echoing_it(bad: str) -> None:
    with pytest.raises(ValueError, match=r"^api_key must ") as caught:
        RerankClient("http://127.0.0.1:9", api_key=bad)
    assert getattr(caught.value, "field", None) == "api_key"
    assert not leaks(str(caught.value), secret=bad.strip(), shortest=4)


# -- OPENINFERENCE_HIDE_INPUTS / OPENINFERENCE_HIDE_OUTPUTS --------------------------------


def run_ok(wm: WireMock, spans: Spans, **stage_kw: Any) -> ReadableSpan:
    provider, exporter = spans
    with RerankClient(wm.url + "/ok") as client:
        RerankStage(client, tracer_provider=provider, **stage_kw).run(QUERY, cands())
    (span,) = exporter.get_finished_spans()
    return span


def keys_with(span: ReadableSpan, fragment: str) -> list[str]:
    return [k for k in (span.attributes or {}) if fragment in k]


def test_by_default_query_and_documents_are_on_the_span(wm: WireMock, spans: Spans) -> None:
    stub_scenarios(wm)
    span = run_ok(wm, spans)
    attributes = span.attributes or {}
    assert attributes["reranker.query"] == QUERY
    assert attributes["reranker.input_documents.0.document.content"] == TEXTS[0]
    assert attributes["reranker.output_documents.0.document.content"] == TEXTS[1]


def test_hide_inputs_redacts_the_query_and_drops_input_documents(
    wm: WireMock, spans: Spans, monkeypatch: pytest.MonkeyPatch
) -> None:
    stub_scenarios(wm)
    monkeypatch.setenv("OPENINFERENCE_HIDE_INPUTS", "true")
    span = run_ok(wm, spans)
    attributes = span.attributes or {}
    assert attributes["reranker.query"] == "__REDACTED__"
    assert keys_with(span, "reranker.input_documents") == []
    assert keys_with(span, "reranker.output_documents"), "outputs are still shown"
    assert QUERY not in " ".join(every_span_value(span))


def test_hide_outputs_drops_output_documents(
    wm: WireMock, spans: Spans, monkeypatch: pytest.MonkeyPatch
) -> None:
    stub_scenarios(wm)
    monkeypatch.setenv("OPENINFERENCE_HIDE_OUTPUTS", "true")
    span = run_ok(wm, spans)
    assert keys_with(span, "reranker.output_documents") == []
    assert keys_with(span, "reranker.input_documents"), "inputs are still shown"
    assert (span.attributes or {})["reranker.query"] == QUERY


def test_hiding_both_leaves_no_query_or_document_text_on_the_span(
    wm: WireMock, spans: Spans, monkeypatch: pytest.MonkeyPatch
) -> None:
    stub_scenarios(wm)
    monkeypatch.setenv("OPENINFERENCE_HIDE_INPUTS", "true")
    monkeypatch.setenv("OPENINFERENCE_HIDE_OUTPUTS", "true")
    span = run_ok(wm, spans)
    everything = " ".join(every_span_value(span))
    for text in [QUERY, *TEXTS]:
        assert text not in everything
    assert (span.attributes or {})["openinference.span.kind"] == "RERANKER"


# -- document content on spans is capped ---------------------------------------------------


def contents(span: ReadableSpan) -> dict[str, str]:
    return {k: str(v) for k, v in (span.attributes or {}).items() if k.endswith("document.content")}


@pytest.mark.parametrize(
    "long_text",
    ["x" * 5000, "é" * 3000, "🦀" * 1000, "a" + "€" * 700],
    ids=["ascii", "two-byte", "four-byte", "three-byte-offset"],
)
def test_long_content_is_capped_under_the_default_with_a_marker(
    wm: WireMock, spans: Spans, long_text: str
) -> None:
    stub_scenarios(wm)
    provider, exporter = spans
    docs = [Candidate("long", long_text, 0.9), Candidate("short", "short text", 0.1)]
    with RerankClient(wm.url + "/ok") as client:
        RerankStage(client, tracer_provider=provider).run(QUERY, docs)
    (span,) = exporter.get_finished_spans()
    found = contents(span)
    assert len(found) == 4
    for key, value in found.items():
        size = len(value.encode("utf-8"))
        assert size <= DEFAULT_MAX_CONTENT_BYTES < 2048, key
        if value == "short text":
            continue
        assert value.endswith(TRUNCATION_MARKER)
        assert long_text.startswith(value.removesuffix(TRUNCATION_MARKER))
        assert size > DEFAULT_MAX_CONTENT_BYTES - 4 - len(TRUNCATION_MARKER.encode()), (
            "not over-cut"
        )


def test_content_cap_is_configurable(wm: WireMock, spans: Spans) -> None:
    stub_scenarios(wm)
    span = run_ok(wm, spans, max_content_length=24)
    for value in contents(span).values():
        assert len(value.encode("utf-8")) <= 24
        assert value.endswith(TRUNCATION_MARKER)


# -- logs carry no query or document text ---------------------------------------------------


def test_logs_never_carry_query_or_document_text(wm: WireMock, log_stream: io.StringIO) -> None:
    stub_scenarios(wm)
    wm.stub_json(
        "/invalid/rerank", {"error": "input too long", "error_type": "Validation"}, status=422
    )
    wm.stub_json("/lying/rerank", [{"index": 0, "score": "high"}, {"index": 1, "score": 0.2}])
    wm.stub(
        {
            "request": {"method": "POST", "urlPath": "/reset/rerank"},
            "response": {"fault": "CONNECTION_RESET_BY_PEER"},
        }
    )
    for path in ("/ok", "/flaky", "/invalid", "/lying", "/reset"):
        with hooked(RerankClient(wm.url + path, max_retries=1), random=lambda: 1.0) as client:
            RerankStage(client).run(QUERY, cands())
    logged = log_stream.getvalue()
    events = [json.loads(line)["event"] for line in logged.splitlines()]
    assert "rerank.retry_scheduled" in events
    assert events.count("rerank.fallback") == 3
    for text in [QUERY, *TEXTS]:
        assert text not in logged
        assert text.split(":")[0] not in logged


# -- TLS -----------------------------------------------------------------------------------


def ssl_context(http: httpx.Client | httpx.AsyncClient) -> ssl.SSLContext:
    """The SSL context of httpx's default transport (the pool that opens the connections)."""
    context = http._transport._pool._ssl_context  # type: ignore[union-attr]
    assert isinstance(context, ssl.SSLContext)
    return context


def test_tls_verification_is_on_by_default() -> None:
    client = RerankClient("https://reranker.example")
    try:
        context = ssl_context(client._http)
        assert context.verify_mode == ssl.CERT_REQUIRED
        assert context.check_hostname
    finally:
        client.close()


async def test_async_tls_verification_is_on_by_default() -> None:
    """The context the async client's aiohttp connections use (tests/client/test_aiohttp_io.py
    also shows an untrusted certificate refused over a real connection)."""
    async with AsyncRerankClient("https://reranker.example") as client:
        assert client._aio is not None
        context = client._aio.ssl_context
        assert context is not None
        assert context.verify_mode == ssl.CERT_REQUIRED
        assert context.check_hostname


def test_tls_check_would_see_verification_turned_off() -> None:
    with httpx.Client(verify=False) as http:
        assert ssl_context(http).verify_mode == ssl.CERT_NONE
