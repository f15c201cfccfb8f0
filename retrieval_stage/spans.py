"""The RERANKER span's attributes: OpenInference keys plus the project's own namespace.

Keys come from `openinference-semantic-conventions`, never typed by hand. An OpenTelemetry SDK
span keeps a bounded number of attributes and evicts the oldest when full, which would erase
the span's kind and query first. So the identity is written at span start, and documents are
written last, only as many as fit, dropping from the tail (lowest ranked) first and recording
how many were left out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from openinference.instrumentation import TraceConfig
from openinference.semconv.trace import (
    DocumentAttributes,
    OpenInferenceSpanKindValues,
    RerankerAttributes,
    SpanAttributes,
)
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from .models import Candidate, Reranked

__all__ = [
    "ATTR_BATCHES",
    "ATTR_DOCUMENTS",
    "ATTR_FALLBACK",
    "ATTR_INPUT_OMITTED",
    "ATTR_OUTPUT_OMITTED",
    "ATTR_PROVIDER",
    "ATTR_REQUESTS",
    "ATTR_RETRIES",
    "ATTR_TOP1_CHANGED",
    "ATTR_USAGE_SEARCH_UNITS",
    "ATTR_USAGE_TOTAL_TOKENS",
    "DEFAULT_MAX_CONTENT_BYTES",
    "TRUNCATION_MARKER",
    "cap_content",
    "document_attributes",
    "identity_attributes",
]

ATTR_PROVIDER = "retrieval_stage.provider"
ATTR_DOCUMENTS = "retrieval_stage.documents"
ATTR_FALLBACK = "retrieval_stage.fallback"
ATTR_TOP1_CHANGED = "retrieval_stage.top1_changed"
ATTR_REQUESTS = "retrieval_stage.requests"
ATTR_RETRIES = "retrieval_stage.retries"
ATTR_BATCHES = "retrieval_stage.batches"
ATTR_USAGE_TOTAL_TOKENS = "retrieval_stage.usage.total_tokens"
ATTR_USAGE_SEARCH_UNITS = "retrieval_stage.usage.search_units"
ATTR_INPUT_OMITTED = "retrieval_stage.input_documents.omitted"
ATTR_OUTPUT_OMITTED = "retrieval_stage.output_documents.omitted"

DEFAULT_MAX_CONTENT_BYTES = 2000
"""Default cap on a document's content on the span: below Tempo's 2048-byte value limit."""

TRUNCATION_MARKER = "…[truncated]"
_MARKER_BYTES = len(TRUNCATION_MARKER.encode("utf-8"))

_RESERVED = 2
"""Slots kept free after the documents for the two omitted-document counts."""

_SDK_DEFAULT_LIMIT = 128

_ID = DocumentAttributes.DOCUMENT_ID
_CONTENT = DocumentAttributes.DOCUMENT_CONTENT
_SCORE = DocumentAttributes.DOCUMENT_SCORE
_METADATA = DocumentAttributes.DOCUMENT_METADATA


def identity_attributes(
    *,
    query: str,
    model_name: str | None,
    top_k: int | None,
    provider: str | None,
    documents: int,
    config: TraceConfig,
) -> dict[str, AttributeValue]:
    """What makes the span a RERANKER span: set at start, before anything can evict it."""
    attributes: dict[str, AttributeValue] = {
        SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.RERANKER.value,
    }
    masked = config.mask(RerankerAttributes.RERANKER_QUERY, query)
    if masked is not None:
        attributes[RerankerAttributes.RERANKER_QUERY] = masked
    if model_name is not None:
        attributes[RerankerAttributes.RERANKER_MODEL_NAME] = model_name
    if top_k is not None:
        attributes[RerankerAttributes.RERANKER_TOP_K] = top_k
    if provider is not None:
        attributes[ATTR_PROVIDER] = provider
    attributes[ATTR_DOCUMENTS] = documents
    return attributes


def cap_content(text: str, max_bytes: int) -> str:
    """`text` cut to at most `max_bytes` UTF-8 bytes, ending in a marker when it was cut."""
    if len(text) * 4 <= max_bytes:
        return text  # even all-4-byte characters would fit: skip encoding
    raw = text.encode("utf-8")
    if len(raw) <= max_bytes:
        return text
    head = raw[: max_bytes - _MARKER_BYTES].decode("utf-8", errors="ignore")
    return head + TRUNCATION_MARKER


def _metadata_json(metadata: Mapping[str, Any]) -> str:
    return json.dumps(dict(metadata), ensure_ascii=False, default=str, sort_keys=True)


def _document(
    prefix: str, i: int, candidate: Candidate, score: float | None, max_bytes: int
) -> dict[str, AttributeValue]:
    base = f"{prefix}.{i}."
    doc: dict[str, AttributeValue] = {
        base + _ID: candidate.id,
        base + _CONTENT: cap_content(candidate.text, max_bytes),
    }
    if score is not None:
        doc[base + _SCORE] = score
    if candidate.metadata:
        doc[base + _METADATA] = _metadata_json(candidate.metadata)
    return doc


def attribute_limit(span: Span) -> int | None:
    """The span's attribute-count limit, or None when it has none.

    SDK spans carry their `SpanLimits`; for any other implementation assume the SDK's default
    (from ``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT`` or 128), which errs on the side of keeping the
    span's identity.
    """
    limits = getattr(span, "_limits", None)
    if limits is not None and hasattr(limits, "max_span_attributes"):
        value = limits.max_span_attributes
        return value if isinstance(value, int) else None
    raw = os.environ.get("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "")
    return int(raw) if raw.isdigit() else _SDK_DEFAULT_LIMIT


def document_attributes(
    span: Span,
    candidates: Sequence[Candidate],
    outputs: Sequence[Reranked],
    *,
    config: TraceConfig,
    max_content_length: int,
) -> dict[str, AttributeValue]:
    """Input and output documents, as many as fit under the span's attribute limit.

    Inputs keep their given order and recall scores; outputs are best first with the reranker's
    scores. When both cannot fit, documents are taken alternately from the head of each list
    so both lose their tails, never their heads. ``OPENINFERENCE_HIDE_INPUTS``/``_OUTPUTS``
    (read by `config`) drop the corresponding lists entirely.
    """
    inputs: list[dict[str, AttributeValue]] = []
    if not config.hide_inputs:
        prefix = RerankerAttributes.RERANKER_INPUT_DOCUMENTS
        inputs = [
            _document(prefix, i, c, c.score, max_content_length) for i, c in enumerate(candidates)
        ]
    outs: list[dict[str, AttributeValue]] = []
    if not config.hide_outputs:
        prefix = RerankerAttributes.RERANKER_OUTPUT_DOCUMENTS
        outs = [
            _document(prefix, i, r.candidate, r.score, max_content_length)
            for i, r in enumerate(outputs)
        ]
    limit = attribute_limit(span)
    if limit is None:
        kept_in, kept_out = len(inputs), len(outs)
    else:
        used = len(getattr(span, "attributes", None) or {})
        budget = limit - used - _RESERVED
        if sum(map(len, inputs)) + sum(map(len, outs)) <= budget:
            kept_in, kept_out = len(inputs), len(outs)  # all fit: skip the alternating walk
        else:
            kept_in, kept_out = _fit(inputs, outs, budget)
    attributes: dict[str, AttributeValue] = {}
    for doc in inputs[:kept_in]:
        attributes.update(doc)
    for doc in outs[:kept_out]:
        attributes.update(doc)
    if kept_in < len(inputs):
        attributes[ATTR_INPUT_OMITTED] = len(inputs) - kept_in
    if kept_out < len(outs):
        attributes[ATTR_OUTPUT_OMITTED] = len(outs) - kept_out
    return attributes


def _fit(
    inputs: Sequence[Mapping[str, Any]], outs: Sequence[Mapping[str, Any]], budget: int
) -> tuple[int, int]:
    """How many of each list's head fit in `budget` attributes, taking them alternately."""
    kept = [0, 0]
    lists = (inputs, outs)
    open_ = [bool(inputs), bool(outs)]
    turn = 0
    while any(open_):
        if open_[turn]:
            doc = lists[turn][kept[turn]]
            if len(doc) <= budget:
                budget -= len(doc)
                kept[turn] += 1
                open_[turn] = kept[turn] < len(lists[turn])
            else:
                open_[turn] = False
        turn ^= 1
    return kept[0], kept[1]
