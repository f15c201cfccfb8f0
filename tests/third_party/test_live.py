"""Against a real TEI (or a gateway in front of one): runs only when RERANK_LIVE_URL is set.

    RERANK_LIVE_URL=http://localhost:8080 pytest tests/third_party/test_live.py
(`docker compose -f docker/compose.yaml up tei` serves BAAI/bge-reranker-base there.)
Optional: RERANK_LIVE_PROVIDER (default tei), RERANK_LIVE_MODEL, RERANK_LIVE_API_KEY,
RERANK_LIVE_API_KEY_HEADER, RERANK_LIVE_MIN_RATIO (default 10: seed 002's margin, measured with
the cross-encoder bge-reranker-base; tests/server runs this against `retrieval-stage serve`
with the packaged bi-encoder MiniLM, whose margin is smaller).
"""

from __future__ import annotations

import os

import pytest

from retrieval_stage import RerankClient

LIVE_URL = os.environ.get("RERANK_LIVE_URL", "")
DEFAULT_MIN_RATIO = 10.0

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(not LIVE_URL, reason="RERANK_LIVE_URL is not set (live test)"),
]


def test_live_reranker_discriminates_rust_from_bananas() -> None:
    with RerankClient(
        LIVE_URL,
        provider=os.environ.get("RERANK_LIVE_PROVIDER", "tei"),
        model=os.environ.get("RERANK_LIVE_MODEL") or None,
        api_key=os.environ.get("RERANK_LIVE_API_KEY") or None,
        api_key_header=os.environ.get("RERANK_LIVE_API_KEY_HEADER", "apikey"),
    ) as client:
        result = dict(client.rerank("what is rust", ["rust is a language", "bananas"]))
    ratio = float(os.environ.get("RERANK_LIVE_MIN_RATIO", DEFAULT_MIN_RATIO))
    assert result["bananas"] > 0 or result["rust is a language"] > 0, result
    assert result["rust is a language"] >= ratio * result["bananas"]
    assert result["rust is a language"] > result["bananas"], "the more relevant text first"
