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
