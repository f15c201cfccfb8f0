"""The RERANKER span's attributes: OpenInference keys plus the project's own namespace.

Keys come from `openinference-semantic-conventions`, never typed by hand. An OpenTelemetry SDK
span keeps a bounded number of attributes and evicts the oldest when full, which would erase
the span's kind and query first. So the identity is written at span start, and everything else
is written last, in one call, only as much as fits: the outcome first, then documents, dropping
from the tail (lowest ranked) first and recording how many were left out.

Document keys are precomputed once per process (up to `KEY_CACHE_BOUND` positions) and each
candidate's capped id, content and metadata are computed once even when the candidate appears
both as an input and as an output document.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from openinference.instrumentation import TraceConfig, get_attributes_from_context
from openinference.semconv.trace import (
    DocumentAttributes,
    OpenInferenceMimeTypeValues,
    OpenInferenceSpanKindValues,
    RerankerAttributes,
    SpanAttributes,
)
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from . import _otel_private
from ._log import get_logger
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
    "FALLBACK_STATUS_PREFIX",
    "KEY_CACHE_BOUND",
    "OUTPUT_CONTENT_ENV",
    "TRUNCATION_MARKER",
    "attribute_limit",
    "cap_content",
    "context_attributes",
    "document_attributes",
    "fallback_description",
    "fit_head",
    "fit_stats",
    "identity_attributes",
    "metadata_json",
    "outcome_attributes",
    "output_content_from_env",
    "output_value",
]

log = get_logger("retrieval_stage.spans")

ATTR_PROVIDER = "retrieval_stage.provider"
ATTR_DOCUMENTS = "retrieval_stage.documents"
ATTR_FALLBACK = "retrieval_stage.fallback"
"""True on a RERANKER span whose stage returned recall order, and on the CHAIN span above it."""
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

FALLBACK_STATUS_PREFIX = "fell back to recall order: "
"""How the status description of a span whose rerank fell back begins."""

OUTPUT_CONTENT_ENV = "RETRIEVAL_STAGE_OUTPUT_CONTENT"
"""``0``/``false``/``no``/``off``: output documents carry id and score only (see `RerankStage`)."""

KEY_CACHE_BOUND = 1024
"""Document positions whose attribute keys are precomputed; later ones are built per call."""

_RESERVED = 2
"""Slots kept free after the documents for the two omitted-document counts."""

_ID = DocumentAttributes.DOCUMENT_ID
_CONTENT = DocumentAttributes.DOCUMENT_CONTENT
_SCORE = DocumentAttributes.DOCUMENT_SCORE
_METADATA = DocumentAttributes.DOCUMENT_METADATA
_TEXT = OpenInferenceMimeTypeValues.TEXT.value
_JSON = OpenInferenceMimeTypeValues.JSON.value
_COMPACT = (",", ":")

_Keys = tuple[str, str, str, str]
"""(id, content, score, metadata) keys of one document position."""


class _KeyTable:
    """Flattened document keys per position, built once per process up to `KEY_CACHE_BOUND`.

    The table is replaced whole, never appended to, so concurrent callers can only ever see a
    complete, correct table: a key can never be paired with the wrong position.
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.keys: tuple[_Keys, ...] = ()

    def build(self, i: int) -> _Keys:
        base = f"{self.prefix}.{i}."
        return (base + _ID, base + _CONTENT, base + _SCORE, base + _METADATA)

    def upto(self, n: int) -> tuple[_Keys, ...]:
        """At least the first min(n, bound) positions' keys."""
        keys = self.keys
        if len(keys) < n and len(keys) < KEY_CACHE_BOUND:
            size = min(max(n, 2 * len(keys), 64), KEY_CACHE_BOUND)
            keys = tuple(self.build(i) for i in range(size))
            self.keys = keys
        return keys


_INPUT_KEYS = _KeyTable(RerankerAttributes.RERANKER_INPUT_DOCUMENTS)
_OUTPUT_KEYS = _KeyTable(RerankerAttributes.RERANKER_OUTPUT_DOCUMENTS)


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
    """What makes the span a RERANKER span: set at start, before anything can evict it.

    The query goes on the span twice: as ``reranker.query`` (Phoenix's reranker view) and as
    ``input.value`` (what Phoenix's span list shows), masked alike by ``OPENINFERENCE_HIDE_INPUTS``.
    """
    attributes: dict[str, AttributeValue] = {
        SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.RERANKER.value,
    }
    capped = cap_content(query, max_bytes)
    masked = config.mask(RerankerAttributes.RERANKER_QUERY, capped)
    if masked is not None:
        attributes[RerankerAttributes.RERANKER_QUERY] = masked
    if model_name is not None:
        attributes[RerankerAttributes.RERANKER_MODEL_NAME] = model_name
    if top_k is not None:
        attributes[RerankerAttributes.RERANKER_TOP_K] = top_k
    if provider is not None:
        attributes[ATTR_PROVIDER] = provider
    attributes[ATTR_DOCUMENTS] = documents
    value = config.mask(SpanAttributes.INPUT_VALUE, capped)
    if value is not None:
        attributes[SpanAttributes.INPUT_VALUE] = value
    mime_type = config.mask(SpanAttributes.INPUT_MIME_TYPE, _TEXT)
    if mime_type is not None:
        attributes[SpanAttributes.INPUT_MIME_TYPE] = mime_type
    return attributes


def context_attributes() -> dict[str, AttributeValue]:
    """OpenInference's context attributes (`using_session`, `using_user`, `using_metadata`,
    `using_tags`, `using_attributes`) attached to the current OpenTelemetry context."""
    return dict(get_attributes_from_context())


def fallback_description(exc: BaseException, max_bytes: int = DEFAULT_MAX_CONTENT_BYTES) -> str:
    """The status description of a span whose rerank fell back: what happened, then why."""
    return cap_content(f"{FALLBACK_STATUS_PREFIX}{type(exc).__name__}: {exc}", max_bytes)


def output_content_from_env() -> bool:
    """Whether output documents carry their content, from `OUTPUT_CONTENT_ENV` (default yes).

    An unparseable value is logged once per call site's stage and the default kept, as
    OpenInference's `TraceConfig` does with its own variables.
    """
    raw = os.environ.get(OUTPUT_CONTENT_ENV, "").strip().lower()
    if raw in ("", "1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    log.warning("rerank.config_invalid", variable=OUTPUT_CONTENT_ENV, value=raw, kept=True)
    return True


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


def _capped(text: str, max_bytes: int) -> str:
    """`cap_content` with its common case (short ASCII, returned as is) inlined."""
    if len(text) <= max_bytes and text.isascii():
        return text
    return cap_content(text, max_bytes)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=_COMPACT)


def output_value(outputs: Sequence[Reranked], *, fell_back: bool, max_bytes: int) -> str:
    """The stage's output as compact JSON for ``output.value`` (Phoenix's span list shows it).

    ``{"documents":[{"id":"b","score":0.97},…]}`` best first; on a fallback the reranker gave
    no scores, so ``{"order":"recall","documents":[{"id":"a"},…]}``. Longer than `max_bytes`
    (UTF-8), the tail is left off and ``"omitted":N`` says how many, so it stays valid JSON.
    """
    documents: list[dict[str, Any]]
    if fell_back:
        documents = [{"id": _capped(r.candidate.id, max_bytes)} for r in outputs]
        head = '{"order":"recall","documents":'
    else:
        documents = [{"id": _capped(r.candidate.id, max_bytes), "score": r.score} for r in outputs]
        head = '{"documents":'
    # One json.dumps over the list (a third of the cost of one per document); the entries are
    # encoded one by one only when the whole does not fit and its tail must be cut.
    text = head + _json(documents) + "}"
    if len(text) <= max_bytes // 4 or len(text.encode("utf-8", errors="replace")) <= max_bytes:
        return text
    head += "["
    entries = [_json(document) for document in documents]
    tail = f'],"omitted":{len(entries)}}}'  # the longest the closing part can be
    budget = max_bytes - len(head.encode()) - len(tail.encode())
    kept = 0
    for entry in entries:
        size = len(entry.encode("utf-8", errors="replace")) + (1 if kept else 0)
        if size > budget:
            break
        budget -= size
        kept += 1
    text = head + ",".join(entries[:kept]) + f'],"omitted":{len(entries) - kept}}}'
    return text


def fit_head(span: Span, attributes: Mapping[str, AttributeValue]) -> dict[str, AttributeValue]:
    """The head of `attributes` that fits under the span's attribute limit without evicting."""
    room = _room(span)
    if room is None or len(attributes) <= room:
        return dict(attributes)
    return dict(list(attributes.items())[:room])


def fit_stats(span: Span, stats: Mapping[str, AttributeValue]) -> dict[str, AttributeValue]:
    """The head of `stats` that fits under the span's attribute limit, leaving room for the
    omitted-document counts."""
    room = _room(span)
    if room is None:
        return dict(stats)
    return dict(list(stats.items())[: max(room - _RESERVED, 0)])


def attribute_limit(span: Span) -> int | None:
    """The span's attribute-count limit, or None when it has none (see `_otel_private`)."""
    return _otel_private.attribute_limit(span)


def outcome_attributes(
    span: Span,
    stats: Mapping[str, AttributeValue],
    candidates: Sequence[Candidate],
    outputs: Sequence[Reranked],
    *,
    config: TraceConfig,
    max_content_length: int,
    output_content: bool = True,
) -> dict[str, AttributeValue]:
    """Everything the span gets at the end of a call, for ONE ``set_attributes``: the head of
    `stats` that fits, then the documents that fit after it (see `document_attributes`)."""
    room = _room(span)
    if room is None:
        attributes = dict(stats)
        _documents(
            attributes, None, candidates, outputs, config, max_content_length, output_content
        )
        return attributes
    attributes = dict(list(stats.items())[: max(room - _RESERVED, 0)])
    existing = getattr(span, "attributes", None) or {}
    used = sum(1 for key in attributes if key not in existing)
    _documents(
        attributes, room - used, candidates, outputs, config, max_content_length, output_content
    )
    return attributes


def document_attributes(
    span: Span,
    candidates: Sequence[Candidate],
    outputs: Sequence[Reranked],
    *,
    config: TraceConfig,
    max_content_length: int,
    output_content: bool = True,
) -> dict[str, AttributeValue]:
    """Input and output documents, as many as fit under the span's attribute limit.

    Inputs keep their given order and recall scores; outputs are best first with the reranker's
    scores. When both cannot fit, documents are taken alternately from the head of each list
    so both lose their tails, never their heads. ``OPENINFERENCE_HIDE_INPUTS``/``_OUTPUTS``
    (read by `config`) drop the corresponding lists entirely. With `output_content` False an
    output document is its id and score only (the input documents carry the text).
    """
    attributes: dict[str, AttributeValue] = {}
    _documents(
        attributes, _room(span), candidates, outputs, config, max_content_length, output_content
    )
    return attributes


def _documents(
    attributes: dict[str, AttributeValue],
    room: int | None,
    candidates: Sequence[Candidate],
    outputs: Sequence[Reranked],
    config: TraceConfig,
    max_bytes: int,
    output_content: bool,
) -> None:
    """Add the documents that fit in `room` more attributes (None: no limit) to `attributes`."""
    n_in = 0 if config.hide_inputs else len(candidates)
    n_out = 0 if config.hide_outputs else len(outputs)
    if room is None or 4 * (n_in + n_out) <= room - _RESERVED:
        kept_in, kept_out = n_in, n_out  # fits whatever each document holds
    else:
        sizes_in = [2 + (c.score is not None) + (1 if c.metadata else 0) for c in candidates[:n_in]]
        sizes_out = [
            1
            + (r.score is not None)
            + ((2 if r.candidate.metadata else 1) if output_content else 0)
            for r in outputs[:n_out]
        ]
        kept_in, kept_out = _fit(sizes_in, sizes_out, room - _RESERVED)
    start = len(attributes)
    # (capped id, capped content, metadata JSON or None) per input position, computed once.
    parts: list[tuple[str, str, str | None] | None] = [None] * len(candidates)
    keys = _INPUT_KEYS.upto(kept_in)
    for i in range(kept_in):
        c = candidates[i]
        k = keys[i] if i < len(keys) else _INPUT_KEYS.build(i)
        cid = _capped(c.id, max_bytes)
        text = _capped(c.text, max_bytes)
        attributes[k[0]] = cid
        attributes[k[1]] = text
        if c.score is not None:
            attributes[k[2]] = c.score
        meta = metadata_json(c.metadata, max_bytes) if c.metadata else None
        if meta is not None:
            attributes[k[3]] = meta
        parts[i] = (cid, text, meta)
    keys = _OUTPUT_KEYS.upto(kept_out)
    for j in range(kept_out):
        r = outputs[j]
        c = r.candidate
        k = keys[j] if j < len(keys) else _OUTPUT_KEYS.build(j)
        i = r.input_index
        part = parts[i] if 0 <= i < len(parts) and candidates[i] is c else None
        attributes[k[0]] = part[0] if part is not None else _capped(c.id, max_bytes)
        if output_content:
            attributes[k[1]] = part[1] if part is not None else _capped(c.text, max_bytes)
        if r.score is not None:
            attributes[k[2]] = r.score
        if output_content and c.metadata:
            meta = part[2] if part is not None else metadata_json(c.metadata, max_bytes)
            if meta is not None:
                attributes[k[3]] = meta
    documents = len(attributes) - start
    for key, count in (
        (ATTR_INPUT_OMITTED, n_in - kept_in),
        (ATTR_OUTPUT_OMITTED, n_out - kept_out),
    ):
        if count and (room is None or documents < room):
            attributes[key] = count
            documents += 1


def _room(span: Span) -> int | None:
    """Attributes the span can still take before the SDK starts evicting; None: no limit."""
    limit = attribute_limit(span)
    if limit is None:
        return None
    return max(limit - len(getattr(span, "attributes", None) or {}), 0)


def _fit(sizes_in: Sequence[int], sizes_out: Sequence[int], budget: int) -> tuple[int, int]:
    """How many of each list's head fit in `budget` attributes, taking them alternately."""
    kept = [0, 0]
    lists = (sizes_in, sizes_out)
    open_ = [bool(sizes_in), bool(sizes_out)]
    turn = 0
    while any(open_):
        if open_[turn]:
            size = lists[turn][kept[turn]]
            if size <= budget:
                budget -= size
                kept[turn] += 1
                open_[turn] = kept[turn] < len(lists[turn])
            else:
                open_[turn] = False
        turn ^= 1
    return kept[0], kept[1]
