"""The rerank clients against a real WireMock over HTTP (fixtures in tests/wiremock)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from retrieval_stage import (
    AsyncRerankClient,
    RerankClient,
    RerankProtocolError,
    RerankStatusError,
    RerankTransportError,
)
from tests.hooks import hooked

from ..conftest import WireMock

SECRET = "sk-test-5f8a1c9e-do-not-log"

SCHEDULING_MARGIN = 3.0
"""Seconds allowed past a deadline for scheduling noise on a loaded two-core machine."""


@dataclass(frozen=True)
class Doc:
    """A caller's own item type: the client must hand these back, not copies."""

    name: str
    text: str


def test_bare_array_is_parsed(wm: WireMock) -> None:
    with RerankClient(wm.url + "/tei") as client:
        result = client.rerank("what is rust", ["rust is a language", "bananas"])
    assert result == [("rust is a language", 0.98176736), ("bananas", 0.00008833366)]


def test_index_mapping_with_out_of_order_mock_returns_inputs_1_and_0(wm: WireMock) -> None:
    a, b = Doc("a", "first text"), Doc("b", "second text")
    with RerankClient(wm.url + "/tei/out-of-order") as client:
        result = client.rerank("q", [a, b])
    assert [item for item, _ in result] == [b, a]
    assert result[0][0] is b
    assert result[1][0] is a
    assert [score for _, score in result] == [0.97, 0.02]


def test_request_carries_query_and_texts_in_input_order(wm: WireMock) -> None:
    with RerankClient(wm.url + "/tei/three") as client:
        client.rerank("q", ["x", "y", "z"])
    assert wm.bodies("/tei/three/rerank") == [{"query": "q", "texts": ["x", "y", "z"]}]


def test_text_extractor_and_top_k(wm: WireMock) -> None:
    items = [{"t": "x"}, {"t": "y"}, {"t": "z"}]
    with RerankClient(wm.url + "/tei/three") as client:
        result = client.rerank("q", items, text=lambda d: d["t"], top_k=2)
    assert result == [(items[2], 0.9), (items[0], 0.5)]
    assert result[0][0] is items[2]


def test_empty_input_makes_zero_requests(wm: WireMock) -> None:
    with RerankClient(wm.url + "/tei") as client:
        assert client.rerank("q", []) == []
    assert wm.requests() == []


def test_apikey_header_is_sent(wm: WireMock) -> None:
    with RerankClient(wm.url + "/tei", api_key=SECRET) as client:
        client.rerank("what is rust", ["rust is a language", "bananas"])
    (request,) = wm.requests("/tei/rerank")
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert headers["apikey"] == SECRET
    assert "authorization" not in headers


def test_authorization_header_sends_bearer(wm: WireMock) -> None:
    with RerankClient(wm.url + "/tei", api_key=SECRET, api_key_header="Authorization") as client:
        client.rerank("what is rust", ["rust is a language", "bananas"])
    (request,) = wm.requests("/tei/rerank")
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert headers["authorization"] == f"Bearer {SECRET}"
    assert "apikey" not in headers


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("envelope", "bare JSON array"),
        ("duplicate", "duplicate index 1"),
        ("out-of-range", "index 2 out of range"),
        ("missing", "expected 2 results"),
        ("nan", "not finite"),
        ("string-score", "must be a number"),
        ("float-index", "must be an integer"),
        ("not-objects", "must be a JSON object"),
        ("html", "not valid JSON (text/html)"),
        ("truncated", "not valid JSON"),
    ],
)
def test_malformed_body_raises_protocol_error(wm: WireMock, case: str, says: str) -> None:
    with (
        RerankClient(wm.url + f"/tei/bad/{case}") as client,
        pytest.raises(RerankProtocolError, match=says.replace("(", r"\(").replace(")", r"\)")),
    ):
        client.rerank("q", ["A", "B"])
    assert len(wm.requests(f"/tei/bad/{case}/rerank")) == 1, "a protocol error is not retried"


def test_503_then_200_is_retried(wm: WireMock) -> None:
    with hooked(RerankClient(wm.url + "/tei/retry-503"), random=lambda: 1.0) as client:
        response = client.rerank_response("q", ["A", "B"])
    assert [item for item, _ in response.results] == ["B", "A"]
    assert len(wm.requests("/tei/retry-503/rerank")) == 2
    assert (response.requests, response.retries) == (2, 1)


def test_401_is_not_retried(wm: WireMock) -> None:
    with (
        RerankClient(wm.url + "/tei/unauthorized", api_key=SECRET) as client,
        pytest.raises(RerankStatusError) as caught,
    ):
        client.rerank("q", ["A", "B"])
    assert caught.value.status_code == 401
    assert "invalid api key (Unauthorized)" in str(caught.value)
    assert SECRET not in str(caught.value)
    assert len(wm.requests("/tei/unauthorized/rerank")) == 1


def test_split_batches_map_correctly(wm: WireMock) -> None:
    texts = ["t0", "t1", "t2", "t3", "t4"]
    with RerankClient(wm.url + "/tei/split", batch_size=2) as client:
        response = client.rerank_response("split", texts)
    assert response.results == [("t2", 0.95), ("t1", 0.8), ("t4", 0.5), ("t3", 0.3), ("t0", 0.1)]
    assert response.batches == 3
    assert len(wm.requests("/tei/split/rerank")) == 3


def test_batch_size_auto_reads_info(wm: WireMock) -> None:
    texts = ["t0", "t1", "t2", "t3", "t4"]
    with RerankClient(wm.url + "/tei/split", batch_size="auto") as client:
        result = client.rerank("split", texts)
        assert client.batch_size == 2
        assert client.model_name == "BAAI/bge-reranker-base"
    assert [t for t, _ in result] == ["t2", "t1", "t4", "t3", "t0"]
    assert len(wm.requests("/tei/split/info")) == 1


async def test_async_batch_size_auto_reads_info_once(wm: WireMock) -> None:
    texts = ["t0", "t1", "t2", "t3", "t4"]
    async with AsyncRerankClient(wm.url + "/tei/split", batch_size="auto") as client:
        first = await client.rerank("split", texts)
        assert client.batch_size == 2
        assert client.model_name == "BAAI/bge-reranker-base"
        second = await client.rerank("split", texts)
    assert [t for t, _ in first] == ["t2", "t1", "t4", "t3", "t0"]
    assert second == first
    assert len(wm.requests("/tei/split/info")) == 1, "the cap is asked for once per client"
    assert sorted(len(b["texts"]) for b in wm.bodies("/tei/split/rerank")) == [1, 1, 2, 2, 2, 2]


def test_delay_past_deadline_raises_transport_error_in_time(wm: WireMock) -> None:
    wm.stub_json("/tei/slow/rerank", [{"index": 0, "score": 1.0}], fixedDelayMilliseconds=10_000)
    started = time.monotonic()
    with (
        RerankClient(wm.url + "/tei/slow", timeout=0.5) as client,
        pytest.raises(RerankTransportError),
    ):
        client.rerank("q", ["A"])
    # The server answers after 10 s: past the deadline plus the margin, so waiting it out fails.
    assert time.monotonic() - started < 0.5 + SCHEDULING_MARGIN


def test_server_error_message_reaches_the_exception(wm: WireMock) -> None:
    wm.stub_json(
        "/tei/invalid/rerank",
        {"error": "`texts` cannot be empty", "error_type": "Validation"},
        status=422,
    )
    with (
        RerankClient(wm.url + "/tei/invalid") as client,
        pytest.raises(RerankStatusError) as caught,
    ):
        client.rerank("q", ["A"])
    assert caught.value.status_code == 422
    assert caught.value.server_message == "`texts` cannot be empty (Validation)"


async def test_async_index_mapping_with_out_of_order_mock(wm: WireMock) -> None:
    a, b = Doc("a", "first text"), Doc("b", "second text")
    async with AsyncRerankClient(wm.url + "/tei/out-of-order") as client:
        result = await client.rerank("q", [a, b])
    assert result[0][0] is b
    assert result[1][0] is a


async def test_async_split_batches_map_correctly(wm: WireMock) -> None:
    texts = ["t0", "t1", "t2", "t3", "t4"]
    async with AsyncRerankClient(wm.url + "/tei/split", batch_size=2) as client:
        result = await client.rerank("split", texts, top_k=3)
    assert result == [("t2", 0.95), ("t1", 0.8), ("t4", 0.5)]
    assert len(wm.requests("/tei/split/rerank")) == 3


async def test_async_503_then_200_is_retried(wm: WireMock) -> None:
    async with hooked(AsyncRerankClient(wm.url + "/tei/retry-503"), random=lambda: 1.0) as client:
        result = await client.rerank("q", ["A", "B"])
    assert [item for item, _ in result] == ["B", "A"]
    assert len(wm.requests("/tei/retry-503/rerank")) == 2


async def test_async_empty_input_makes_zero_requests(wm: WireMock) -> None:
    async with AsyncRerankClient(wm.url + "/tei") as client:
        assert await client.rerank("q", []) == []
    assert wm.requests() == []


def test_repr_hides_the_api_key() -> None:
    client = RerankClient("http://127.0.0.1:9", api_key=SECRET)
    try:
        assert SECRET not in repr(client)
        assert "api_key=<set>" in repr(client)
    finally:
        client.close()


def test_the_sync_client_goes_through_a_configured_proxy(
    wm: WireMock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP_PROXY is honoured as the async client (httpx) honours it: here the "proxy" is the
    session's WireMock, which serves a request for another host by its path."""
    wm.stub_json("/proxied/rerank", [{"index": 1, "score": 0.9}, {"index": 0, "score": 0.1}])
    monkeypatch.setenv("HTTP_PROXY", wm.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with RerankClient("http://rerank.invalid/proxied") as client:
        assert client.rerank("q", ["a", "b"]) == [("b", 0.9), ("a", 0.1)]
    (request,) = wm.requests("/proxied/rerank")
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert headers["host"] == "rerank.invalid"
