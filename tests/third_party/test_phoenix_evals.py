"""``retrieval-stage eval --phoenix`` against a real Arize Phoenix (issue 28).

The CLI runs the bundled eval (24 judged queries, BM25's top 50) with the lexical reranker,
traced into the session's Phoenix on loopback (`tests.phoenix_server`).
Phoenix's GraphQL API then gives, for every RERANKER and RETRIEVER span, the NDCG@10,
precision@5 and hit Phoenix computed from the judgements the CLI logged, and they are held to
our own eval's numbers for the same queries.

Phoenix's NDCG normalises by the best order of the documents the span shows, ir-measures' by
the best order of every judged document: they agree exactly when every relevant document is
among the span's (checked), and otherwise Phoenix's is the eval's recomputed with the judgements
restricted to the span's documents (checked with our own `per_query_scores`).
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from retrieval_stage.evaluation import per_query_scores

from .test_phoenix import ROOT, SCRIPT, _graphql

pytestmark = pytest.mark.phoenix

PROJECT = "eval-phoenix-test"
SPANS_QUERY = """
query ($name: String!, $after: String) {
  getProjectByName(name: $name) {
    spans(first: 100, after: $after, filterCondition: "span_kind in ('RERANKER', 'RETRIEVER')") {
      pageInfo { hasNextPage endCursor }
      edges { node {
        spanKind
        context { spanId }
        recall: documentRetrievalMetrics(evaluationName: "recall.relevance") {
          ndcg10: ndcg(k: 10) precision5: precision(k: 5) hit
        }
        rerank: documentRetrievalMetrics(evaluationName: "rerank.relevance") {
          ndcg10: ndcg(k: 10) precision5: precision(k: 5) hit
        }
        shared: documentRetrievalMetrics(evaluationName: "relevance") { hit }
        documentEvaluations { documentPosition score metadata }
      } }
    }
  }
}
"""


PROJECT_SUMMARY = """
query ($name: String!) {
  getProjectByName(name: $name) {
    documentEvaluationNames
    recall: documentEvaluationSummary(evaluationName: "recall.relevance") {
      averageNdcg(k: 10) countNdcg(k: 10) averagePrecision(k: 5)
    }
    rerank: documentEvaluationSummary(evaluationName: "rerank.relevance") {
      averageNdcg(k: 10) countNdcg(k: 10) averagePrecision(k: 5)
    }
  }
}
"""
"""What Phoenix's project page summarises: one summary per annotation name."""
NAMES = {"RERANKER": "rerank", "RETRIEVER": "recall"}
"""The GraphQL alias of each span kind's own annotation name (`SPANS_QUERY`)."""


def _eval(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RERANK_"))}
    env.pop("RETRIEVAL_STAGE_PROJECT", None)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "COLUMNS": "200",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        }
    )
    return subprocess.run(
        [str(SCRIPT), "eval", "--reranker", "lexical", "--json", "--resamples", "100", *args],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=300,
        check=False,
    )


def _spans(url: str) -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = []
    after = None
    while True:
        data = _graphql(url, SPANS_QUERY, name=PROJECT, after=after)
        spans = data["getProjectByName"]["spans"]
        nodes += [edge["node"] for edge in spans["edges"]]
        if not spans["pageInfo"]["hasNextPage"]:
            return nodes
        after = spans["pageInfo"]["endCursor"]


@pytest.fixture(scope="module")
def evaluated(phoenix: str) -> dict[str, Any]:
    done = _eval(phoenix, "--phoenix", phoenix, "--project", PROJECT)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    summary = _graphql(phoenix, PROJECT_SUMMARY, name=PROJECT)["getProjectByName"]
    return {
        "report": report,
        "stderr": done.stderr,
        "spans": _spans(phoenix),
        "summary": summary,
    }


def _by_query(spans: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    """Each span of `kind` under the query id its judgements name."""
    out: dict[str, dict[str, Any]] = {}
    for span in spans:
        if span["spanKind"].upper() != kind:
            continue
        evaluations = span["documentEvaluations"]
        assert evaluations, f"{kind} span {span['context']['spanId']} has no judgements"
        (query_id,) = {e["metadata"]["query_id"] for e in evaluations}
        assert query_id not in out
        out[query_id] = span
    return out


def test_the_eval_logs_a_judgement_for_every_document_it_traced(evaluated: dict[str, Any]) -> None:
    report = evaluated["report"]
    logged = report["phoenix"]
    queries = report["queries"]
    assert logged["project"] == PROJECT
    assert logged["spans"] == 2 * queries  # a RETRIEVER and a RERANKER span per query
    # Every candidate (BM25's top 50, fewer for a few queries) on both spans of its query.
    assert 2 * queries * 40 < logged["annotations"] <= 2 * queries * 50
    assert (
        f"{logged['annotations']} document judgements on {logged['spans']} spans"
        in (evaluated["stderr"])
    )
    spans = evaluated["spans"]
    assert len(_by_query(spans, "RERANKER")) == len(_by_query(spans, "RETRIEVER")) == queries
    stored = sum(len(s["documentEvaluations"]) for s in spans)
    assert stored == logged["annotations"]


@pytest.mark.parametrize(("kind", "side"), [("RERANKER", "reranked"), ("RETRIEVER", "recall")])
def test_phoenix_ndcg_is_our_eval_ndcg(evaluated: dict[str, Any], kind: str, side: str) -> None:
    report = evaluated["report"]
    spans = _by_query(evaluated["spans"], kind)
    exact = 0
    for row in report["per_query"]:
        span = spans[row["query_id"]]
        (metrics,) = span[NAMES[kind]]
        # Only its own kind's name: none under the other's, none under the shared one.
        other = ({"RERANKER", "RETRIEVER"} - {kind}).pop()
        assert span[NAMES[other]] == []
        assert span["shared"] == []
        evaluations = sorted(span["documentEvaluations"], key=lambda e: e["documentPosition"])
        ranking = [e["metadata"]["document_id"] for e in evaluations]
        grades = {e["metadata"]["document_id"]: int(e["score"]) for e in evaluations}
        ours = row[side]["nDCG@10"]
        # The eval's own measure, with the judgements restricted to what the span shows.
        local = per_query_scores({"q": ranking}, {"q": grades}, ["q"])["nDCG@10"]["q"]
        assert metrics["ndcg10"] == pytest.approx(local, abs=1e-9), row["query_id"]
        relevant = {d for d, g in grades.items() if g > 0}
        assert metrics["hit"] == (1.0 if relevant else 0.0)
        top5 = sum(1 for d in ranking[:5] if d in relevant) / 5
        assert metrics["precision5"] == pytest.approx(top5)
        if len(relevant) == sum(1 for g in _qrels_for(row["query_id"]).values() if g > 0):
            # Every relevant document is on the span: Phoenix's NDCG is the report's.
            assert metrics["ndcg10"] == pytest.approx(ours, abs=1e-9), row["query_id"]
            exact += 1
        else:
            assert metrics["ndcg10"] >= ours - 1e-9  # a smaller ideal: never below ours
    assert exact >= 1, "no query had all its relevant documents recalled: nothing compared"


def test_the_project_summarises_recall_and_rerank_apart(evaluated: dict[str, Any]) -> None:
    summary = evaluated["summary"]
    assert sorted(summary["documentEvaluationNames"]) == ["recall.relevance", "rerank.relevance"]
    per_query = evaluated["report"]["per_query"]
    for kind, side in (("RERANKER", "reranked"), ("RETRIEVER", "recall")):
        spans = _by_query(evaluated["spans"], kind)
        ndcgs = [spans[row["query_id"]][NAMES[kind]][0]["ndcg10"] for row in per_query]
        panel = summary[NAMES[kind]]
        # Each summary is the mean over its own kind's spans only, not over both kinds.
        assert panel["countNdcg"] == len(per_query)
        assert panel["averageNdcg"] == pytest.approx(sum(ndcgs) / len(ndcgs), abs=1e-9), side
    assert summary["rerank"]["averageNdcg"] != pytest.approx(summary["recall"]["averageNdcg"])
    assert "'rerank.relevance' on RERANKER spans, 'recall.relevance' on RETRIEVER spans" in (
        " ".join(evaluated["stderr"].split())
    )
    assert evaluated["report"]["phoenix"]["annotation_names"] == {
        "RERANKER": "rerank.relevance",
        "RETRIEVER": "recall.relevance",
    }


def _qrels_for(query_id: str) -> dict[str, int]:
    from retrieval_stage.evaluation import read_qrels
    from retrieval_stage.evaluation.corpus import EXAMPLE_QRELS, data_path

    return read_qrels(data_path(EXAMPLE_QRELS)).get(query_id, {})


def test_a_bare_phoenix_is_where_the_otlp_endpoint_points(phoenix: str) -> None:
    env_done = _eval_with_endpoint(phoenix)
    assert env_done.returncode == 0, env_done.stderr
    assert f"logged to {phoenix}" in env_done.stderr


def _eval_with_endpoint(url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RERANK_"))}
    env.update(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": url,
            "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        }
    )
    return subprocess.run(
        [
            str(SCRIPT),
            "eval",
            "--reranker",
            "lexical",
            "--resamples",
            "100",
            "--phoenix",  # bare: Phoenix is where OTEL_EXPORTER_OTLP_ENDPOINT points
            "--project",
            PROJECT + "-otlp",
        ],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=300,
        check=False,
    )
