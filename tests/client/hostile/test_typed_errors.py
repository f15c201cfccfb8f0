"""Whatever a server answers, a call fails with a `RerankError` and the stage falls back
(issue 23, case 7 and the minor policy cases).

Before: a ``Retry-After`` with a 20-digit year raised OverflowError, a batch-size refusal or a
sidecar id of 5,000 digits a ValueError (Python's integer-string limit), an ``index`` nested
~980 deep a RecursionError when the error described it: each crashed the stage instead of
falling back.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable

import pytest

from retrieval_stage import RerankError, RerankProtocolError, RerankStatusError
from tests.client.hostile.echo import DOCS, call_client, observed, run_stage
from tests.client.hostile.server import Request, json_response, raw_response, serve

FLAVOURS = ["sync", "async"]
Handler = Callable[[Request, socket.socket], None]

HUGE_YEAR = "Wed, 21 Oct 99999999999999999999 07:28:00 GMT"


def _retry_after_huge_year(request: Request, conn: socket.socket) -> None:
    conn.sendall(raw_response(503, {"Retry-After": HUGE_YEAR}, b"busy"))


def _refusal_with_5000_digits(request: Request, conn: socket.socket) -> None:
    body = {"error": f"batch size {'9' * 5000} > maximum allowed batch size {'3' * 5000}"}
    conn.sendall(json_response(body, status=413))


def _sidecar_id_with_5000_digits(request: Request, conn: socket.socket) -> None:
    conn.sendall(json_response({"scores": [{"id": "1" * 5000, "score": 0.5}]}))


def _deep_index(request: Request, conn: socket.socket) -> None:
    index = "[" * 980 + "]" * 980
    body = "[" + ",".join(f'{{"index": {index}, "score": 0.5}}' for _ in DOCS) + "]"
    conn.sendall(raw_response(200, {"Content-Type": "application/json"}, body.encode()))


CASES: dict[str, tuple[Handler, dict[str, object]]] = {
    "retry-after-year": (_retry_after_huge_year, {"max_retries": 2}),
    "refusal-digits": (_refusal_with_5000_digits, {}),
    "sidecar-id-digits": (_sidecar_id_with_5000_digits, {"provider": "sidecar"}),
    "deep-index": (_deep_index, {}),
}


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_answer_is_a_typed_error(flavour: str, case: str) -> None:
    handler, kw = CASES[case]
    with serve(handler) as server:
        exc = call_client(flavour, server.url, **kw)  # type: ignore[arg-type]
    assert isinstance(exc, RerankError), repr(exc)


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_stage_falls_back_on_a_hostile_answer(flavour: str, case: str) -> None:
    handler, kw = CASES[case]
    with serve(handler) as server, observed() as seen:
        outputs = run_stage(flavour, server.url, seen, **kw)  # type: ignore[arg-type]
    assert [o.candidate.text for o in outputs] == DOCS
    assert any(e["event"] == "rerank.fallback" for e in seen["logs"])


@pytest.mark.parametrize("value", ["inf", "1e400", "Infinity"])
def test_an_infinite_retry_after_means_not_now(value: str) -> None:
    """``Retry-After: inf`` asks for more time than any deadline has: not retried."""

    def handler(request: Request, conn: socket.socket) -> None:
        conn.sendall(raw_response(503, {"Retry-After": value}, b"busy"))

    with serve(handler) as server:
        exc = call_client("sync", server.url, max_retries=2)
        assert isinstance(exc, RerankStatusError), exc
        assert len(server.requests) == 1


def test_more_results_than_sent_are_refused_before_any_per_result_work() -> None:
    """The count is checked first: the entry past the end is garbage the per-result checks
    would have complained about, but the error names the count."""

    def handler(request: Request, conn: socket.socket) -> None:
        results = [{"index": i, "score": 0.5} for i in range(len(DOCS))] + ["garbage"]
        conn.sendall(json_response(results))

    with serve(handler) as server:
        exc = call_client("sync", server.url)
    assert isinstance(exc, RerankProtocolError), exc
    assert f"expected {len(DOCS)} results" in str(exc), str(exc)


@pytest.mark.parametrize(
    ("header", "tokens"),
    [("-5", None), ("99999999999999999999999999", None), ("12", 12)],
)
def test_usage_counts_that_cannot_be_true_are_not_recorded(header: str, tokens: int | None) -> None:
    from retrieval_stage import RerankClient

    def handler(request: Request, conn: socket.socket) -> None:
        results = [{"index": i, "score": 0.5} for i in range(len(request.json()["texts"]))]
        body = json.dumps(results).encode()
        head = {"Content-Type": "application/json", "x-compute-tokens": header}
        conn.sendall(raw_response(200, head, body))

    with serve(handler) as server, RerankClient(server.url) as client:
        response = client.rerank_response("q", DOCS)
    assert response.usage.total_tokens == tokens


@pytest.mark.parametrize("provider", ["vllm", "cohere"])
def test_negative_or_huge_body_usage_is_not_recorded(provider: str) -> None:
    from retrieval_stage import RerankClient

    def handler(request: Request, conn: socket.socket) -> None:
        n = len(request.json()["documents"])
        results = [{"index": i, "relevance_score": 0.5} for i in range(n)]
        conn.sendall(
            json_response(
                {
                    "results": results,
                    "usage": {"total_tokens": 10**30},
                    "meta": {"billed_units": {"search_units": -3}},
                }
            )
        )

    kw: dict[str, object] = {"model": "m"} if provider == "cohere" else {}
    with serve(handler) as server, RerankClient(server.url, provider=provider, **kw) as c:  # type: ignore[arg-type]
        usage = c.rerank_response("q", DOCS).usage
    assert usage.total_tokens is None
    assert usage.search_units is None


@pytest.mark.parametrize(
    "header", ["Host", "content-length", "Transfer-Encoding", "Connection", "Content-Type"]
)
def test_an_api_key_header_that_would_break_the_request_is_refused(header: str) -> None:
    from retrieval_stage import RerankClient
    from retrieval_stage.validate import InvalidSetting

    with pytest.raises(InvalidSetting) as info:
        RerankClient("http://127.0.0.1:1", api_key="k", api_key_header=header)
    assert info.value.field == "api_key_header"
