"""Usage summed over the sub-batches of one call, on the response and on the RERANKER span.

A call split into three batches gets three answers, each reporting a different amount spent:
TEI in its `x-compute-tokens` response header, Jina in its body's `usage.total_tokens`. The
call's usage is their sum; any one batch's figure ("last batch wins") is a different number.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Literal

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from retrieval_stage import (
    AsyncRerankClient,
    Candidate,
    RerankClient,
    RerankResponse,
    RerankStage,
    Usage,
)
from retrieval_stage.spans import ATTR_USAGE_TOTAL_TOKENS

from ..conftest import WireMock

Spans = tuple[TracerProvider, InMemorySpanExporter]
Flavour = Literal["sync", "async"]

TEXTS = ["t0", "t1", "t2", "t3", "t4"]
"""Five texts in batches of two: [t0, t1], [t2, t3], [t4]."""

TOKENS = {"t0": 7, "t2": 11, "t4": 13}
"""Tokens each batch reports, keyed by its first text: all different, so no single batch's
figure equals the sum."""

TOTAL = sum(TOKENS.values())

SCORES = {"t0": 0.1, "t1": 0.2, "t2": 0.3, "t3": 0.4, "t4": 0.5}
"""What the server scores each text: mapping by the batch's `index` must land each on its text."""


@dataclass(frozen=True)
class Api:
    """Where a provider answers and how it reports usage."""

    provider: str
    path: str
    texts_field: str
    model: str | None

    def answer(self, batch: list[str], tokens: int) -> dict[str, Any]:
        """A WireMock response ranking `batch` in reverse, reporting `tokens`."""
        ranked = [(i, SCORES[batch[i]]) for i in reversed(range(len(batch)))]
        if self.provider == "tei":
            body: Any = [{"index": i, "score": s} for i, s in ranked]
            headers = {"x-compute-tokens": str(tokens)}
        else:
            results = [{"index": i, "relevance_score": s} for i, s in ranked]
            body = {"results": results, "usage": {"total_tokens": tokens}}
            headers = {}
        return {
            "status": 200,
            "headers": {"Content-Type": "application/json", **headers},
            "body": json.dumps(body),
        }


APIS = [
    Api("tei", "/usage-tei/rerank", "texts", None),
    Api("jina", "/usage-jina/v1/rerank", "documents", "jina-reranker-v2-base-multilingual"),
]


def stub_batches(wm: WireMock, api: Api) -> None:
    for first, tokens in TOKENS.items():
        start = TEXTS.index(first)
        batch = TEXTS[start : start + 2]
        wm.stub(
            {
                "request": {
                    "method": "POST",
                    "urlPath": api.path,
                    "bodyPatterns": [
                        {"matchesJsonPath": f"$.{api.texts_field}[?(@ == '{first}')]"}
                    ],
                },
                "response": api.answer(batch, tokens),
            }
        )


def base_url(wm: WireMock, api: Api) -> str:
    return wm.url + api.path.removesuffix("/rerank").removesuffix("/v1")


def call_twice(
    flavour: Flavour, wm: WireMock, api: Api, provider: TracerProvider
) -> RerankResponse[str]:
    """One `rerank_response` (returned) and one stage run (its span is exported)."""
    kw: dict[str, Any] = {"provider": api.provider, "model": api.model, "batch_size": 2}
    cands = [Candidate(t, t, 0.5) for t in TEXTS]
    if flavour == "sync":
        with RerankClient(base_url(wm, api), **kw) as client:
            response = client.rerank_response("q", TEXTS)
            RerankStage(client, tracer_provider=provider).run("q", cands)
        return response

    async def go() -> RerankResponse[str]:
        async with AsyncRerankClient(base_url(wm, api), **kw) as client:
            response = await client.rerank_response("q", TEXTS)
            await RerankStage(client, tracer_provider=provider).arun("q", cands)
        return response

    return asyncio.run(go())


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("api", APIS, ids=lambda a: a.provider)
def test_usage_is_summed_over_split_batches(
    wm: WireMock, spans: Spans, api: Api, flavour: Flavour
) -> None:
    stub_batches(wm, api)
    provider, exporter = spans
    response = call_twice(flavour, wm, api, provider)
    assert response.batches == 3
    assert sorted(len(b[api.texts_field]) for b in wm.bodies(api.path)) == [1, 1, 2, 2, 2, 2]
    assert dict(response.results) == SCORES
    assert response.usage == Usage(total_tokens=TOTAL)
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes[ATTR_USAGE_TOTAL_TOKENS] == TOTAL
