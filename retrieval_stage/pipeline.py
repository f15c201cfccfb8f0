"""Recall then rerank, as one traced call: the `Recall` contract, `Pipeline`, and rank changes.

One `Pipeline.run(query)` is one trace a person can open: an OpenInference CHAIN span
(``pipeline``) whose children are a RETRIEVER span (``recall``, with the recalled documents as
``retrieval.documents.<i>.document.*``) and the RERANKER span (``rerank``) that `RerankStage`
writes. `RankChange` says, for each output, where recall had put it and how far it moved.

All three spans carry OpenInference's context attributes (`using_session` and the like); inside
OpenTelemetry's instrumentation suppression or OpenInference's `suppress_tracing` none is made.
When the rerank falls back to recall order, the CHAIN span says so: ``retrieval_stage.fallback``
true and status ERROR, described ``fell back to recall order: <cause>``. ERROR, not UNSET,
because OpenTelemetry has no "degraded" status, only ERROR carries a description, and Phoenix's
trace list and its status filter show only a root span's status: an UNSET root would show a
degraded trace as healthy. The call itself still returns its (recall-ordered) results.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from openinference.instrumentation import TraceConfig
from opentelemetry.trace import TracerProvider

from .models import Candidate, Reranked, recall_order
from .spans.keys import ATTR_RECALL, ATTR_RECALL_K, ATTR_RETRIEVAL_OMITTED
from .spans.pipeline import PipelineSpans
from .stage import RerankStage

__all__ = [
    "ATTR_RECALL",
    "ATTR_RECALL_K",
    "ATTR_RETRIEVAL_OMITTED",
    "Pipeline",
    "PipelineResult",
    "RankChange",
    "Recall",
    "compare_ranks",
]


class Recall(Protocol):
    """First-stage retrieval: a query in, up to `k` candidates with recall scores out.

    Candidates come back best first, each with its recall `score`. `BM25Recall` is the
    built-in one; a vector store or search service wrapped in a class with this method works
    the same.
    """

    def recall(self, query: str, k: int) -> list[Candidate]:
        """Up to `k` candidates for `query`, best first, with recall scores."""
        ...


@dataclass(frozen=True, slots=True)
class RankChange:
    """One output with the rank it had after recall, both 1-based.

    `score` is the reranker's score (the recall score when the stage fell back, then
    `reranked` is False); `recall_score` is the candidate's own. `window` is how many outputs
    were kept: an output whose recall rank lies outside it entered the list from below.
    """

    candidate: Candidate
    score: float | None
    rank: int
    recall_rank: int
    window: int
    reranked: bool = True

    @property
    def recall_score(self) -> float | None:
        """The candidate's recall score."""
        return self.candidate.score

    @property
    def moved(self) -> int:
        """Places moved up (positive) or down (negative) from recall's order."""
        return self.recall_rank - self.rank

    @property
    def is_new(self) -> bool:
        """True when recall ranked it outside the kept outputs: reranking brought it in."""
        return self.recall_rank > self.window

    @property
    def movement(self) -> str:
        """``↑3``, ``↓5``, ``=``, or ``new`` (brought into the kept outputs from below)."""
        if self.is_new:
            return "new"
        if self.moved > 0:
            return f"↑{self.moved}"
        if self.moved < 0:
            return f"↓{-self.moved}"
        return "="


def compare_ranks(candidates: Sequence[Candidate], outputs: Sequence[Reranked]) -> list[RankChange]:
    """Each output's final rank beside its recall rank.

    The recall rank is the candidate's place in recall order: by recall score, best first,
    candidates without a score last, ties in input order (the order the stage falls back to).
    """
    recall_rank = {index: rank for rank, index in enumerate(recall_order(candidates), start=1)}
    window = len(outputs)
    return [
        RankChange(
            candidate=out.candidate,
            score=out.score,
            rank=rank,
            recall_rank=recall_rank[out.input_index],
            window=window,
            reranked=out.reranked,
        )
        for rank, out in enumerate(outputs, start=1)
    ]


@dataclass(frozen=True, slots=True)
class PipelineResult:
    """What one pipeline call produced.

    `recalled` are recall's candidates, best first; `results` the stage's outputs, best first;
    `trace_id` the call's trace as 32 lowercase hex digits (None when tracing is off).
    """

    query: str
    recalled: list[Candidate]
    results: list[Reranked]
    trace_id: str | None = None

    @property
    def changes(self) -> list[RankChange]:
        """Each result with its recall rank and movement."""
        return compare_ranks(self.recalled, self.results)

    @property
    def fell_back(self) -> bool:
        """True when the reranker failed and the results are in recall order."""
        return any(not r.reranked for r in self.results)


class Pipeline:
    """Recall `recall_k` candidates, then rerank them with `stage`: one trace per call.

    `tracer_provider` is the provider for the CHAIN and RETRIEVER spans (pass the same one the
    stage uses); None means OpenTelemetry's global provider. `trace_config` defaults to the
    stage's, so ``OPENINFERENCE_HIDE_*`` settings apply to every span of the call alike, and
    the CHAIN and RETRIEVER spans cap every value (query, ids, texts, metadata) at the stage's
    `max_content_length`, as the RERANKER span does.
    """

    def __init__(
        self,
        recall: Recall,
        stage: RerankStage,
        *,
        recall_k: int = 50,
        tracer_provider: TracerProvider | None = None,
        trace_config: TraceConfig | None = None,
    ) -> None:
        if not callable(getattr(recall, "recall", None)):
            raise TypeError(f"recall must have a recall() method, got {type(recall).__name__}")
        if isinstance(recall_k, bool) or not isinstance(recall_k, int) or recall_k < 1:
            raise ValueError(f"recall_k must be an int >= 1, got {recall_k!r}")
        self.recall = recall
        self.stage = stage
        self.recall_k = recall_k
        self.trace_config = trace_config or stage.trace_config
        self._spans = PipelineSpans(
            tracer_provider,
            trace_config=self.trace_config,
            max_content_length=stage.max_content_length,
            recall_name=self.recall_name,
            recall_k=recall_k,
        )

    def __repr__(self) -> str:
        return f"Pipeline({self.recall!r}, {self.stage!r}, recall_k={self.recall_k})"

    @property
    def recall_name(self) -> str:
        """How the recall is named on spans: its `name` attribute, else its class name."""
        name = getattr(self.recall, "name", None)
        return name if isinstance(name, str) else type(self.recall).__name__

    def run(self, query: str) -> PipelineResult:
        """Recall, then rerank; the CHAIN span covers both."""
        _check_query(query)
        with self._spans.chain(query) as span:
            with self._spans.retriever(query) as retriever_span:
                recalled = self._checked(self.recall.recall(query, self.recall_k))
                self._spans.record_documents(retriever_span, recalled)
            outcome = self.stage.run_outcome(query, recalled)
            return self._finish(span, query, recalled, outcome.outputs, outcome.fallback_cause)

    async def arun(self, query: str) -> PipelineResult:
        """Async `run`: recall runs in a worker thread, the stage with `RerankStage.arun`."""
        _check_query(query)
        with self._spans.chain(query) as span:
            with self._spans.retriever(query) as retriever_span:
                found = await asyncio.to_thread(self.recall.recall, query, self.recall_k)
                recalled = self._checked(found)
                self._spans.record_documents(retriever_span, recalled)
            outcome = await self.stage.arun_outcome(query, recalled)
            return self._finish(span, query, recalled, outcome.outputs, outcome.fallback_cause)

    def _finish(
        self,
        span: Any,
        query: str,
        recalled: list[Candidate],
        results: list[Reranked],
        fallback_cause: str | None,
    ) -> PipelineResult:
        self._spans.finish_chain(span, results, fallback_cause)
        context = span.get_span_context()
        return PipelineResult(
            query=query,
            recalled=recalled,
            results=results,
            trace_id=format(context.trace_id, "032x") if context.is_valid else None,
        )

    def _checked(self, found: Any) -> list[Candidate]:
        """Recall's output as a list of at most `recall_k` candidates, or TypeError."""
        recalled = list(found)
        for i, candidate in enumerate(recalled):
            if not isinstance(candidate, Candidate):
                raise TypeError(
                    f"{self.recall_name}.recall() returned a {type(candidate).__name__} at "
                    f"position {i}; it must return retrieval_stage.Candidate objects"
                )
        return recalled[: self.recall_k]


def _check_query(query: str) -> None:
    if not isinstance(query, str):
        raise TypeError(f"query must be a str, got {type(query).__name__}")
