"""Repeated --endpoint: a `RerankerChain` from the command line (and from RERANK_FALLBACKS)."""

from __future__ import annotations

from ..conftest import WireMock
from .test_commands import CANDIDATES, flat, invoke, jsonl

JINA_OUT_OF_ORDER = {
    "model": "jina-m",
    "results": [
        {"index": 1, "relevance_score": 0.8},
        {"index": 2, "relevance_score": 0.6},
        {"index": 0, "relevance_score": 0.1},
    ],
}
KEY_1 = "fallback-secret-key-1"


def primary_refusing(wm: WireMock) -> str:
    # 401 is not retried: the chain hands over at once.
    wm.stub_json("/p/rerank", {"error": "bad key", "error_type": "Validation"}, status=401)
    return wm.url + "/p"


def test_a_second_endpoint_answers_when_the_first_fails(wm: WireMock) -> None:
    wm.stub_json("/s/v1/rerank", JINA_OUT_OF_ORDER)
    result = invoke(
        "rerank", "-q", "what is rust",
        "--endpoint", primary_refusing(wm), "--endpoint", wm.url + "/s",
        "--provider", "tei", "--provider", "jina", "--model", "m0", "--model", "jina-m",
        stdin=CANDIDATES, RERANK_API_KEY_1=KEY_1,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert [(r["id"], r["score"]) for r in jsonl(result.stdout)] == [
        ("b", 0.8),
        ("c", 0.6),
        ("a", 0.1),
    ]
    said = flat(result.stderr)
    assert f"a chain of tei at {wm.url}/p model m0, then jina at {wm.url}/s model jina-m" in said
    (sent,) = wm.requests("/s/v1/rerank")
    assert sent["headers"]["Authorization"] == f"Bearer {KEY_1}"  # the n-th key to the n-th
    (first,) = wm.requests("/p/rerank")
    assert KEY_1 not in repr(first["headers"])
    assert KEY_1 not in result.stdout + result.stderr


def test_a_count_that_matches_neither_rule_is_refused(wm: WireMock) -> None:
    result = invoke(
        "rerank", "-q", "q", "--endpoint", wm.url + "/a", "--endpoint", wm.url + "/b",
        "--model", "x", "--model", "y", "--model", "z", stdin=CANDIDATES,
    )  # fmt: skip
    assert result.exit_code == 2
    assert "--model is given 3 times for 2 --endpoint" in flat(result.stderr)


def test_a_bad_second_endpoint_is_named(wm: WireMock) -> None:
    result = invoke(
        "rerank", "-q", "q", "--endpoint", wm.url + "/a", "--endpoint", "tei-2:8080",
        stdin=CANDIDATES,
    )  # fmt: skip
    assert result.exit_code == 2
    assert "--endpoint (--endpoint 2 of 2" in flat(result.stderr)


def test_rerank_fallbacks_extends_a_single_endpoint(wm: WireMock) -> None:
    wm.stub_json("/s/v1/rerank", JINA_OUT_OF_ORDER)
    result = invoke(
        "rerank", "-q", "q", "--endpoint", primary_refusing(wm), stdin=CANDIDATES,
        RERANK_FALLBACKS=f"{wm.url}/s,provider=jina,model=jina-m",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert [r["id"] for r in jsonl(result.stdout)] == ["b", "c", "a"]
    bad = invoke(
        "rerank", "-q", "q", "--endpoint", wm.url + "/p", stdin=CANDIDATES,
        RERANK_FALLBACKS=f"{wm.url}/s,provider=tie",
    )  # fmt: skip
    assert bad.exit_code == 2
    assert "RERANK_FALLBACKS entry 1" in flat(bad.stderr)


def test_every_tier_failing_says_so(wm: WireMock) -> None:
    wm.stub_json("/s/rerank", {"error": "down", "error_type": "Unhealthy"}, status=401)
    result = invoke(
        "rerank", "-q", "q", "--endpoint", primary_refusing(wm), "--endpoint", wm.url + "/s",
        stdin=CANDIDATES,
    )  # fmt: skip
    assert result.exit_code == 1
    assert "every tier of the reranker chain failed" in flat(result.stderr)


def test_the_tier_that_answered_and_why_the_first_failed_are_said(wm: WireMock) -> None:
    wm.stub_json("/s/v1/rerank", JINA_OUT_OF_ORDER)
    result = invoke(
        "rerank", "-q", "what is rust",
        "--endpoint", primary_refusing(wm), "--endpoint", wm.url + "/s",
        "--provider", "tei", "--provider", "jina", "--model", "m0", "--model", "jina-m",
        stdin=CANDIDATES, RERANK_API_KEY_1=KEY_1,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    said = flat(result.stderr)
    failed, answered = said.split("failover: ", 1)[1].split("; ")[:2]
    assert failed.startswith(f"tier 0 (tei at {wm.url}/p model m0) failed: RerankStatusError: ")
    assert "bad key" in failed  # the server's own words, as the span event has them
    assert answered.startswith(f"tier 1 (jina at {wm.url}/s model jina-m) answered")
    assert KEY_1 not in result.stderr


def test_a_chain_whose_primary_answers_says_so_without_a_failover_line(wm: WireMock) -> None:
    wm.stub_json("/p/rerank", [{"index": 0, "score": 0.5}, {"index": 1, "score": 0.4},
                               {"index": 2, "score": 0.3}])  # fmt: skip
    result = invoke(
        "rerank", "-q", "q", "--endpoint", wm.url + "/p", "--endpoint", wm.url + "/s",
        stdin=CANDIDATES,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    said = flat(result.stderr)
    assert f"tier 0 (tei at {wm.url}/p) answered" in said
    assert "failover:" not in said


def test_demo_over_a_chain_says_which_tier_answered_under_the_reranker_line(wm: WireMock) -> None:
    wm.stub_json("/s/v1/rerank", {"model": "jina-m", "results": [
        {"index": i, "relevance_score": 1.0 - i / 100} for i in range(3)
    ]})  # fmt: skip
    result = invoke(
        "demo", "--top-k", "3", "--recall-k", "3",
        "--endpoint", primary_refusing(wm), "--endpoint", wm.url + "/s",
        "--provider", "tei", "--provider", "jina", "--model", "m0", "--model", "jina-m",
        RERANK_API_KEY_1=KEY_1,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    said = flat(result.stdout)
    assert f"failover: tier 0 (tei at {wm.url}/p model m0) failed: RerankStatusError: " in said
    assert f"; tier 1 (jina at {wm.url}/s model jina-m) answered" in said
    assert said.index("reranker: a chain of") < said.index("failover:") < said.index("recall rank")
