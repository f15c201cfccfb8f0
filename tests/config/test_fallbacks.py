"""A chain from the environment: ``RERANK_FALLBACKS``, per-tier keys, the chain's settings."""

from __future__ import annotations

import dataclasses

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from structlog.testing import capture_logs

from retrieval_stage import Candidate, RerankClient, RerankerChain, RerankStage
from retrieval_stage._log import message
from retrieval_stage.config import ChainSettings, make_chain, make_reranker, parse_fallbacks
from retrieval_stage.null import NullReranker
from retrieval_stage.validate import InvalidSetting

from ..conftest import WireMock

KEY_0 = "primary-secret-key-000"
KEY_1 = "cohere-secret-key-111"

BASE = {
    "RERANK_ENDPOINT": "http://tei-1:8080",
    "RERANK_API_KEY": KEY_0,
    "RERANK_TIMEOUT": "2.5",
    "RERANK_FALLBACKS": (
        "endpoint=https://api.cohere.com, provider=cohere, model=rerank-v3.5;\n"
        "  http://tei-2:8080 ; provider=local,model=cross-encoder/ms-marco-MiniLM-L-6-v2"
    ),
    "RERANK_API_KEY_1": KEY_1,
    "RERANK_CHAIN_TIMEOUT": "8",
    "RERANK_BREAKER_FAILURES": "4",
    "RERANK_BREAKER_COOLDOWN": "12.5",
}


def test_the_list_form_gives_every_tier_in_order() -> None:
    settings = ChainSettings.from_env(BASE, strict=True)
    primary, cohere, tei, local = settings.tiers
    assert (primary.endpoint, primary.api_key, primary.timeout) == ("http://tei-1:8080", KEY_0, 2.5)
    assert (cohere.endpoint, cohere.provider, cohere.model) == (
        "https://api.cohere.com",
        "cohere",
        "rerank-v3.5",
    )
    assert cohere.api_key == KEY_1
    assert cohere.api_key_header == "Authorization"  # the provider's convention
    assert cohere.timeout == 2.5  # inherited from RERANK_TIMEOUT
    assert (tei.endpoint, tei.provider, tei.api_key) == ("http://tei-2:8080", "tei", None)
    assert (local.provider, local.endpoint) == ("local", "")
    assert settings.chain_kwargs() == {"timeout": 8.0, "failure_threshold": 4, "cooldown": 12.5}
    shown = repr(settings)
    assert KEY_0 not in shown
    assert KEY_1 not in shown


def test_an_entry_sets_its_own_timeout_and_batch_size() -> None:
    (tier,), problems = parse_fallbacks("http://x:1,timeout=0.75,batch_size=auto", {}, timeout=9)
    assert problems == []
    assert (tier.timeout, tier.batch_size) == (0.75, "auto")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "http://ok:1; http://bad:2,provider=tie",
            "RERANK_FALLBACKS entry 2 (http://bad:2): provider",
        ),
        ("http://ok:1,modle=m", "RERANK_FALLBACKS entry 1: 'modle' is not a field"),
        ("provider=cohere", "RERANK_FALLBACKS entry 1: endpoint is missing"),
        ("https://api.cohere.com,provider=cohere", "entry 1 (https://api.cohere.com): model"),
        ("http://x:1,timeout=soon", "entry 1 (http://x:1): timeout must be a number"),
        ("http://x:1,api_key=sk-abc", "set RERANK_API_KEY_1 instead"),
        ("http://x:1,model=a,model=b", "entry 1: model is given twice"),
        ("http://u:pass-word@x:1,provider=nope", "entry 1 (http://***@x:1): provider"),
    ],
)
def test_a_bad_entry_is_named(text: str, message: str) -> None:
    tiers, problems = parse_fallbacks(text, {})
    (problem,) = problems
    assert message in str(problem)
    assert "sk-abc" not in str(problem)
    assert "pass-word" not in str(problem)
    assert len(tiers) == text.count(";")


def test_a_bad_key_names_its_variable_not_its_value() -> None:
    _, (problem,) = parse_fallbacks("http://x:1", {"RERANK_API_KEY_1": "sk-with\x07bell"})
    assert "RERANK_API_KEY_1" in str(problem)
    assert "sk-with" not in str(problem)


def test_a_bad_entry_fails_open_leaving_the_others_and_strict_raises() -> None:
    environ = {**BASE, "RERANK_FALLBACKS": "http://tei-2:8080,provider=tie; http://tei-3:8080"}
    with capture_logs() as logs:
        settings = ChainSettings.from_env(environ)
    assert [t.endpoint for t in settings.tiers] == ["http://tei-1:8080", "http://tei-3:8080"]
    (warning,) = [e for e in logs if e["event"] == "rerank.config_invalid"]
    assert warning["key"] == "RERANK_FALLBACKS"
    assert warning["reason"].startswith("entry 1 (http://tei-2:8080): provider 'tie'")
    assert KEY_0 not in repr(logs)
    assert KEY_1 not in repr(logs)
    with pytest.raises(InvalidSetting, match="RERANK_FALLBACKS entry 1"):
        ChainSettings.from_env(environ, strict=True)


def test_a_bad_chain_setting_keeps_its_default() -> None:
    environ = {**BASE, "RERANK_BREAKER_FAILURES": "0", "RERANK_CHAIN_TIMEOUT": "never"}
    with capture_logs() as logs:
        settings = ChainSettings.from_env(environ)
    assert settings.failure_threshold == 3
    assert settings.timeout == 30.0
    keys = {e["key"] for e in logs if e["event"] == "rerank.config_invalid"}
    assert keys == {"RERANK_BREAKER_FAILURES", "RERANK_CHAIN_TIMEOUT"}
    with pytest.raises(InvalidSetting, match="RERANK_CHAIN_TIMEOUT"):
        ChainSettings.from_env(environ, strict=True)


def test_the_plain_warning_says_what_is_kept() -> None:
    fields = {"key": "RERANK_FALLBACKS", "reason": "entry 1 (http://x:1): provider 'tie' ...",
              "fallback": "the other tiers (this one left out)"}  # fmt: skip
    line = message("rerank.config_invalid", fields)
    assert "using the other tiers (this one left out)" in line
    assert "no reranking" not in line
    fields["fallback"] = "NullReranker"
    assert message("rerank.config_invalid", fields).endswith("using NullReranker (no reranking)")


def test_no_primary_means_no_reranking_whatever_the_list_says() -> None:
    environ = {k: v for k, v in BASE.items() if k != "RERANK_ENDPOINT"}
    assert ChainSettings.from_env(environ).tiers == ()
    assert isinstance(make_chain(ChainSettings(tiers=())), NullReranker)


def test_make_reranker_builds_the_chain_when_fallbacks_are_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key, value in BASE.items():
        if key != "RERANK_FALLBACKS":
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("RERANK_FALLBACKS", "https://api.cohere.com,provider=cohere,model=m")
    with make_reranker(strict=True) as chain:
        assert isinstance(chain, RerankerChain)
        assert [t.provider for t in chain.tiers] == ["tei", "cohere"]
        assert all(isinstance(t, RerankClient) for t in chain.tiers)
        assert (chain.timeout, chain.failure_threshold, chain.cooldown) == (8.0, 4, 12.5)
        assert KEY_1 not in repr(chain)
    monkeypatch.delenv("RERANK_FALLBACKS")
    with make_reranker(strict=True) as client:
        assert isinstance(client, RerankClient)


def test_a_chain_from_the_environment_fails_over_against_wiremock(
    wm: WireMock, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    wm.stub_json("/env0/rerank", {"error": "down", "error_type": "Unhealthy"}, status=503)
    wm.stub_json("/env1/rerank", [{"index": 1, "score": 0.9}, {"index": 0, "score": 0.2}])
    environ = {
        "RERANK_ENDPOINT": wm.url + "/env0",
        "RERANK_MODEL": "m0",
        "RERANK_FALLBACKS": f"{wm.url}/env1,model=m1",
    }
    settings = ChainSettings.from_env(environ, strict=True)
    with make_chain(settings) as chain:
        assert isinstance(chain, RerankerChain)
        for client in chain.tiers:
            # A 503 would be retried after a backoff: not what this tests.
            client._plan = dataclasses.replace(client._plan, max_retries=0)
        cands = [Candidate("a", "first"), Candidate("b", "second")]
        outputs = RerankStage(chain, tracer_provider=spans[0]).run("q", cands)
    assert [(r.candidate.id, r.score) for r in outputs] == [("b", 0.9), ("a", 0.2)]
    (span,) = spans[1].get_finished_spans()
    attrs = dict(span.attributes or {})
    assert (attrs["retrieval_stage.tier"], attrs["reranker.model_name"]) == (1, "m1")


def test_entry_keys_are_read_whatever_their_case() -> None:
    # `Timeout=`, `PROVIDER=` and `Batch_Size=` are the same fields as their lower-case names
    # (a mutation comparing keys case-sensitively went unnoticed: issue 51, point 9).
    (tier,), problems = parse_fallbacks(
        "http://x:1, Timeout=0.75, PROVIDER=jina, Model=j1, Batch_Size=4", {}, timeout=9
    )
    assert problems == []
    assert (tier.timeout, tier.provider, tier.model, tier.batch_size) == (0.75, "jina", "j1", 4)


def test_a_key_given_twice_in_two_cases_is_refused() -> None:
    _, (problem,) = parse_fallbacks("http://x:1,timeout=1,TIMEOUT=2", {}, timeout=9)
    assert "given twice" in str(problem)
