"""Bounded work per request on a real ``retrieval-stage serve --reranker lexical``: a request
that the first lexical reranker took hours over is answered in seconds, and the next client's
is not held behind it; a request over ``--max-request-tokens`` is refused with TEI's 422
before it reaches the model thread."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator

import httpx
import pytest

from .served import Served, start_server

MAX_REQUEST_TOKENS = 125_000
GENEROUS_BOUND_S = 90.0
"""Far above the second or two the hostile request takes now on a busy shared machine, and
far below the hours the quadratic proximity test took over it."""


@pytest.fixture(scope="module")
def bounded_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("bounded-lexical")
    args = ("--reranker", "lexical", "--max-request-tokens", str(MAX_REQUEST_TOKENS))
    with start_server(tmp, *args) as served:
        yield served


def _post(url: str, body: object) -> httpx.Response:
    return httpx.post(url + "/rerank", json=body, timeout=GENEROUS_BOUND_S)


def test_a_hostile_lexical_request_does_not_hold_the_model_for_the_next_client(
    bounded_server: Served,
) -> None:
    # 120,012 words: each query term 60,000 times, never near the other (3.6e9 comparisons).
    hostile = " ".join(["alpha"] * 60_000 + ["filler"] * 10 + ["omega"] * 60_000)
    small = {"query": "alpha omega", "texts": ["alpha omega", "nothing here"]}
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        heavy = pool.submit(_post, bounded_server.url, {"query": "alpha omega", "texts": [hostile]})
        time.sleep(0.5)  # the heavy request reaches the model thread first
        light = pool.submit(_post, bounded_server.url, small)
        heavy_reply, light_reply = heavy.result(), light.result()
    elapsed = time.monotonic() - started
    assert heavy_reply.status_code == 200, heavy_reply.text
    assert [r["index"] for r in heavy_reply.json()] == [0]
    assert light_reply.status_code == 200, light_reply.text
    assert [r["index"] for r in light_reply.json()] == [0, 1]
    assert elapsed < GENEROUS_BOUND_S, elapsed


def test_a_request_over_the_token_budget_is_refused_in_teis_shape(bounded_server: Served) -> None:
    # "a-b" is two words to the reranker, one to str.split: the budget counts what it reads.
    over = " ".join(["alpha-omega"] * (MAX_REQUEST_TOKENS // 2)) + " extra"
    reply = _post(bounded_server.url, {"query": "alpha", "texts": [over]})
    assert reply.status_code == 422, reply.text
    assert reply.json() == {
        "error": "Input validation error: the request must have at most "
        f"{MAX_REQUEST_TOKENS} tokens (its texts and query, as the model reads them). "
        f"Given: {MAX_REQUEST_TOKENS + 2}",
        "error_type": "Validation",
    }
    exactly = " ".join(["alpha-omega"] * (MAX_REQUEST_TOKENS // 2 - 1)) + " last"
    assert _post(bounded_server.url, {"query": "alpha", "texts": [exactly]}).status_code == 200
