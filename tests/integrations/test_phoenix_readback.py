"""The one RERANKER span per framework, read back from a real Arize Phoenix (issue 24's proof).

The session's Phoenix server (`tests.phoenix_server`: ``.venv-phoenix``, tests/phoenix/setup.sh)
runs on loopback. Each framework runs its usual flow (LlamaIndex query engine, LangChain
compression retriever, Haystack BM25 pipeline) with its OpenInference instrumentor and the
stage exporting over OTLP/HTTP to Phoenix, each into its own project. Phoenix's REST API then
says what a user sees: one RERANKER span, ours, inside the framework's trace, with the recall
scores on its input documents and the rerank scores on its output documents. Run with ``-s``
to print the read-back.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from retrieval_stage.local import LexicalReranker

from ..phoenix_server import INGEST_SECONDS, MISSING, PHOENIX

pytestmark = pytest.mark.phoenix

QUERY = "how do I parse JSON in Python"
TEXTS = {
    "faq-7": ("JSON is a text format; Python reads JSON.", 7.2),
    "howto-3": ("To parse JSON in Python, call json.loads.", 5.1),
    "blog-9": ("Parsing YAML in Python is harder.", 4.4),
}

if not PHOENIX.exists():
    pytest.skip(MISSING, allow_module_level=True)
for _module in ("llama_index.core", "langchain_classic", "haystack"):
    pytest.importorskip(_module, reason="tests/integrations/setup.sh makes .venv-frameworks")


def _provider(phoenix: str, project: str) -> TracerProvider:
    provider = TracerProvider(resource=Resource({"openinference.project.name": project}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(phoenix + "/v1/traces")))
    return provider


def _whole(spans: list[dict[str, Any]]) -> bool:
    """True once a RERANKER span is there and every span's parent is too.

    Phoenix stores what it receives through a queue, so right after the exporter returns it
    may hold the children of a trace and not yet their parents (the root span ends, and is
    exported, last). A count of spans says nothing about which ones arrived.
    """
    ids = {s["context"]["span_id"] for s in spans}
    return any(s["span_kind"] == "RERANKER" for s in spans) and all(
        s["parent_id"] is None or s["parent_id"] in ids for s in spans
    )


def _spans(phoenix: str, project: str) -> list[dict[str, Any]]:
    """The project's spans once Phoenix holds a whole trace (or what it holds at the deadline)."""
    deadline = time.monotonic() + INGEST_SECONDS
    while True:
        reply = httpx.get(f"{phoenix}/v1/projects/{project}/spans", params={"limit": 1000})
        data: list[dict[str, Any]] = reply.json()["data"] if reply.status_code == 200 else []
        if _whole(data) or time.monotonic() > deadline:
            return data
        time.sleep(0.25)


def _documents(attributes: dict[str, Any], which: str) -> list[tuple[str, float]]:
    out = []
    i = 0
    while (doc := attributes.get(f"reranker.{which}_documents.{i}.document.id")) is not None:
        out.append((doc, attributes[f"reranker.{which}_documents.{i}.document.score"]))
        i += 1
    return out


def _read_back(spans: list[dict[str, Any]], framework: str) -> dict[str, Any]:
    """The one RERANKER span, checked to sit in the framework's trace; printed for the note."""
    rerankers = [s for s in spans if s["span_kind"] == "RERANKER"]
    assert len(rerankers) == 1, [(s["name"], s["span_kind"]) for s in spans]
    ours = rerankers[0]
    by_id = {s["context"]["span_id"]: s for s in spans}
    chain = [ours]
    while (parent := chain[-1]["parent_id"]) is not None:
        assert parent in by_id, f"Phoenix never stored span {parent}, parent of {chain[-1]['name']}"
        chain.append(by_id[parent])
    assert len(chain) > 1, "the RERANKER span is a root: it landed in a trace of its own"
    assert {s["context"]["trace_id"] for s in chain} == {ours["context"]["trace_id"]}
    attributes = ours["attributes"]
    print(f"\n[{framework}] trace {ours['context']['trace_id']}: {len(spans)} spans")
    print("  chain: " + " <- ".join(f"{s['name']} ({s['span_kind']})" for s in chain))
    model = attributes.get("reranker.model_name")
    print(f"  RERANKER query={attributes['reranker.query']!r} model={model!r}")
    print(f"  in  (recall): {_documents(attributes, 'input')}")
    print(f"  out (rerank): {_documents(attributes, 'output')}")
    return ours


def _scores_in_and_out(ours: dict[str, Any], recall: list[tuple[str, float]]) -> None:
    attributes = ours["attributes"]
    assert _documents(attributes, "input") == recall
    out = _documents(attributes, "output")
    assert [d for d, _ in out] == ["howto-3", "faq-7", "blog-9"]
    assert all(0.0 <= s <= 1.0 for _, s in out)
    assert ours["status_code"] != "ERROR"


def test_llama_index_one_reranker_span_in_phoenix(phoenix: str) -> None:
    from llama_index.core import Settings, get_response_synthesizer
    from llama_index.core.llms import MockLLM
    from llama_index.core.query_engine import RetrieverQueryEngine
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, TextNode
    from openinference.instrumentation.llama_index import LlamaIndexInstrumentor

    from retrieval_stage.integrations.llama_index import RetrievalStageRerank

    nodes = [NodeWithScore(node=TextNode(id_=i, text=t), score=s) for i, (t, s) in TEXTS.items()]

    class Fixed(BaseRetriever):
        def _retrieve(self, query_bundle: Any) -> list[NodeWithScore]:
            return nodes

    provider = _provider(phoenix, "llama-index")
    instrumentor = LlamaIndexInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    saved, Settings.llm = Settings._llm, MockLLM()
    try:
        engine = RetrieverQueryEngine(
            Fixed(),
            response_synthesizer=get_response_synthesizer(response_mode="no_text"),
            node_postprocessors=[RetrievalStageRerank(LexicalReranker(), tracer_provider=provider)],
        )
        asyncio.run(engine.aquery(QUERY))
    finally:
        Settings._llm = saved
        instrumentor.uninstrument()
        provider.shutdown()

    ours = _read_back(_spans(phoenix, "llama-index"), "llama-index")
    _scores_in_and_out(ours, [(i, s) for i, (_, s) in TEXTS.items()])


def test_langchain_one_reranker_span_in_phoenix(phoenix: str) -> None:
    from langchain_classic.retrievers import ContextualCompressionRetriever
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
    from openinference.instrumentation.langchain import LangChainInstrumentor

    from retrieval_stage.integrations.langchain import RetrievalStageRerank

    class Fixed(BaseRetriever):
        def _get_relevant_documents(self, query: str, *, run_manager: Any) -> list[Document]:
            return [
                Document(id=i, page_content=t, metadata={"score": s}) for i, (t, s) in TEXTS.items()
            ]

    provider = _provider(phoenix, "langchain")
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        ContextualCompressionRetriever(
            base_compressor=RetrievalStageRerank(LexicalReranker(), tracer_provider=provider),
            base_retriever=Fixed(),
        ).invoke(QUERY)
    finally:
        instrumentor.uninstrument()
        provider.shutdown()

    ours = _read_back(_spans(phoenix, "langchain"), "langchain")
    _scores_in_and_out(ours, [(i, s) for i, (_, s) in TEXTS.items()])


def test_haystack_one_reranker_span_in_phoenix(phoenix: str) -> None:
    from haystack import Document, Pipeline
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
    from haystack.document_stores.in_memory import InMemoryDocumentStore
    from openinference.instrumentation.haystack import HaystackInstrumentor

    from retrieval_stage.integrations.haystack import RetrievalStageRerank

    store = InMemoryDocumentStore()
    store.write_documents([Document(id=i, content=t) for i, (t, _) in TEXTS.items()])
    provider = _provider(phoenix, "haystack")
    instrumentor = HaystackInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        pipeline = Pipeline()
        pipeline.add_component("retriever", InMemoryBM25Retriever(store))
        pipeline.add_component(
            "rerank", RetrievalStageRerank(LexicalReranker(), tracer_provider=provider)
        )
        pipeline.connect("retriever.documents", "rerank.documents")
        result = pipeline.run(
            {"retriever": {"query": QUERY}, "rerank": {"query": QUERY}},
            include_outputs_from={"retriever"},
        )
    finally:
        instrumentor.uninstrument()
        provider.shutdown()

    ours = _read_back(_spans(phoenix, "haystack"), "haystack")
    bm25 = [(d.id, d.score) for d in result["retriever"]["documents"]]
    _scores_in_and_out(ours, bm25)
