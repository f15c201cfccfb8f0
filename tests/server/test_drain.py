"""The end of a drain on a real ``retrieval-stage serve --reranker lexical --drain-timeout 1``:
every request is answered, either with its scores or with TEI's 503, never a plain-text 500."""

from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import pytest

from .served import start_server

HEAVY = " ".join(["alpha"] * 60_000 + ["filler"] * 10 + ["omega"] * 60_000)
"""0.1-1 s of the lexical reranker's work (quiet machine to busy one), each alone in its model
batch (past --max-batch-tokens): `REQUESTS` of them queued outlast a one-second drain."""
REQUESTS = 24
"""Enough that the queue outlasts the drain on a quiet machine too (six did not: the linear
lexical reranker answered them all within the second)."""


def test_requests_cut_by_the_drain_get_teis_503(tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.mktemp("drained-lexical")
    with start_server(tmp, "--reranker", "lexical", "--drain-timeout", "1") as served:
        body = json.dumps({"query": "alpha omega", "texts": [HEAVY]}).encode()
        headers = {"content-type": "application/json"}

        def post() -> httpx.Response:
            return httpx.post(served.url + "/rerank", content=body, headers=headers, timeout=60)

        with concurrent.futures.ThreadPoolExecutor(REQUESTS) as pool:
            replies = [pool.submit(post) for _ in range(REQUESTS)]
            deadline = time.monotonic() + 60
            # All in the server (one through the model, the rest queued or answered) before
            # SIGTERM: a connection it never accepted could not be answered at all.
            while (
                httpx.get(served.url + "/info", timeout=10).json()["queue_depth"]
                + sum(r.done() for r in replies)
                < REQUESTS - 1
            ):
                assert time.monotonic() < deadline, "the requests never queued"
                time.sleep(0.02)
            assert served.stop() == 0
            answered = [r.result() for r in replies]
    statuses = sorted(r.status_code for r in answered)
    assert set(statuses) <= {200, 503}, [(r.status_code, r.text[:80]) for r in answered]
    refused = [r for r in answered if r.status_code == 503]
    assert refused, statuses
    for reply in refused:
        assert reply.headers["content-type"] == "application/json"
        assert reply.json() == {"error": "the server is stopping", "error_type": "Unhealthy"}
    logged = [line for line in served.log_lines() if line.get("event") == "server.drain_cut"]
    assert logged
    assert logged[0]["refused"] >= len(refused)
