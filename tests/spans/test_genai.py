"""OpenTelemetry's GenAI names on the RERANKER span, behind their opt-in (issue 39).

- ``OTEL_SEMCONV_STABILITY_OPT_IN`` is read as OpenTelemetry's instrumentations read it (a
  comma-separated list), when the stage is built; ``genai_conventions=`` overrides it;
- with it, the same span carries exactly the GenAI names beside everything it had before;
  without it, none of them;
- ``server.address``/``server.port`` come from the client's base URL, without its credentials
  or path; ``gen_ai.response.model`` only from what the server's answer said;
- a failure's ``error.type``: an HTTP status as its code, else the exception's qualified name.

Real WireMock behind our real clients; spans read from the SDK's in-memory exporter.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from retrieval_stage import (
    AsyncRerankClient,
    Candidate,
    RerankClient,
    RerankResponse,
    RerankStage,
)
from retrieval_stage.spans.genai import genai_opted_in, server_of

from ..conftest import WireMock

T = TypeVar("T")
Spans = tuple[TracerProvider, InMemorySpanExporter]

OPT_IN = "OTEL_SEMCONV_STABILITY_OPT_IN"
GENAI_KEYS = {
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.request.model",
    "gen_ai.response.model",
    "gen_ai.rerank.candidate.count",
    "gen_ai.rerank.top_n",
    "server.address",
    "server.port",
}
PASSWORD = "s3cret-pw"


def three() -> list[Candidate]:
    """As many candidates as the WireMock provider fixtures answer for."""
    return [Candidate(f"d{i}", f"text number {i}", score=1.0 - i / 10) for i in range(3)]


def with_credentials(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://reranker:{PASSWORD}@{rest}"


def host_port(url: str) -> tuple[str, int]:
    found = server_of(url)
    assert found is not None
    return found


def only_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    (span,) = exporter.get_finished_spans()
    exporter.clear()
    return span


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


# -- the opt-in ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "on"),
    [
        ("gen_ai_latest_experimental", True),
        ("http,gen_ai_latest_experimental", True),
        (" database , gen_ai_latest_experimental ", True),
        ("", False),
        ("http", False),
        ("gen_ai_latest_experimental/dup", False),
        ("gen_ai_latest", False),
    ],
)
def test_opt_in_is_a_comma_separated_list_entry(value: str, on: bool) -> None:
    assert genai_opted_in({OPT_IN: value}) is on


def test_opt_in_unset_is_off() -> None:
    assert genai_opted_in({}) is False


def test_stage_reads_the_opt_in_when_built_and_the_keyword_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = RerankClient("http://127.0.0.1:9", provider="cohere", model="rerank-v3.5")
    monkeypatch.setenv(OPT_IN, "http,gen_ai_latest_experimental")
    on = RerankStage(client)
    off = RerankStage(client, genai_conventions=False)
    monkeypatch.delenv(OPT_IN)
    assert on.genai_conventions is True  # read once, at construction: unsetting later keeps it
    assert off.genai_conventions is False
    assert RerankStage(client).genai_conventions is False
    assert RerankStage(client, genai_conventions=True).genai_conventions is True
    client.close()


# -- the span --------------------------------------------------------------------------------


def test_opted_in_span_carries_the_genai_names_beside_everything_else(
    wm: WireMock, spans: Spans, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, exporter = spans
    base_url = with_credentials(wm.url) + "/cohere/top2"
    with RerankClient(base_url, provider="cohere", model="rerank-v3.5", max_retries=0) as client:
        plain = RerankStage(client, top_k=2, tracer_provider=provider)
        monkeypatch.setenv(OPT_IN, "gen_ai_latest_experimental")
        opted = RerankStage(client, top_k=2, tracer_provider=provider)
        assert [r.candidate.id for r in plain.run("capital?", three())] == ["d2", "d0"]
        before = attributes(only_span(exporter))
        assert [r.candidate.id for r in opted.run("capital?", three())] == ["d2", "d0"]
        after = attributes(only_span(exporter))

    address, port = host_port(wm.url)
    added = {key: after.pop(key) for key in GENAI_KEYS & after.keys()}
    assert added == {
        "gen_ai.operation.name": "rerank",
        "gen_ai.provider.name": "cohere",
        "gen_ai.request.model": "rerank-v3.5",
        # Cohere's answer names no model: no gen_ai.response.model.
        "gen_ai.rerank.candidate.count": 3,
        "gen_ai.rerank.top_n": 2,
        "server.address": address,
        "server.port": port,
    }
    assert after == before  # OpenInference's and our own names, unchanged by the opt-in
    assert not GENAI_KEYS & before.keys()
    assert "error.type" not in before
    # The URL's credentials and path reach no attribute.
    shown = repr(added) + repr(after)
    assert PASSWORD not in shown
    assert "reranker:" not in shown
    assert "/cohere" not in repr(added)


def test_response_model_is_what_the_servers_answer_named(wm: WireMock, spans: Spans) -> None:
    provider, exporter = spans
    with RerankClient(wm.url + "/vllm/all", provider="vllm", model="configured-alias") as client:
        stage = RerankStage(client, tracer_provider=provider, genai_conventions=True)
        stage.run("capital?", three())
    got = attributes(only_span(exporter))
    assert got["gen_ai.request.model"] == "configured-alias"
    assert got["gen_ai.response.model"] == "BAAI/bge-reranker-v2-m3"  # the fixture's "model"
    assert got["gen_ai.provider.name"] == "vllm"
    assert "gen_ai.rerank.top_n" not in got  # every result kept: no cut asked for


class ReportsItsModel:
    """A reranker of the caller's own whose answer names the model that produced it."""

    provider = "in-house"
    model_name = "configured-model"

    def rerank_response(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> RerankResponse[T]:
        ranked = [(item, 10.0 - i) for i, item in enumerate(reversed(items))]
        return RerankResponse(results=ranked, model="served-model-v2")

    def rerank(self, query: str, items: Sequence[T], **kwargs: Any) -> list[tuple[T, float]]:
        return self.rerank_response(query, items, **kwargs).results


def test_a_rerankers_own_answer_names_the_response_model_and_no_server(spans: Spans) -> None:
    provider, exporter = spans
    stage = RerankStage(ReportsItsModel(), tracer_provider=provider, genai_conventions=True)
    stage.run("q", three(), top_k=1)
    got = attributes(only_span(exporter))
    assert {k: got[k] for k in GENAI_KEYS & got.keys()} == {
        "gen_ai.operation.name": "rerank",
        "gen_ai.provider.name": "in-house",
        "gen_ai.request.model": "configured-model",
        "gen_ai.response.model": "served-model-v2",
        "gen_ai.rerank.candidate.count": 3,
        "gen_ai.rerank.top_n": 1,
    }


# -- failures --------------------------------------------------------------------------------


def test_http_error_type_is_the_status_code_with_the_opt_in_and_the_class_without(
    wm: WireMock, spans: Spans
) -> None:
    provider, exporter = spans
    with RerankClient(wm.url + "/cohere/error", provider="cohere", model="m", max_retries=0) as c:
        for genai, expected in ((True, "400"), (False, "RerankStatusError")):
            stage = RerankStage(c, tracer_provider=provider, genai_conventions=genai)
            stage.run("q", three())  # falls back to recall order
            got = attributes(only_span(exporter))
            assert got["retrieval_stage.fallback"] is True
            assert got["error.type"] == expected
            assert ("gen_ai.operation.name" in got) is genai


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_transport_error_type_is_the_class_name(spans: Spans) -> None:
    provider, exporter = spans
    port = closed_port()
    with RerankClient(
        f"http://127.0.0.1:{port}", provider="tei", model="m", max_retries=0, timeout=5.0
    ) as client:
        stage = RerankStage(client, tracer_provider=provider, genai_conventions=True)
        stage.run("q", three())
    got = attributes(only_span(exporter))
    assert got["error.type"] == "RerankTransportError"
    assert (got["server.address"], got["server.port"]) == ("127.0.0.1", port)
    assert got["gen_ai.provider.name"] == "tei"


class Vendor:
    """A vendor SDK whose error class is nested, as some are (``openai``'s are not)."""

    class Error(Exception):
        pass


class Raises:
    provider = "in-house"
    model_name = "m"

    def rerank(self, query: str, items: Sequence[T], **kwargs: Any) -> list[tuple[T, float]]:
        raise Vendor.Error("the vendor SDK's own error")


def test_an_escaping_exception_sets_its_qualified_name_only_with_the_opt_in(
    spans: Spans,
) -> None:
    provider, exporter = spans
    for genai in (True, False):
        stage = RerankStage(
            Raises(), on_error="raise", tracer_provider=provider, genai_conventions=genai
        )
        with pytest.raises(Vendor.Error, match="vendor SDK"):
            stage.run("q", three())
        got = attributes(only_span(exporter))
        assert got.get("error.type") == ("Vendor.Error" if genai else None)


# -- server.address / server.port ------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://user:pw@rerank.internal:8080/tei?token=abc#x", ("rerank.internal", 8080)),
        ("https://api.cohere.com", ("api.cohere.com", 443)),
        ("http://tei.local/prefix", ("tei.local", 80)),
        ("http://[::1]:3000/", ("::1", 3000)),
        ("HTTPS://Host.Example", ("host.example", 443)),
    ],
)
def test_server_is_the_urls_host_and_port_only(url: str, expected: tuple[str, int]) -> None:
    assert server_of(url) == expected


@pytest.mark.parametrize("url", [None, "", "not a url", "ftp://host/x", "http://host:port/"])
def test_no_server_without_a_usable_url(url: str | None) -> None:
    assert server_of(url) is None


# -- the async path --------------------------------------------------------------------------


def test_async_stage_writes_the_same_genai_names(wm: WireMock, spans: Spans) -> None:
    provider, exporter = spans

    async def call() -> None:
        async with AsyncRerankClient(wm.url + "/vllm/all", provider="vllm", model="alias") as c:
            stage = RerankStage(c, tracer_provider=provider, genai_conventions=True)
            await stage.arun("capital?", three())

    asyncio.run(call())
    got = attributes(only_span(exporter))
    address, port = host_port(wm.url)
    assert {k: got[k] for k in GENAI_KEYS & got.keys()} == {
        "gen_ai.operation.name": "rerank",
        "gen_ai.provider.name": "vllm",
        "gen_ai.request.model": "alias",
        "gen_ai.response.model": "BAAI/bge-reranker-v2-m3",
        "gen_ai.rerank.candidate.count": 3,
        "server.address": address,
        "server.port": port,
    }
