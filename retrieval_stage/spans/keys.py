"""The project's own span attribute keys, beside OpenInference's (`openinference.semconv`).

OpenInference names the reranker's query, model, top_k and documents; these name what it has no
key for: the provider, document counts, fallback, requests, retries, batches and usage. The
dashboards, the collector and the tests query them by these names, so they live in one place.
"""

from __future__ import annotations

__all__ = [
    "ATTR_BATCHES",
    "ATTR_CANCELLED",
    "ATTR_DOCUMENTS",
    "ATTR_FALLBACK",
    "ATTR_INPUT_OMITTED",
    "ATTR_OUTPUT_OMITTED",
    "ATTR_PROVIDER",
    "ATTR_RECALL",
    "ATTR_RECALL_K",
    "ATTR_REQUESTS",
    "ATTR_RETRIES",
    "ATTR_RETRIEVAL_OMITTED",
    "ATTR_TIER",
    "ATTR_TOP1_CHANGED",
    "ATTR_USAGE_SEARCH_UNITS",
    "ATTR_USAGE_TOTAL_TOKENS",
]

ATTR_PROVIDER = "retrieval_stage.provider"
ATTR_DOCUMENTS = "retrieval_stage.documents"
ATTR_FALLBACK = "retrieval_stage.fallback"
"""True on a RERANKER span whose stage returned recall order, and on the CHAIN span above it."""
ATTR_CANCELLED = "retrieval_stage.cancelled"
ATTR_TIER = "retrieval_stage.tier"
"""Which tier of a `RerankerChain` answered (0 the primary), on the RERANKER span and on the
chain's events, metric points and log lines."""
ATTR_TOP1_CHANGED = "retrieval_stage.top1_changed"
ATTR_REQUESTS = "retrieval_stage.requests"
ATTR_RETRIES = "retrieval_stage.retries"
ATTR_BATCHES = "retrieval_stage.batches"
ATTR_USAGE_TOTAL_TOKENS = "retrieval_stage.usage.total_tokens"
ATTR_USAGE_SEARCH_UNITS = "retrieval_stage.usage.search_units"
ATTR_INPUT_OMITTED = "retrieval_stage.input_documents.omitted"
ATTR_OUTPUT_OMITTED = "retrieval_stage.output_documents.omitted"

ATTR_RECALL = "retrieval_stage.recall"
"""The recall method's name (``bm25``, or the class name of a user's `Recall`)."""
ATTR_RECALL_K = "retrieval_stage.recall_k"
"""How many candidates recall was asked for."""
ATTR_RETRIEVAL_OMITTED = "retrieval_stage.retrieval_documents.omitted"
"""Recalled documents left off the RETRIEVER span because the attribute limit was reached."""
