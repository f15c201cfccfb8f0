"""The public names users and acceptance checks rely on stay exported."""

from __future__ import annotations

import dataclasses
import inspect

import retrieval_stage
from retrieval_stage import AsyncRerankClient, Candidate, RerankClient, RerankStage


def test_all_lists_exactly_the_public_names() -> None:
    public = {
        "AsyncNullReranker", "AsyncRerankClient", "AsyncReranker", "Candidate",
        "NullReranker", "RerankClient", "RerankClientClosedError", "RerankError",
        "RerankProtocolError", "RerankResponse", "RerankStage", "RerankStatusError",
        "RerankTransportError", "Reranked", "Reranker", "Usage", "PROVIDERS", "__version__",
        "RerankerChain", "AsyncRerankerChain", "RerankChainError",
    }  # fmt: skip
    assert set(retrieval_stage.__all__) == public
    assert len(retrieval_stage.__all__) == len(public), "a name listed twice"
    for name in retrieval_stage.__all__:
        assert hasattr(retrieval_stage, name), name


def test_error_tree() -> None:
    base = retrieval_stage.RerankError
    for name in (
        "RerankTransportError",
        "RerankStatusError",
        "RerankProtocolError",
        "RerankClientClosedError",
        "RerankChainError",
    ):
        assert issubclass(getattr(retrieval_stage, name), base)


def test_candidate_is_a_frozen_dataclass_with_the_issue_signature() -> None:
    fields = {f.name: f for f in dataclasses.fields(Candidate)}
    assert list(fields) == ["id", "text", "score", "metadata"]
    candidate = Candidate("a", "text")
    assert candidate.score is None
    assert dict(candidate.metadata) == {}
    try:
        candidate.text = "changed"  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        pass
    else:  # pragma: no cover
        raise AssertionError("Candidate must be frozen")


def test_client_signatures_match_the_contract() -> None:
    expected = [
        ("provider", "tei"), ("model", None), ("api_key", None), ("api_key_header", "apikey"),
        ("timeout", 30.0), ("max_retries", 2), ("batch_size", None), ("http_client", None),
    ]  # fmt: skip
    for cls in (RerankClient, AsyncRerankClient):
        params = inspect.signature(cls.__init__).parameters
        for name, default in expected:
            assert params[name].default == default, (cls.__name__, name)
            assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
        # The retry jitter and the clock are test hooks, not settings (issue 27).
        assert not {"random", "clock"} & set(params), cls.__name__
        rerank = inspect.signature(cls.rerank).parameters
        assert list(rerank)[:3] == ["self", "query", "items"]
        assert rerank["text"].default is None
        assert rerank["top_k"].default is None


def test_stage_signature_matches_the_contract() -> None:
    params = inspect.signature(RerankStage.__init__).parameters
    assert params["top_k"].default is None
    assert params["model_name"].default is None
    assert params["on_error"].default == "fallback"
    assert params["tracer_provider"].default is None
