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
    "ATTR_CANCELLED",
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
    "attribute_limit",
    "cap_content",
    "document_attributes",
    "fit_stats",
    "identity_attributes",
    "metadata_json",
]

ATTR_PROVIDER = "retrieval_stage.provider"
ATTR_DOCUMENTS = "retrieval_stage.documents"
ATTR_FALLBACK = "retrieval_stage.fallback"
ATTR_CANCELLED = "retrieval_stage.cancelled"
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
    max_bytes: int = DEFAULT_MAX_CONTENT_BYTES,
) -> dict[str, AttributeValue]:
    """What makes the span a RERANKER span: set at start, before anything can evict it."""
    attributes: dict[str, AttributeValue] = {
        SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.RERANKER.value,
    }
    masked = config.mask(RerankerAttributes.RERANKER_QUERY, cap_content(query, max_bytes))
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
    """`text` cut to at most `max_bytes` UTF-8 bytes, ending in a marker when it was cut.

    Never splits a character, and replaces what UTF-8 cannot encode (a lone surrogate), which
    would otherwise make the exporter drop the whole batch of spans.
    """
    if text.isascii():  # one byte per character: no encoding needed
        if len(text) <= max_bytes:
            return text
        return text[: max_bytes - _MARKER_BYTES] + TRUNCATION_MARKER
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        raw = text.encode("utf-8", errors="replace")
        text = raw.decode("utf-8")
    if len(raw) <= max_bytes:
        return text
    head = raw[: max_bytes - _MARKER_BYTES].decode("utf-8", errors="ignore")
    return head + TRUNCATION_MARKER


def metadata_json(metadata: Mapping[str, Any], max_bytes: int) -> str:
    """`metadata` as a JSON object string (Phoenix parses it), whatever the mapping holds.

    Keys that are not strings are stringified, values JSON cannot hold are shown by `str`,
    NaN and infinities (not JSON) by `repr`; past `max_bytes` the text is kept, cut, under
    ``"_truncated"`` so it stays valid JSON.
    """
    plain = {str(key): value for key, value in metadata.items()}
    try:
        text = json.dumps(plain, ensure_ascii=False, default=str, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):
        text = json.dumps({"_repr": repr(plain)}, ensure_ascii=False)
    if len(text) <= max_bytes // 4 or len(text.encode("utf-8", errors="replace")) <= max_bytes:
        return cap_content(text, max_bytes)
    return json.dumps({"_truncated": cap_content(text, max_bytes // 2)}, ensure_ascii=False)


def _document(
    prefix: str, i: int, candidate: Candidate, score: float | None, max_bytes: int
) -> dict[str, AttributeValue]:
    base = f"{prefix}.{i}."
    doc: dict[str, AttributeValue] = {
        base + _ID: cap_content(candidate.id, max_bytes),
        base + _CONTENT: cap_content(candidate.text, max_bytes),
    }
    if score is not None:
        doc[base + _SCORE] = score
    if candidate.metadata:
        doc[base + _METADATA] = metadata_json(candidate.metadata, max_bytes)
    return doc


def fit_stats(span: Span, stats: Mapping[str, AttributeValue]) -> dict[str, AttributeValue]:
    """The head of `stats` that fits under the span's attribute limit (they come first)."""
    room = _room(span)
    if room is None:
        return dict(stats)
    return dict(list(stats.items())[: max(room - _RESERVED, 0)])


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
    room = _room(span)
    if room is None:
        kept_in, kept_out = len(inputs), len(outs)
    else:
        kept_in, kept_out = _fit(inputs, outs, room - _RESERVED)
    attributes: dict[str, AttributeValue] = {}
    for doc in inputs[:kept_in]:
        attributes.update(doc)
    for doc in outs[:kept_out]:
        attributes.update(doc)
    omitted = {ATTR_INPUT_OMITTED: len(inputs) - kept_in, ATTR_OUTPUT_OMITTED: len(outs) - kept_out}
    for key, count in omitted.items():
        if count and (room is None or len(attributes) < room):
            attributes[key] = count
    return attributes


def _room(span: Span) -> int | None:
    """Attributes the span can still take before the SDK starts evicting; None: no limit."""
    limit = attribute_limit(span)
    if limit is None:
        return None
    return max(limit - len(getattr(span, "attributes", None) or {}), 0)


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
