"""`RetrievalStageRerank` for LlamaIndex: a node postprocessor that reranks through `RerankStage`.

From a clone: ``pip install -e '.[llama-index]'``. Use it wherever LlamaIndex takes a
postprocessor (``index.as_query_engine(node_postprocessors=[RetrievalStageRerank(...)])``).

What it keeps that LlamaIndex's own rerankers lose: the recall score (``NodeWithScore.score``
on the way in) is the span's input score and comes back as ``retrieval_score`` metadata,
excluded from both the LLM and the embedding text; the caller's nodes are never changed
(deep copies come back); and the trace holds exactly one RERANKER span, the stage's, inside
LlamaIndex's own CHAIN span for the postprocessor. No ReRank events are dispatched: with
OpenInference's LlamaIndex instrumentor on, those would make the postprocessor's span a second
RERANKER span, without the recall scores.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle

from retrieval_stage import Candidate, Reranked
from retrieval_stage.config import RerankSettings

from ._common import RERANKED, RETRIEVAL_SCORE, Stages, candidate_id, recall_score

__all__ = ["RetrievalStageRerank"]

_HIDDEN = (RETRIEVAL_SCORE, RERANKED)
"""Metadata keys this adapter adds; never part of the text an LLM or an embedder sees."""


class RetrievalStageRerank(BaseNodePostprocessor):
    """Rerank nodes with a `RerankStage`: best first, rerank score in ``NodeWithScore.score``.

    `reranker` is any reranker of ours or an object with ``rerank(query, items, *, text,
    top_k)``; or give `settings` (a `RerankSettings`) to build the clients through
    `retrieval_stage.config`; with neither, the ``RERANK_*`` environment decides (reranking
    off when no endpoint is set). `top_k` keeps the best k; `stage_options` are
    `RerankStage`'s (``on_error``, ``min_score``, ``tracer_provider``, ...).

    After a fallback the nodes come back in recall order with their recall scores unchanged
    and ``metadata["reranked"]`` False.
    """

    _stages: Stages = PrivateAttr()

    def __init__(
        self,
        reranker: Any = None,
        *,
        top_k: int | None = None,
        settings: RerankSettings | None = None,
        **stage_options: Any,
    ) -> None:
        super().__init__()
        self._stages = Stages(reranker, top_k=top_k, settings=settings, stage_options=stage_options)

    @classmethod
    def class_name(cls) -> str:
        return "RetrievalStageRerank"

    @property
    def top_k(self) -> int | None:
        """How many nodes come back at most (None: all)."""
        return self._stages.top_k

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        query = _query(query_bundle)
        results = self._stages.sync().run(query, _candidates(nodes))
        return _nodes(nodes, results)

    async def _apostprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        query = _query(query_bundle)
        results = await self._stages.asynchronous().arun(query, _candidates(nodes))
        return _nodes(nodes, results)


def _query(query_bundle: QueryBundle | None) -> str:
    if query_bundle is None:
        raise ValueError("RetrievalStageRerank needs a query: pass query_str or query_bundle")
    return query_bundle.query_str


def _candidates(nodes: Sequence[NodeWithScore]) -> list[Candidate]:
    """One candidate per node: its node id, the text LlamaIndex's rerankers score (the
    embedding view), its score as the recall score, its metadata for the span."""
    return [
        Candidate(
            id=candidate_id(n.node.node_id, i),
            text=n.node.get_content(metadata_mode=MetadataMode.EMBED),
            score=recall_score(n.score),
            metadata=dict(n.node.metadata),
        )
        for i, n in enumerate(nodes)
    ]


def _nodes(originals: Sequence[NodeWithScore], results: Sequence[Reranked]) -> list[NodeWithScore]:
    return [_copy(originals[r.input_index], r) for r in results]


def _copy(original: NodeWithScore, result: Reranked) -> NodeWithScore:
    """A deep copy of the node with the rerank score, the recall score kept in metadata."""
    node = original.node
    metadata = dict(node.metadata)
    if result.candidate.score is not None:
        metadata[RETRIEVAL_SCORE] = result.candidate.score
    metadata[RERANKED] = result.reranked
    copied = node.model_copy(
        deep=True,
        update={
            "metadata": metadata,
            "excluded_llm_metadata_keys": _with_hidden(node.excluded_llm_metadata_keys),
            "excluded_embed_metadata_keys": _with_hidden(node.excluded_embed_metadata_keys),
        },
    )
    # After a fallback the slot keeps exactly what recall put there.
    score = result.score if result.reranked else original.score
    return NodeWithScore(node=copied, score=score)


def _with_hidden(keys: Sequence[str]) -> list[str]:
    return [*keys, *(k for k in _HIDDEN if k not in keys)]
