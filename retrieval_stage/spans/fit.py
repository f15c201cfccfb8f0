"""What fits on a span: attributes placed under the SDK's attribute-count limit, never evicting.

An OpenTelemetry SDK span keeps a bounded number of attributes and evicts the OLDEST when full,
which would erase the span's kind and query first. So a span's identity is written at start and
everything else last, in one call, only as much as fits: the outcome first, then documents,
dropping from the tail (lowest ranked) first and recording how many were left out.

Document keys are precomputed once per process (up to `KEY_CACHE_BOUND` positions); ids and
texts are capped inline, and a candidate's metadata JSON is computed once even when the
candidate appears both as an input and as an output document.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import repeat
from operator import attrgetter, is_

from openinference.instrumentation import TraceConfig
from openinference.semconv.trace import DocumentAttributes, RerankerAttributes
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from ..models import Candidate, Reranked
from . import otel_private
from .content import cap_content, metadata_json
from .keys import ATTR_INPUT_OMITTED, ATTR_OUTPUT_OMITTED

__all__ = ["KEY_CACHE_BOUND", "fit_head", "outcome_attributes", "room"]

KEY_CACHE_BOUND = 1024
"""Document positions whose attribute keys are precomputed; later ones are built per call."""

_RESERVED = 2
"""Slots kept free after the documents for the two omitted-document counts."""

_ID = DocumentAttributes.DOCUMENT_ID
_CONTENT = DocumentAttributes.DOCUMENT_CONTENT
_SCORE = DocumentAttributes.DOCUMENT_SCORE
_METADATA = DocumentAttributes.DOCUMENT_METADATA

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


_CANDIDATE = attrgetter("candidate")
_SCORE_OF = attrgetter("score")
_METADATA_OF = attrgetter("metadata")


def fit_head(span: Span, attributes: Mapping[str, AttributeValue]) -> dict[str, AttributeValue]:
    """The head of `attributes` that fits under the span's attribute limit without evicting."""
    space = room(span)
    if space is None or len(attributes) <= space:
        return dict(attributes)
    return dict(list(attributes.items())[:space])


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
    `stats` that fits, then the input and output documents that fit after it.

    Inputs keep their given order and recall scores; outputs are best first with the reranker's
    scores. When both cannot fit, documents are taken alternately from the head of each list
    so both lose their tails, never their heads. ``OPENINFERENCE_HIDE_INPUTS``/``_OUTPUTS``
    (read by `config`) drop the corresponding lists entirely. With `output_content` False an
    output document is its id and score only (the input documents carry the text).

    Every document value is built here as a str (capped text, metadata JSON) or taken from a
    checked number (a Candidate's recall score, a mapped rerank score), under our own keys:
    when `stats` is plain (`otel_private.plain_attributes`), so is the whole result."""
    space = room(span)
    if space is None:
        attributes = dict(stats)
        _documents(
            attributes, None, candidates, outputs, config, max_content_length, output_content
        )
        return attributes
    attributes = dict(list(stats.items())[: max(space - _RESERVED, 0)])
    # Keys already on the span take no new room: looked up in the SDK's own dict, at C speed.
    existing = otel_private.span_attributes(span)
    used = len(attributes) - sum(map(existing.__contains__, attributes))
    _documents(
        attributes, space - used, candidates, outputs, config, max_content_length, output_content
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
    """Add the documents that fit in `room` more attributes (None: no limit) to `attributes`.

    Ids and texts are capped inline (`capped`'s test, then `cap_content` only for a long or
    non-ASCII one): at ~200 per call the function calls alone were a tenth of the span's cost
    (issue 26). A capped id or text is the same wherever it is computed, so an output document
    caps its own; only metadata JSON, which is dear, is computed once per input position.
    """
    n_in = 0 if config.hide_inputs else len(candidates)
    n_out = 0 if config.hide_outputs else len(outputs)
    if room is None or 4 * (n_in + n_out) <= room - _RESERVED:
        kept_in, kept_out = n_in, n_out  # fits whatever each document holds
    else:
        kept_in, kept_out = _kept(
            candidates, outputs, n_in, n_out, room - _RESERVED, output_content
        )
    start = len(attributes)
    # Metadata JSON per input position (None: none), kept for the outputs among them.
    metas: list[str | None] | None = None
    keys = _INPUT_KEYS.upto(kept_in)
    for i in range(kept_in):
        c = candidates[i]
        k = keys[i] if i < len(keys) else _INPUT_KEYS.build(i)
        text = c.id
        attributes[k[0]] = (
            text if len(text) <= max_bytes and text.isascii() else cap_content(text, max_bytes)
        )
        text = c.text
        attributes[k[1]] = (
            text if len(text) <= max_bytes and text.isascii() else cap_content(text, max_bytes)
        )
        if c.score is not None:
            attributes[k[2]] = c.score
        if c.metadata:
            if metas is None:
                metas = [None] * len(candidates)
            attributes[k[3]] = metas[i] = metadata_json(c.metadata, max_bytes)
    keys = _OUTPUT_KEYS.upto(kept_out)
    for j in range(kept_out):
        r = outputs[j]
        c = r.candidate
        k = keys[j] if j < len(keys) else _OUTPUT_KEYS.build(j)
        text = c.id
        attributes[k[0]] = (
            text if len(text) <= max_bytes and text.isascii() else cap_content(text, max_bytes)
        )
        if output_content:
            text = c.text
            attributes[k[1]] = (
                text if len(text) <= max_bytes and text.isascii() else cap_content(text, max_bytes)
            )
        if r.score is not None:
            attributes[k[2]] = r.score
        if output_content and c.metadata:
            i = r.input_index
            meta = (
                metas[i]
                if metas is not None and 0 <= i < len(metas) and candidates[i] is c
                else None
            )
            attributes[k[3]] = meta if meta is not None else metadata_json(c.metadata, max_bytes)
    documents = len(attributes) - start
    for key, count in (
        (ATTR_INPUT_OMITTED, n_in - kept_in),
        (ATTR_OUTPUT_OMITTED, n_out - kept_out),
    ):
        if count and (room is None or documents < room):
            attributes[key] = count
            documents += 1


def _kept(
    candidates: Sequence[Candidate],
    outputs: Sequence[Reranked],
    n_in: int,
    n_out: int,
    budget: int,
    output_content: bool,
) -> tuple[int, int]:
    """How many input and output documents fit in `budget` attributes (`_fit` of their sizes).

    When no document has metadata, every output a score and the inputs all or none a recall
    score, every document of a list has the same size and `_fit_uniform` counts in closed form
    what `_fit` walks document by document."""
    in_cands = candidates[:n_in]
    outs = outputs[:n_out]
    if not any(map(_METADATA_OF, in_cands)) and not (
        output_content and any(map(_METADATA_OF, map(_CANDIDATE, outs)))
    ):
        missing = sum(map(is_, map(_SCORE_OF, in_cands), repeat(None)))
        if missing in (0, n_in) and not any(map(is_, map(_SCORE_OF, outs), repeat(None))):
            size_in = 2 if missing else 3
            return _fit_uniform(size_in, n_in, 3 if output_content else 2, n_out, budget)
    sizes_in = [2 + (c.score is not None) + (1 if c.metadata else 0) for c in in_cands]
    sizes_out = [
        1 + (r.score is not None) + ((2 if r.candidate.metadata else 1) if output_content else 0)
        for r in outs
    ]
    return _fit(sizes_in, sizes_out, budget)


def _fit_uniform(
    size_in: int, n_in: int, size_out: int, n_out: int, budget: int
) -> tuple[int, int]:
    """`_fit` of `n_in` documents of `size_in` attributes and `n_out` of `size_out`, in closed
    form: both lists take a document per round while both can, then the one left alone."""
    budget = max(budget, 0)
    both = min(n_in, n_out, budget // (size_in + size_out))
    budget -= both * (size_in + size_out)
    kept_in = kept_out = both
    if both == n_in:  # inputs used up (or none): the outputs go on alone
        kept_out += min(n_out - both, budget // size_out)
    elif both == n_out:  # outputs used up: the inputs go on alone
        kept_in += min(n_in - both, budget // size_in)
    elif size_in <= budget:  # the next input fits, then the output after it cannot
        kept_in += 1 + min(n_in - both - 1, (budget - size_in) // size_in)
    else:  # the next input does not fit: the outputs go on alone
        kept_out += min(n_out - both, budget // size_out)
    return kept_in, kept_out


def room(span: Span) -> int | None:
    """Attributes the span can still take before the SDK starts evicting; None: no limit."""
    limit = otel_private.attribute_limit(span)
    if limit is None:
        return None
    return max(limit - len(otel_private.span_attributes(span)), 0)


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
