"""Adapters that put `RerankStage` where users already rerank: LlamaIndex, LangChain, Haystack.

Each framework is imported only by its own module, behind its own extra (installed from a
clone; each brings the framework's OpenInference instrumentor too):

``retrieval_stage.integrations.llama_index``  ``pip install -e '.[llama-index]'``
``retrieval_stage.integrations.langchain``    ``pip install -e '.[langchain]'``
``retrieval_stage.integrations.haystack``     ``pip install -e '.[haystack]'``

Every adapter is called ``RetrievalStageRerank`` and built the same way,
``RetrievalStageRerank(reranker=None, *, top_k=None, settings=None, **stage_options)``. It turns
the framework's documents into `Candidate`s (the framework's id as the candidate id, its score
slot as the recall score), hands them to `RerankStage` (the one call path: validation, fallback,
the RERANKER span), and turns the results back into copies of the caller's documents: rerank
score in the framework's score slot, recall score kept as ``retrieval_score`` metadata, and
``reranked`` saying whether the order is the reranker's or recall's (after a fallback).
"""

from __future__ import annotations

__all__: list[str] = []
