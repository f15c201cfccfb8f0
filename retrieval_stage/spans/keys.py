"""Every span attribute key and metric name of ours, beside OpenInference's semconv.

OpenInference names the reranker's query, model, top_k and documents; these name what it has no
key for: the provider, document counts, fallback, requests, retries, batches, usage and the
quality signals, the rerank server's request and batch spans, and the instruments both record.
The dashboards (grafana/), the collector's rules (telemetry/) and the tests query them by these
exact strings, so they live in one place.
"""

from __future__ import annotations

__all__ = [
    "ATTR_BATCHES",
    "ATTR_BATCH_NUMBER",
    "ATTR_BATCH_PAIRS",
    "ATTR_BATCH_REQUESTS",
    "ATTR_BATCH_TOKENS",
    "ATTR_CANCELLED",
    "ATTR_CONTENT",
    "ATTR_DOCUMENTS",
    "ATTR_ERROR_TYPE",
    "ATTR_FALLBACK",
    "ATTR_GEN_AI_OPERATION_NAME",
    "ATTR_GEN_AI_PROVIDER_NAME",
    "ATTR_GEN_AI_REQUEST_MODEL",
    "ATTR_GEN_AI_RERANK_CANDIDATE_COUNT",
    "ATTR_GEN_AI_RERANK_TOP_N",
    "ATTR_GEN_AI_RESPONSE_MODEL",
    "ATTR_INPUT_OMITTED",
    "ATTR_KENDALL_TAU",
    "ATTR_MAX_PROMOTION",
    "ATTR_MODEL",
    "ATTR_MODEL_BACKEND",
    "ATTR_MODEL_LOAD_DURATION",
    "ATTR_MODEL_PRECISION",
    "ATTR_OUTCOME",
    "ATTR_OUTPUT_OMITTED",
    "ATTR_PROVIDER",
    "ATTR_QUEUE_WAIT",
    "ATTR_RBO",
    "ATTR_RECALL",
    "ATTR_RECALL_K",
    "ATTR_REQUESTS",
    "ATTR_REQUEST_PAIRS",
    "ATTR_REQUEST_TOKENS",
    "ATTR_RETRIES",
    "ATTR_RETRIEVAL_OMITTED",
    "ATTR_SCORE_MARGIN",
    "ATTR_SCORE_SPREAD",
    "ATTR_SERVER_ADDRESS",
    "ATTR_SERVER_BATCHES",
    "ATTR_SERVER_PORT",
    "ATTR_SERVER_RERANKER",
    "ATTR_SERVER_TOKENS",
    "ATTR_SHAPE",
    "ATTR_TIER",
    "ATTR_TOP1_CHANGED",
    "ATTR_TOPK_OVERLAP",
    "ATTR_TOP_SCORE",
    "ATTR_USAGE_SEARCH_UNITS",
    "ATTR_USAGE_TOTAL_TOKENS",
    "EVENT_MODEL_LOAD",
    "METER_NAME",
    "METRIC_BATCHES",
    "METRIC_BREAKER_OPENINGS",
    "METRIC_DOCUMENTS",
    "METRIC_DURATION",
    "METRIC_FALLBACKS",
    "METRIC_GEN_AI_CLIENT_OPERATION_DURATION",
    "METRIC_KENDALL_TAU",
    "METRIC_KENDALL_TAU_DEPRECATED",
    "METRIC_MAX_PROMOTION",
    "METRIC_RBO",
    "METRIC_REQUESTS",
    "METRIC_RETRIES",
    "METRIC_SCORE_MARGIN",
    "METRIC_SCORE_SPREAD",
    "METRIC_SERVER_BATCH_SIZE",
    "METRIC_SERVER_BATCH_TOKENS",
    "METRIC_SERVER_QUEUE_DEPTH",
    "METRIC_SERVER_REQUEST_DURATION",
    "METRIC_TIER_CALLS",
    "METRIC_TOP1_CHANGES",
    "METRIC_TOPK_OVERLAP",
    "METRIC_TOP_SCORE",
    "SERVER_METER_NAME",
]

# The RERANKER span (and the stage's and the chain's metric points).
ATTR_PROVIDER = "retrieval_stage.provider"
ATTR_MODEL = "retrieval_stage.model"
"""The configured model on metric points; the served model on the server's spans."""
ATTR_DOCUMENTS = "retrieval_stage.documents"
ATTR_CONTENT = "retrieval_stage.content"
"""On the server's RERANKER span without ``--trace-content``: that the query and the texts
are not recorded, and how to record them (an empty Input box reads as a failure otherwise)."""
ATTR_FALLBACK = "retrieval_stage.fallback"
"""True on a RERANKER span whose stage returned recall order, and on the CHAIN span above it."""
ATTR_CANCELLED = "retrieval_stage.cancelled"
ATTR_TIER = "retrieval_stage.tier"
"""Which tier of a `RerankerChain` answered (0 the primary), on the RERANKER span and on the
chain's events, metric points and log lines."""
ATTR_OUTCOME = "retrieval_stage.outcome"
"""How a call (or a tier's call, or a server's model batch) went, on metric points."""
ATTR_TOP1_CHANGED = "retrieval_stage.top1_changed"
ATTR_REQUESTS = "retrieval_stage.requests"
ATTR_RETRIES = "retrieval_stage.retries"
ATTR_BATCHES = "retrieval_stage.batches"
ATTR_USAGE_TOTAL_TOKENS = "retrieval_stage.usage.total_tokens"
ATTR_USAGE_SEARCH_UNITS = "retrieval_stage.usage.search_units"
ATTR_INPUT_OMITTED = "retrieval_stage.input_documents.omitted"
ATTR_OUTPUT_OMITTED = "retrieval_stage.output_documents.omitted"

# OpenTelemetry's GenAI conventions, written beside OpenInference's only under
# ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`` (`spans.genai`). The general
# GenAI names are OpenTelemetry's (semantic-conventions-genai; ``gen_ai.provider.name``
# replaced ``gen_ai.system``), experimental; the ``gen_ai.rerank.*`` ones and the operation
# name ``rerank`` are the open proposal semantic-conventions-genai#253. ``server.*`` and
# ``error.type`` are stable OpenTelemetry names. Typed here rather than imported: the
# ``opentelemetry-semantic-conventions`` package marks its GenAI constants as moved, and has
# none for rerank.
ATTR_GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
ATTR_GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
ATTR_GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
ATTR_GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
ATTR_GEN_AI_RERANK_CANDIDATE_COUNT = "gen_ai.rerank.candidate.count"
ATTR_GEN_AI_RERANK_TOP_N = "gen_ai.rerank.top_n"
ATTR_SERVER_ADDRESS = "server.address"
ATTR_SERVER_PORT = "server.port"
ATTR_ERROR_TYPE = "error.type"
"""On a failed call's RERANKER span (the exception's class name; with the GenAI opt-in an HTTP
error's status code, or the class's qualified name) and, with the opt-in, its duration point."""

# The label-free quality signals (`retrieval_stage.quality`), on the RERANKER span.
ATTR_KENDALL_TAU = "retrieval_stage.quality.kendall_tau"
ATTR_TOPK_OVERLAP = "retrieval_stage.quality.topk_overlap"
ATTR_MAX_PROMOTION = "retrieval_stage.quality.max_promotion"
ATTR_TOP_SCORE = "retrieval_stage.quality.top_score"
ATTR_SCORE_MARGIN = "retrieval_stage.quality.score_margin"
ATTR_RBO = "retrieval_stage.quality.rbo"
"""Rank-biased overlap (RBO_ext, p = 0.9) of recall's top k and the reranker's top k."""
ATTR_SCORE_SPREAD = "retrieval_stage.quality.score_spread"
"""The best minus the worst of the reranker's top-k scores."""

# The event an in-process model's first call records on the current span (`retrieval_stage.local`):
# that call's time includes loading the model, which the event's duration says.
EVENT_MODEL_LOAD = "retrieval_stage.model.load"
ATTR_MODEL_LOAD_DURATION = "retrieval_stage.model.load.duration_s"
"""Seconds the model took to load (wall time), on the `EVENT_MODEL_LOAD` event."""
ATTR_MODEL_BACKEND = "retrieval_stage.model.backend"
"""What runs the model: ``numpy`` or ``sentence-transformers``, on the `EVENT_MODEL_LOAD` event."""
ATTR_MODEL_PRECISION = "retrieval_stage.model.precision"
"""The precision the embedding model ran in (``fp32``, ``int8``), on the RERANKER span of an
in-process `EmbeddingReranker` and on the server's ``rerank.batch`` spans."""

# The RETRIEVER span.
ATTR_RECALL = "retrieval_stage.recall"
"""The recall method's name (``bm25``, or the class name of a user's `Recall`)."""
ATTR_RECALL_K = "retrieval_stage.recall_k"
"""How many candidates recall was asked for."""
ATTR_RETRIEVAL_OMITTED = "retrieval_stage.retrieval_documents.omitted"
"""Recalled documents left off the RETRIEVER span because the attribute limit was reached."""

# The rerank server's SERVER span (one per ``POST /rerank``) and its request metric.
ATTR_SHAPE = "retrieval_stage.shape"
"""The request body's shape: ``tei``, ``sidecar``, or ``unknown`` when it was refused first."""
ATTR_SERVER_TOKENS = "retrieval_stage.server.tokens"
ATTR_SERVER_BATCHES = "retrieval_stage.server.batches"

# The rerank server's ``rerank.batch`` spans (one per request per model batch).
ATTR_SERVER_RERANKER = "retrieval_stage.server.reranker"
ATTR_BATCH_NUMBER = "retrieval_stage.batch.number"
ATTR_BATCH_PAIRS = "retrieval_stage.batch.pairs"
ATTR_BATCH_TOKENS = "retrieval_stage.batch.tokens"
ATTR_BATCH_REQUESTS = "retrieval_stage.batch.requests"
ATTR_REQUEST_PAIRS = "retrieval_stage.batch.request_pairs"
ATTR_REQUEST_TOKENS = "retrieval_stage.batch.request_tokens"
ATTR_QUEUE_WAIT = "retrieval_stage.batch.queue_wait_s"

# Metric instruments of the stage and the chain (`retrieval_stage.metrics`). The collector's
# Prometheus exporter turns them into ``retrieval_stage_rerank_duration_seconds_*`` and so on.
METER_NAME = "retrieval_stage"
METRIC_DURATION = "retrieval_stage.rerank.duration"
METRIC_DOCUMENTS = "retrieval_stage.rerank.documents"
METRIC_BATCHES = "retrieval_stage.rerank.batches"
METRIC_REQUESTS = "retrieval_stage.rerank.requests"
METRIC_RETRIES = "retrieval_stage.rerank.retries"
METRIC_FALLBACKS = "retrieval_stage.rerank.fallbacks"
METRIC_TOP1_CHANGES = "retrieval_stage.rerank.top1_changes"
METRIC_KENDALL_TAU = "retrieval_stage.rerank.kendall_tau_normalized"
"""(1 + tau) / 2, in [0, 1]: OpenTelemetry histograms take no negative values."""
METRIC_KENDALL_TAU_DEPRECATED = "retrieval_stage.rerank.kendall_tau"
"""The same points under the name used before issue 39; deprecated, removed in the next release."""
METRIC_TOPK_OVERLAP = "retrieval_stage.rerank.topk_overlap"
METRIC_MAX_PROMOTION = "retrieval_stage.rerank.max_promotion"
METRIC_TOP_SCORE = "retrieval_stage.rerank.top_score"
METRIC_SCORE_MARGIN = "retrieval_stage.rerank.score_margin"
METRIC_RBO = "retrieval_stage.rerank.rbo"
METRIC_SCORE_SPREAD = "retrieval_stage.rerank.score_spread"
METRIC_GEN_AI_CLIENT_OPERATION_DURATION = "gen_ai.client.operation.duration"
"""OpenTelemetry's GenAI client duration histogram, recorded only with the GenAI opt-in."""
METRIC_TIER_CALLS = "retrieval_stage.rerank.tier.calls"
METRIC_BREAKER_OPENINGS = "retrieval_stage.rerank.breaker.openings"

# Metric instruments of the rerank server (`retrieval_stage.server.telemetry`).
SERVER_METER_NAME = "retrieval_stage.server"
METRIC_SERVER_REQUEST_DURATION = "retrieval_stage.server.request.duration"
METRIC_SERVER_BATCH_SIZE = "retrieval_stage.server.batch.size"
METRIC_SERVER_BATCH_TOKENS = "retrieval_stage.server.batch.tokens"
METRIC_SERVER_QUEUE_DEPTH = "retrieval_stage.server.queue.depth"
