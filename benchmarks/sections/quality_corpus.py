"""quality_corpus: context (issue 28): healthy and unhealthy values of the quality signals.

The 24 judged questions of the bundled example, each with BM25's top 50 as candidates, go
through a traced `RerankStage` (top_k 10, as a RAG pipeline keeps) with four rerankers: the
packaged MiniLM embedding model (the ``[local]`` extra; left out, with a note, where it is not
installed), the lexical reranker, one that returns its input (recall) order with made-up
descending scores (a server echoing its input, a swapped-out model), and `NullReranker`, which
scores everything 0.0 (a collapsed reranker). The signals are read back from the finished
RERANKER spans' ``retrieval_stage.quality.*`` attributes, as a trace backend sees them;
nDCG@10 (ir-measures, the eval's numbers) says which of them actually helped. No timing, no
server: the table in docs/quality.md is these rows.

    python -m benchmarks --only quality_corpus
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..fixtures import LocalServer
from ..harness import Scale
from ..report import Row

T = TypeVar("T")
TOP_K = 10
SIGNALS = (
    "kendall_tau", "topk_overlap", "max_promotion", "top_score", "score_margin", "rbo",
    "score_spread",
)  # fmt: skip


class InputOrder:
    """Returns the candidates in the order given (recall's), scores 1, 0.99, 0.98, ...: what a
    server echoing its input, or a model that cannot tell documents apart but breaks ties by
    position, looks like."""

    provider = "local"
    model_name = "input-order"

    def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        ranked = [(item, 1.0 - i / 100) for i, item in enumerate(items)]
        return ranked[:top_k] if top_k else ranked


def _rerankers(notes: dict[str, str]) -> dict[str, Any]:
    from retrieval_stage.local import LexicalReranker
    from retrieval_stage.null import NullReranker

    found: dict[str, Any] = {}
    try:
        from retrieval_stage.local import EmbeddingReranker

        found["embedding (MiniLM)"] = EmbeddingReranker()
    except ImportError as exc:  # the [local] extra (sentence-transformers, torch) is missing
        notes["embedding (MiniLM)"] = f"not installed: {exc}"
    found["lexical"] = LexicalReranker()
    found["input order"] = InputOrder()
    found["null (all 0.0)"] = NullReranker()
    return found


def _inputs() -> tuple[dict[str, str], Any, dict[str, list[Any]]]:
    from retrieval_stage.evaluation import read_candidates, read_qrels, read_queries
    from retrieval_stage.evaluation.corpus import (
        EXAMPLE_CANDIDATES,
        EXAMPLE_QRELS,
        EXAMPLE_QUERIES,
        data_path,
        load_corpus,
    )
    from retrieval_stage.models import recall_order

    corpus = {d.id: d for d in load_corpus()}
    queries = read_queries(data_path(EXAMPLE_QUERIES))
    qrels = read_qrels(data_path(EXAMPLE_QRELS))
    pools = read_candidates(data_path(EXAMPLE_CANDIDATES), corpus)
    judged = {q: t for q, t in queries.items() if any(g > 0 for g in qrels.get(q, {}).values())}
    ordered = {q: [pools[q][i] for i in recall_order(pools[q])] for q in judged}
    return judged, qrels, ordered


def _summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"calls": 0}
    return {
        "calls": len(values),
        "median": statistics.median(values),
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
    }


def measure(server: LocalServer, scale: Scale) -> dict[str, Any]:
    """Each reranker's signals over the 24 calls, read back from its RERANKER spans."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from retrieval_stage import RerankStage
    from retrieval_stage.evaluation import per_query_scores
    from retrieval_stage.spans.keys import (
        ATTR_KENDALL_TAU,
        ATTR_MAX_PROMOTION,
        ATTR_RBO,
        ATTR_SCORE_MARGIN,
        ATTR_SCORE_SPREAD,
        ATTR_TOP_SCORE,
        ATTR_TOPK_OVERLAP,
    )

    keys = dict(
        zip(
            SIGNALS,
            (ATTR_KENDALL_TAU, ATTR_TOPK_OVERLAP, ATTR_MAX_PROMOTION, ATTR_TOP_SCORE,
             ATTR_SCORE_MARGIN, ATTR_RBO, ATTR_SCORE_SPREAD),
            strict=True,
        )
    )  # fmt: skip
    notes: dict[str, str] = {}

    queries, qrels, pools = _inputs()
    recall_rankings = {q: [c.id for c in pools[q]] for q in queries}
    recall_ndcg = per_query_scores(recall_rankings, qrels, list(queries))["nDCG@10"]
    out: dict[str, Any] = {
        "queries": len(queries),
        "candidates": "the bundled BM25 run, top 50",
        "top_k": TOP_K,
        "recall_ndcg10": statistics.fmean(recall_ndcg.values()),
        "rerankers": {},
    }
    for label, reranker in _rerankers(notes).items():
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        stage = RerankStage(reranker, top_k=TOP_K, tracer_provider=provider)
        rankings = {q: [r.candidate.id for r in stage.run(t, pools[q])] for q, t in queries.items()}
        spans = [s for s in exporter.get_finished_spans() if s.name == "rerank"]
        values: dict[str, list[float]] = {name: [] for name in SIGNALS}
        for span in spans:
            attributes = span.attributes or {}
            for name, key in keys.items():
                if key in attributes:
                    values[name].append(float(attributes[key]))  # type: ignore[arg-type]
        unchanged = sum(1 for v in values["kendall_tau"] if v >= 0.9999)
        tied = sum(1 for v in values["score_margin"] if v <= 0.0001)
        ndcg = per_query_scores(rankings, qrels, list(queries))["nDCG@10"]
        out["rerankers"][label] = {
            "signals": {name: _summary(v) for name, v in values.items()},
            "share_unchanged_tau_1": unchanged / len(spans),
            "share_tau_absent": 1 - len(values["kendall_tau"]) / len(spans),
            "share_top_two_tied": tied / len(spans),
            "ndcg10": statistics.fmean(ndcg.values()),
        }
        provider.shutdown()
    out["notes"] = notes
    return out


def rows(result: dict[str, Any], results: dict[str, Any]) -> list[Row]:
    """One row per reranker: nDCG@10 and each signal's median (min to max) over the calls."""

    def cell(summary: dict[str, Any]) -> str:
        if not summary["calls"]:
            return "absent"
        return f"{summary['median']:.3g} ({summary['min']:.3g} to {summary['max']:.3g})"

    out: list[Row] = []
    for label, row in result["rerankers"].items():
        s = row["signals"]
        out.append(
            (
                f"quality on the bundled corpus ({result['queries']} queries, BM25 top 50, "
                f"top_k {result['top_k']}; recall nDCG@10 {result['recall_ndcg10']:.3f}): "
                f"{label}",
                f"nDCG@10 {row['ndcg10']:.3f}; tau {cell(s['kendall_tau'])}, "
                f"tau = 1 on {row['share_unchanged_tau_1']:.0%}, absent on "
                f"{row['share_tau_absent']:.0%}; overlap@10 {cell(s['topk_overlap'])}; "
                f"max promotion {cell(s['max_promotion'])}; top score {cell(s['top_score'])}; "
                f"margin {cell(s['score_margin'])}, top two tied on "
                f"{row['share_top_two_tied']:.0%}; RBO {cell(s['rbo'])}; "
                f"spread@10 {cell(s['score_spread'])}",
                "",
                "",
            )
        )
    for label, why in result.get("notes", {}).items():
        out.append((f"quality on the bundled corpus: {label}", f"left out ({why})", "", ""))
    return out
