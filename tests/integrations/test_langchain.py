"""`retrieval_stage.integrations.langchain` against the real LangChain and its instrumentor.

Each test pins one guarantee of issue 24, on the sync and the async path, through
langchain-classic's `ContextualCompressionRetriever` as a user builds it: one RERANKER span
(ours) inside LangChain's trace (its tracer never makes its spans current, so this is the
guarantee most easily lost), the recall score from a metadata key on the span, the caller's
documents untouched, document ids as candidate ids, an honest fallback, top_k.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip(
    "langchain_core",
    reason="LangChain is not installed here: tests/integrations/setup.sh makes .venv-frameworks",
)
pytest.importorskip(
    "langchain_classic",
    reason="langchain-classic is not installed here (tests/integrations/setup.sh)",
)
pytest.importorskip(
    "openinference.instrumentation.langchain",
    reason="its OpenInference instrumentor is not installed (tests/integrations/setup.sh)",
)

from langchain_classic.retrievers import ContextualCompressionRetriever
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from openinference.instrumentation.langchain import LangChainInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import StatusCode

from retrieval_stage import RerankClient, RerankTransportError
from retrieval_stage.integrations.langchain import RetrievalStageRerank

from ..fakes import ByLength, Failing
from ._trace import assert_inside_framework, documents, the_reranker_span

QUERY = "how do I parse json"
MODES = ["sync", "async"]


@pytest.fixture(scope="module", autouse=True)
def _instrumented(tracer_provider: TracerProvider) -> Iterator[None]:
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=tracer_provider)
    yield
    instrumentor.uninstrument()


class Fixed(BaseRetriever):
    """A retriever that answers the same documents every time (the caller's own objects)."""

    docs: list[Document]

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return self.docs


def recalled(score_key: str = "score") -> list[Document]:
    """Recall order d-short, d-medium, d-long; `ByLength` reverses it."""
    return [
        Document(id="d-short", page_content="json", metadata={score_key: 0.9, "src": "a"}),
        Document(id="d-medium", page_content="parse json now", metadata={score_key: 0.5}),
        Document(id="d-long", page_content="how to parse a json file", metadata={score_key: 0.1}),
    ]


def retrieve(mode: str, compressor: RetrievalStageRerank, docs: list[Document]) -> list[Any]:
    retriever = ContextualCompressionRetriever(
        base_compressor=compressor, base_retriever=Fixed(docs=docs)
    )
    if mode == "sync":
        return list(retriever.invoke(QUERY))
    return list(asyncio.run(retriever.ainvoke(QUERY)))


@pytest.mark.parametrize("mode", MODES)
def test_one_reranker_span_ours_inside_the_retriever_trace(mode, traced):
    retrieve(mode, RetrievalStageRerank(ByLength(), tracer_provider=traced.provider), recalled())

    spans = traced.spans()
    ours = the_reranker_span(spans)
    assert_inside_framework(ours, spans, "ContextualCompressionRetriever")


@pytest.mark.parametrize("mode", MODES)
def test_recall_scores_from_the_metadata_key_are_the_span_input_scores(mode, traced):
    compressor = RetrievalStageRerank(ByLength(), score_key="bm25", tracer_provider=traced.provider)
    retrieve(mode, compressor, recalled(score_key="bm25"))

    inputs = documents(the_reranker_span(traced.spans()))
    assert [(d["id"], d["score"]) for d in inputs] == [
        ("d-short", 0.9),
        ("d-medium", 0.5),
        ("d-long", 0.1),
    ]


@pytest.mark.parametrize("mode", MODES)
def test_callers_documents_unchanged_copies_come_back_with_both_scores(mode, traced):
    docs = recalled()
    before = [d.model_dump() for d in docs]

    out = retrieve(mode, RetrievalStageRerank(ByLength(), tracer_provider=traced.provider), docs)

    assert [d.model_dump() for d in docs] == before
    assert not {id(d) for d in out} & {id(d) for d in docs}
    assert not {id(d.metadata) for d in out} & {id(d.metadata) for d in docs}
    assert [(d.id, d.metadata["relevance_score"], d.metadata["retrieval_score"]) for d in out] == [
        ("d-long", 24.0, 0.1),
        ("d-medium", 14.0, 0.5),
        ("d-short", 4.0, 0.9),
    ]
    assert all(d.metadata["reranked"] is True for d in out)
    assert out[2].metadata["src"] == "a"
    assert [d.page_content for d in out] == [d.page_content for d in reversed(docs)]


@pytest.mark.parametrize("mode", MODES)
def test_document_ids_or_an_id_key_are_the_candidate_ids(mode, traced):
    docs = [
        Document(page_content=d.page_content, metadata={**d.metadata, "doc_id": f"k-{d.id}"})
        for d in recalled()
    ]
    retrieve(mode, RetrievalStageRerank(ByLength(), tracer_provider=traced.provider), recalled())
    span = the_reranker_span(traced.spans())
    assert [d["id"] for d in documents(span)] == ["d-short", "d-medium", "d-long"]
    assert [d["id"] for d in documents(span, "output")] == ["d-long", "d-medium", "d-short"]

    traced.clear()
    compressor = RetrievalStageRerank(ByLength(), id_key="doc_id", tracer_provider=traced.provider)
    out = retrieve(mode, compressor, docs)
    assert [d["id"] for d in documents(the_reranker_span(traced.spans()))] == [
        "k-d-short",
        "k-d-medium",
        "k-d-long",
    ]
    assert [d.metadata["doc_id"] for d in out] == ["k-d-long", "k-d-medium", "k-d-short"]


@pytest.mark.parametrize("mode", MODES)
def test_fallback_recall_order_no_relevance_score_span_error(mode, traced):
    down = Failing(RerankTransportError("connection refused"))
    docs = list(reversed(recalled()))  # recall order is by score, not by position

    out = retrieve(mode, RetrievalStageRerank(down, tracer_provider=traced.provider), docs)

    assert [d.id for d in out] == ["d-short", "d-medium", "d-long"]
    assert all("relevance_score" not in d.metadata for d in out)
    assert [d.metadata["score"] for d in out] == [0.9, 0.5, 0.1]
    assert all(d.metadata["reranked"] is False for d in out)
    span = the_reranker_span(traced.spans())
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description.startswith("fell back to recall order")
    assert documents(span, "output") == []


@pytest.mark.parametrize("mode", MODES)
def test_top_k_keeps_the_best_k_and_is_recorded(mode, traced):
    compressor = RetrievalStageRerank(ByLength(), top_k=2, tracer_provider=traced.provider)

    out = retrieve(mode, compressor, recalled())

    assert [d.id for d in out] == ["d-long", "d-medium"]
    assert the_reranker_span(traced.spans()).attributes["reranker.top_k"] == 2


@pytest.mark.parametrize("mode", MODES)
def test_tei_scores_answered_out_of_order_land_on_their_own_documents(mode, traced, wm):
    # TEI answers [index 1: 0.97, index 0: 0.02]: mapped by index, never by position.
    with RerankClient(wm.url + "/tei/out-of-order") as client:
        compressor = RetrievalStageRerank(client, tracer_provider=traced.provider)
        out = retrieve(mode, compressor, recalled()[:2])

    assert [(d.id, d.metadata["relevance_score"]) for d in out] == [
        ("d-medium", 0.97),
        ("d-short", 0.02),
    ]
