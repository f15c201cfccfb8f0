"""`retrieval_stage.integrations.llama_index` against the real LlamaIndex and its instrumentor.

Each test pins one guarantee of issue 24, on the sync and the async path: one RERANKER span
(ours) inside LlamaIndex's trace, recall scores from ``NodeWithScore.score`` on the span,
the caller's nodes untouched, node ids as candidate ids, an honest fallback, top_k. The query
engine runs as a user runs it (a retriever, the postprocessor, ``response_mode="no_text"`` and
LlamaIndex's MockLLM, so no model is called).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

pytest.importorskip(
    "llama_index.core",
    reason="LlamaIndex is not installed here: tests/integrations/setup.sh makes .venv-frameworks",
)
pytest.importorskip(
    "openinference.instrumentation.llama_index",
    reason="its OpenInference instrumentor is not installed (tests/integrations/setup.sh)",
)

from llama_index.core import Settings, get_response_synthesizer
from llama_index.core.llms import MockLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode
from openinference.instrumentation.llama_index import LlamaIndexInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import StatusCode

from retrieval_stage import RerankClient, RerankTransportError
from retrieval_stage.integrations.llama_index import RetrievalStageRerank

from ..fakes import ByLength, Failing
from ._trace import assert_inside_framework, documents, the_reranker_span

QUERY = "how do I parse json"
MODES = ["sync", "async"]


@pytest.fixture(scope="module", autouse=True)
def _instrumented(tracer_provider: TracerProvider) -> Iterator[None]:
    instrumentor = LlamaIndexInstrumentor()
    instrumentor.instrument(tracer_provider=tracer_provider)
    saved = Settings._llm
    Settings.llm = MockLLM()  # no model is called ("no_text"), but LlamaIndex asks for one
    yield
    Settings._llm = saved
    instrumentor.uninstrument()


class Fixed(BaseRetriever):
    """A retriever that answers the same nodes every time (the caller's own objects)."""

    def __init__(self, nodes: list[NodeWithScore]) -> None:
        super().__init__()
        self.nodes = nodes

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self.nodes


def recalled() -> list[NodeWithScore]:
    """Recall order n-short, n-medium, n-long; `ByLength` reverses it."""
    return [
        NodeWithScore(node=TextNode(id_="n-short", text="json", metadata={"src": "a"}), score=0.9),
        NodeWithScore(node=TextNode(id_="n-medium", text="parse json now"), score=0.5),
        NodeWithScore(node=TextNode(id_="n-long", text="how to parse a json file"), score=0.1),
    ]


def query(mode: str, postprocessor: RetrievalStageRerank, nodes: list[NodeWithScore]) -> list:
    """Run the query engine with `postprocessor`, sync or async; the nodes it kept."""
    engine = RetrieverQueryEngine(
        Fixed(nodes),
        response_synthesizer=get_response_synthesizer(response_mode="no_text"),
        node_postprocessors=[postprocessor],
    )
    if mode == "sync":
        return list(engine.query(QUERY).source_nodes)
    return list(asyncio.run(engine.aquery(QUERY)).source_nodes)


@pytest.mark.parametrize("mode", MODES)
def test_one_reranker_span_ours_inside_the_query_engine_trace(mode, traced):
    query(mode, RetrievalStageRerank(ByLength(), tracer_provider=traced.provider), recalled())

    spans = traced.spans()
    ours = the_reranker_span(spans)
    root = "RetrieverQueryEngine.query" if mode == "sync" else "RetrieverQueryEngine.aquery"
    assert_inside_framework(ours, spans, root)


@pytest.mark.parametrize("mode", MODES)
def test_recall_scores_from_node_scores_are_the_span_input_scores(mode, traced):
    query(mode, RetrievalStageRerank(ByLength(), tracer_provider=traced.provider), recalled())

    inputs = documents(the_reranker_span(traced.spans()))
    assert [(d["id"], d["score"]) for d in inputs] == [
        ("n-short", 0.9),
        ("n-medium", 0.5),
        ("n-long", 0.1),
    ]


@pytest.mark.parametrize("mode", MODES)
def test_callers_nodes_unchanged_copies_come_back_with_both_scores(mode, traced):
    nodes = recalled()
    before = [n.model_dump() for n in nodes]

    out = query(mode, RetrievalStageRerank(ByLength(), tracer_provider=traced.provider), nodes)

    assert [n.model_dump() for n in nodes] == before
    assert not {id(n) for n in out} & {id(n) for n in nodes}
    assert not {id(n.node) for n in out} & {id(n.node) for n in nodes}
    # Best first, the rerank score in the slot, the recall score kept in metadata. The text
    # scored is LlamaIndex's embedding view ("src: a\n\njson": 12), as its own rerankers do.
    assert [(n.node.node_id, n.score) for n in out] == [
        ("n-long", 24.0),
        ("n-medium", 14.0),
        ("n-short", 12.0),
    ]
    assert [n.node.metadata["retrieval_score"] for n in out] == [0.1, 0.5, 0.9]
    assert all(n.node.metadata["reranked"] is True for n in out)
    # ... and never in the text an LLM or an embedder sees.
    for n in out:
        for mode_ in (MetadataMode.LLM, MetadataMode.EMBED):
            text = n.node.get_content(metadata_mode=mode_)
            assert "retrieval_score" not in text
            assert "reranked" not in text
    assert "src: a" in out[2].node.get_content(metadata_mode=MetadataMode.LLM)


@pytest.mark.parametrize("mode", MODES)
def test_node_ids_are_the_candidate_ids(mode, traced):
    query(mode, RetrievalStageRerank(ByLength(), tracer_provider=traced.provider), recalled())

    span = the_reranker_span(traced.spans())
    assert [d["id"] for d in documents(span)] == ["n-short", "n-medium", "n-long"]
    assert [d["id"] for d in documents(span, "output")] == ["n-long", "n-medium", "n-short"]


@pytest.mark.parametrize("mode", MODES)
def test_fallback_recall_order_recall_scores_unrelabelled_span_error(mode, traced):
    down = Failing(RerankTransportError("connection refused"))
    nodes = list(reversed(recalled()))  # recall order is by score, not by position

    out = query(mode, RetrievalStageRerank(down, tracer_provider=traced.provider), nodes)

    assert [(n.node.node_id, n.score) for n in out] == [
        ("n-short", 0.9),
        ("n-medium", 0.5),
        ("n-long", 0.1),
    ]
    assert all(n.node.metadata["reranked"] is False for n in out)
    span = the_reranker_span(traced.spans())
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description.startswith("fell back to recall order")
    assert documents(span, "output") == []  # recall scores are never shown as rerank scores


@pytest.mark.parametrize("mode", MODES)
def test_top_k_keeps_the_best_k_and_is_recorded(mode, traced):
    pp = RetrievalStageRerank(ByLength(), top_k=2, tracer_provider=traced.provider)

    out = query(mode, pp, recalled())

    assert [n.node.node_id for n in out] == ["n-long", "n-medium"]
    assert the_reranker_span(traced.spans()).attributes["reranker.top_k"] == 2


@pytest.mark.parametrize("mode", MODES)
def test_tei_scores_answered_out_of_order_land_on_their_own_nodes(mode, traced, wm):
    # TEI answers [index 1: 0.97, index 0: 0.02]: mapped by index, never by position.
    nodes = recalled()[:2]
    with RerankClient(wm.url + "/tei/out-of-order") as client:
        out = query(mode, RetrievalStageRerank(client, tracer_provider=traced.provider), nodes)

    assert [(n.node.node_id, n.score) for n in out] == [("n-medium", 0.97), ("n-short", 0.02)]
    assert [d["score"] for d in documents(the_reranker_span(traced.spans()), "output")] == [
        0.97,
        0.02,
    ]
