"""Messages the docs quote outside console examples are the ones the code produces."""

from __future__ import annotations

import pytest

from retrieval_stage import RerankClient

from .examples import ROOT


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_providers_md_quotes_the_missing_model_refusal() -> None:
    with pytest.raises(ValueError, match="model= is required") as caught:
        RerankClient("http://localhost:8080", provider="cohere")
    said = f"{type(caught.value).__module__}.{type(caught.value).__name__}: {caught.value}"
    assert _flat(said) in _flat((ROOT / "docs/providers.md").read_text(encoding="utf-8"))


def test_server_md_quotes_the_hosted_apis_refusals() -> None:
    from retrieval_stage.server import cohere
    from retrieval_stage.server.wire import batch_too_large, model_not_served

    text = _flat((ROOT / "docs/server.md").read_text(encoding="utf-8"))
    error = model_not_served("rerank-v3.5", "sentence-transformers/all-MiniLM-L6-v2")
    assert _flat(cohere.error_body(error).decode()) in text
    assert batch_too_large(200, 128).message in text
