"""`RetrievalStageRerank` for LangChain: a document compressor that reranks through `RerankStage`.

From a clone: ``pip install -e '.[langchain]'``. Use it as the ``base_compressor`` of
``ContextualCompressionRetriever`` (langchain-classic), or call ``compress_documents`` directly.

LangChain has no score slot on `Document`: the recall score is read from a metadata key
(`score_key`, default ``"score"``; LangChain's vector retrievers drop scores, so a retriever
that keeps them must put them there), the rerank score is written to
``metadata["relevance_score"]`` as LangChain's own rerankers do, and the recall score is kept
as ``metadata["retrieval_score"]``. The caller's documents are never changed.

OpenInference's LangChain tracer never makes its spans the current OpenTelemetry span, so a span
started inside a compressor would land in a trace of its own. The compressor's callbacks name
the run it belongs to (``parent_run_id``); when the instrumentor is on, the stage's RERANKER
span is started inside that run's span, so it sits in LangChain's trace.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from langchain_core.callbacks import BaseCallbackManager, Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from opentelemetry import trace
from opentelemetry.trace import Span
from pydantic import ConfigDict, PrivateAttr

from retrieval_stage import Candidate, Reranked
from retrieval_stage.config import RerankSettings

from ._common import RERANKED, RETRIEVAL_SCORE, Stages, candidate_id, recall_score

__all__ = ["RELEVANCE_SCORE", "RetrievalStageRerank"]

RELEVANCE_SCORE = "relevance_score"
"""Metadata key of the rerank score: the key LangChain's own rerankers write."""


class RetrievalStageRerank(BaseDocumentCompressor):
    """Rerank documents with a `RerankStage`: best first, rerank score in
    ``metadata["relevance_score"]``.

    `reranker` is any reranker of ours or an object with ``rerank(query, items, *, text,
    top_k)``; or give `settings` (a `RerankSettings`) to build the clients through
    `retrieval_stage.config`; with neither, the ``RERANK_*`` environment decides (reranking
    off when no endpoint is set). `top_k` keeps the best k. `score_key` is the metadata key
    holding the recall score; `id_key` a metadata key holding the document id (default: the
    document's own ``id``; a document with neither is named by its position).
    `stage_options` are `RerankStage`'s (``on_error``, ``min_score``, ``tracer_provider``, ...).

    After a fallback the documents come back in recall order without ``relevance_score``
    (the reranker scored nothing) and with ``metadata["reranked"]`` False.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    _stages: Stages = PrivateAttr()
    _score_key: str = PrivateAttr()
    _id_key: str | None = PrivateAttr()

    def __init__(
        self,
        reranker: Any = None,
        *,
        top_k: int | None = None,
        settings: RerankSettings | None = None,
        score_key: str = "score",
        id_key: str | None = None,
        **stage_options: Any,
    ) -> None:
        super().__init__()
        if not isinstance(score_key, str) or not score_key:
            raise TypeError(f"score_key must be a non-empty str, got {score_key!r}")
        if id_key is not None and (not isinstance(id_key, str) or not id_key):
            raise TypeError(f"id_key must be a non-empty str or None, got {id_key!r}")
        self._stages = Stages(reranker, top_k=top_k, settings=settings, stage_options=stage_options)
        self._score_key = score_key
        self._id_key = id_key

    @property
    def top_k(self) -> int | None:
        """How many documents come back at most (None: all)."""
        return self._stages.top_k

    @property
    def score_key(self) -> str:
        """The metadata key the recall score is read from."""
        return self._score_key

    @property
    def id_key(self) -> str | None:
        """The metadata key the document id is read from (None: ``Document.id``)."""
        return self._id_key

    def compress_documents(
        self,
        documents: Sequence[Document],
        query: str,
        callbacks: Callbacks | None = None,
    ) -> Sequence[Document]:
        """The documents reranked for `query`, best first (copies)."""
        candidates = self._candidates(documents)
        with _inside_run(callbacks):
            results = self._stages.sync().run(query, candidates)
        return _documents(documents, results)

    async def acompress_documents(
        self,
        documents: Sequence[Document],
        query: str,
        callbacks: Callbacks | None = None,
    ) -> Sequence[Document]:
        """Async `compress_documents`; an awaitable reranker is awaited, not threaded."""
        candidates = self._candidates(documents)
        with _inside_run(callbacks):
            results = await self._stages.asynchronous().arun(query, candidates)
        return _documents(documents, results)

    def _candidates(self, documents: Sequence[Document]) -> list[Candidate]:
        return [
            Candidate(
                id=candidate_id(
                    d.metadata.get(self._id_key) if self._id_key is not None else d.id, i
                ),
                text=d.page_content,
                score=recall_score(d.metadata.get(self._score_key)),
                metadata=dict(d.metadata),
            )
            for i, d in enumerate(documents)
        ]


def _documents(originals: Sequence[Document], results: Sequence[Reranked]) -> list[Document]:
    return [_copy(originals[r.input_index], r) for r in results]


def _copy(original: Document, result: Reranked) -> Document:
    """A deep copy of the document with the rerank score and the recall score in metadata."""
    metadata = copy.deepcopy(dict(original.metadata))
    if result.reranked:  # after a fallback there is no rerank score to write
        metadata[RELEVANCE_SCORE] = result.score
    if result.candidate.score is not None:
        metadata[RETRIEVAL_SCORE] = result.candidate.score
    metadata[RERANKED] = result.reranked
    return original.model_copy(deep=True, update={"metadata": metadata})


@contextmanager
def _inside_run(callbacks: Callbacks | None) -> Iterator[None]:
    """Make the span of the LangChain run this compressor runs in current, when there is one."""
    span = _run_span(callbacks)
    if span is None:
        yield
        return
    with trace.use_span(span, end_on_exit=False):
        yield


def _run_span(callbacks: Callbacks | None) -> Span | None:
    """The OpenInference span of the run that called the compressor: the callbacks' parent
    run (`ContextualCompressionRetriever` passes its run's child manager), else the run of the
    runnable config in effect. None when the LangChain instrumentor is not installed or not on.
    """
    try:
        from openinference.instrumentation.langchain import (
            LangChainInstrumentor,
            get_current_span,
        )
    except ImportError:
        return None
    instrumentor = LangChainInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        return None  # get_span would print a hint to stdout
    run_id = callbacks.parent_run_id if isinstance(callbacks, BaseCallbackManager) else None
    span = instrumentor.get_span(run_id) if run_id is not None else get_current_span()
    return span if span is not None and span.get_span_context().is_valid else None
