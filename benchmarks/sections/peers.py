"""peers: context: untraced peer clients against our stage, 50 documents each.

cohere `ClientV2.rerank`, rerankers' `APIRanker`, langchain-cohere's `CohereRerank` (Cohere v2
shape) and LlamaIndex's `TextEmbeddingInference` (TEI shape), each pointed at the local
server; peers that are not installed are left out (the reason is in ``notes``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..fixtures import (
    DOCS,
    MODEL,
    QUERY,
    LocalServer,
    candidates,
    sampled_out_provider,
    traced_provider,
)
from ..harness import Scale, interleaved
from ..report import Row

SCALE = {"peer_rounds": (9, 2), "peer_calls": (30, 5)}  # shared with peer_tracing


def measure(server: LocalServer, scale: Scale) -> dict[str, Any]:
    """Cohere-shaped (and TEI-shaped) calls of 50 documents by each peer, untraced, vs ours."""
    from retrieval_stage import RerankClient, RerankStage

    cands = candidates(DOCS)
    texts = [c.text for c in cands]
    traced = traced_provider(server)
    ours_cohere = RerankStage(
        RerankClient(server.url, provider="cohere", model=MODEL, api_key="bench-key"),
        tracer_provider=traced,
    )
    ours_tei = RerankStage(RerankClient(server.url, batch_size=DOCS), tracer_provider=traced)
    ours_off = RerankStage(
        RerankClient(server.url, provider="cohere", model=MODEL, api_key="bench-key"),
        tracer_provider=sampled_out_provider(),
    )
    variants: dict[str, Callable[[], object]] = {
        "ours: RerankStage traced, Cohere shape": lambda: ours_cohere.run(QUERY, cands),
        "ours: RerankStage traced, TEI shape": lambda: ours_tei.run(QUERY, cands),
        "ours: RerankStage sampled out, Cohere shape": lambda: ours_off.run(QUERY, cands),
    }
    notes: dict[str, str] = {}
    shape: dict[str, str] = {}

    try:
        import cohere

        co = cohere.ClientV2(api_key="bench-key", base_url=server.url, timeout=30)
        variants["cohere ClientV2.rerank"] = lambda: co.rerank(
            model=MODEL, query=QUERY, documents=texts
        )
        shape["cohere ClientV2.rerank"] = "cohere"
        notes["cohere ClientV2.rerank"] = f"cohere {cohere.__version__}, base_url=<local>"
    except ImportError as exc:
        notes["cohere ClientV2.rerank"] = f"not installed: {exc}"

    try:
        from importlib.metadata import version

        from rerankers import Reranker  # type: ignore[import-untyped]

        ranker = Reranker(
            MODEL,
            model_type="APIRanker",
            api_provider="cohere",
            api_key="bench-key",
            url=server.url + "/v2/rerank",
            verbose=0,
        )
        variants["rerankers APIRanker (cohere)"] = lambda: ranker.rank(QUERY, texts)
        shape["rerankers APIRanker (cohere)"] = "cohere"
        notes["rerankers APIRanker (cohere)"] = (
            f"rerankers {version('rerankers')}, url=<local>/v2/rerank"
        )
    except ImportError as exc:
        notes["rerankers APIRanker (cohere)"] = f"not installed: {exc}"

    try:
        from importlib.metadata import version

        from langchain_cohere import CohereRerank
        from langchain_core.documents import Document
        from pydantic import SecretStr

        lc = CohereRerank(
            model=MODEL, cohere_api_key=SecretStr("bench-key"), base_url=server.url, top_n=DOCS
        )
        lc_docs = [
            Document(page_content=t, metadata={"id": c.id})
            for t, c in zip(texts, cands, strict=False)
        ]
        variants["langchain-cohere CohereRerank"] = lambda: lc.compress_documents(lc_docs, QUERY)
        shape["langchain-cohere CohereRerank"] = "cohere"
        notes["langchain-cohere CohereRerank"] = (
            f"langchain-cohere {version('langchain-cohere')}, compress_documents, top_n=50"
        )
    except ImportError as exc:
        notes["langchain-cohere CohereRerank"] = f"not installed: {exc}"

    try:
        from importlib.metadata import version

        from llama_index.core.schema import NodeWithScore, TextNode
        from llama_index.postprocessor.tei_rerank import (  # type: ignore[import-untyped]
            TextEmbeddingInference,
        )

        li = TextEmbeddingInference(base_url=server.url, top_n=DOCS)
        nodes = [NodeWithScore(node=TextNode(text=c.text, id_=c.id), score=c.score) for c in cands]
        name = "llama-index TextEmbeddingInference (TEI)"
        variants[name] = lambda: li.postprocess_nodes(nodes, query_str=QUERY)
        shape[name] = "tei"
        notes[name] = (
            f"llama-index-postprocessor-tei-rerank "
            f"{version('llama-index-postprocessor-tei-rerank')}, postprocess_nodes"
        )
    except ImportError as exc:
        notes["llama-index TextEmbeddingInference (TEI)"] = f"not installed: {exc}"

    for fn in variants.values():
        for _ in range(10):
            fn()
    traced.force_flush()
    flush = traced.force_flush
    t = interleaved(
        variants,
        rounds=scale.peer_rounds,
        calls=scale.peer_calls,
        after_block={
            "ours: RerankStage traced, Cohere shape": flush,
            "ours: RerankStage traced, TEI shape": flush,
        },
    ).median_wall()
    traced.shutdown()
    reference = {
        "cohere": t["ours: RerankStage traced, Cohere shape"],
        "tei": t["ours: RerankStage traced, TEI shape"],
    }
    untraced = t["ours: RerankStage sampled out, Cohere shape"]
    return {
        "seconds_per_call": t,
        "peer_over_ours_traced": {name: t[name] / reference[s] for name, s in shape.items()},
        "peer_over_ours_sampled_out": {
            name: t[name] / untraced for name, s in shape.items() if s == "cohere"
        },
        "shape": shape,
        "notes": notes,
    }


def rows(p: dict[str, Any], results: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    for name, r in p["peer_over_ours_traced"].items():
        out.append(
            (f"{name} untraced / ours traced ({p['shape'][name]} shape)", f"{r:.2f}x", "", "")
        )
    for name, r in p["peer_over_ours_sampled_out"].items():
        out.append((f"{name} untraced / ours sampled out", f"{r:.2f}x", "", ""))
    return out
