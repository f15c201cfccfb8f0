"""What fits on a span: attributes placed under the SDK's attribute-count limit, never evicting.

An OpenTelemetry SDK span keeps a bounded number of attributes and evicts the OLDEST when full,
which would erase the span's kind and query first. So a span's identity is written at start and
everything else last, only as much as fits: the outcome first, then documents, dropping from the
tail (lowest ranked) first and recording how many were left out. The documents are decided, capped
and turned into JSON when the call ends (`outcome_plan`, a `DocumentsRecord`); flattening them
into attributes can wait until the span is read (`spans.deferred`).

Document keys are precomputed once per process (up to `KEY_CACHE_BOUND` positions), and a
candidate's metadata JSON is computed once even when the candidate appears both as an input and
as an output document.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from itertools import repeat
from operator import attrgetter, is_
from typing import Any, NamedTuple

from openinference.instrumentation import TraceConfig
from openinference.semconv.trace import DocumentAttributes, RerankerAttributes
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from .._native import SPEEDUPS as _c
from ..models import Candidate, Reranked
from . import otel_private
from .content import cap_content, metadata_json
from .keys import ATTR_INPUT_OMITTED, ATTR_OUTPUT_OMITTED

__all__ = [
    "KEY_CACHE_BOUND",
    "DocumentsRecord",
    "fit_head",
    "outcome_attributes",
    "outcome_plan",
    "room",
]

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

    def cover(self, n: int) -> tuple[_Keys, ...]:
        """At least the first n positions' keys: the table, and beyond its bound a longer
        tuple made for this call."""
        keys = self.upto(n)
        if len(keys) < n:
            keys = keys + tuple(self.build(i) for i in range(len(keys), n))
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
    attributes, record = outcome_plan(
        span,
        stats,
        candidates,
        outputs,
        config=config,
        max_content_length=max_content_length,
        output_content=output_content,
    )
    attributes.update(record.attributes())
    return attributes


def outcome_plan(
    span: Span,
    stats: Mapping[str, AttributeValue],
    candidates: Sequence[Candidate],
    outputs: Sequence[Reranked],
    *,
    config: TraceConfig,
    max_content_length: int,
    output_content: bool = True,
) -> tuple[dict[str, AttributeValue], DocumentsRecord]:
    """`outcome_attributes` in two parts: the head of `stats` that fits, and the documents
    that fit after it as a `DocumentsRecord`, whose `attributes()` are the rest, in order.

    Everything a document's attributes depend on is decided here, when the call ends: which
    documents fit, the metadata JSON (a caller's mapping may change later), the key tables.
    What is left (capping ids and texts, flattening) is a pure function of immutable values,
    the same whenever it runs (`spans.deferred` runs it when the span is read)."""
    space = room(span)
    if space is None:
        return dict(stats), _plan(
            None, candidates, outputs, config, max_content_length, output_content
        )
    attributes = dict(list(stats.items())[: max(space - _RESERVED, 0)])
    # Keys already on the span take no new room: looked up in the SDK's own dict, at C speed.
    existing = otel_private.span_attributes(span)
    used = len(attributes) - sum(map(existing.__contains__, attributes))
    return attributes, _plan(
        space - used, candidates, outputs, config, max_content_length, output_content
    )


class DocumentsRecord(NamedTuple):
    """A RERANKER span's documents as decided when the call ended, not yet flattened.

    `attributes()` flattens them into the span's attributes: per kept input its id and text,
    its recall score unless None and its metadata JSON unless None; per kept output its id,
    its text (with `output_content`), its score unless None and its metadata JSON unless None;
    then the omitted-document counts that fit. Everything is capped and turned into JSON when
    the call ends, so the record holds exactly the strings and numbers the eager write would
    store (the same objects), nothing of the caller's beyond them: a span waiting in an export
    queue keeps no `Candidate`, text or metadata mapping alive. `bound` is at most how many
    attributes that makes.
    """

    documents: list[Any]
    """Three per document, kept inputs first, then kept outputs: its id, its text (None for an
    output without content) and its score (None: none). One object for the garbage collector
    while the span waits to be exported (`spans.deferred`)."""
    n_in: int
    """How many of the documents are inputs."""
    in_metas: list[str | None] | None
    out_metas: list[str | None] | None
    in_keys: tuple[_Keys, ...]
    out_keys: tuple[_Keys, ...]
    omitted: tuple[tuple[str, int], ...]
    bound: int

    @property
    def n_out(self) -> int:
        """How many outputs are kept."""
        return len(self.documents) // 3 - self.n_in

    def attributes(self) -> dict[str, AttributeValue]:
        """The documents' attributes, in the order the span holds them."""
        attributes: dict[str, AttributeValue] = {}
        documents = self.documents
        keys = self.in_keys
        metas = self.in_metas
        at = 0
        for i in range(self.n_in):
            k = keys[i]
            attributes[k[0]] = documents[at]
            attributes[k[1]] = documents[at + 1]
            if (score := documents[at + 2]) is not None:
                attributes[k[2]] = score
            if metas is not None and (meta := metas[i]) is not None:
                attributes[k[3]] = meta
            at += 3
        keys = self.out_keys
        metas = self.out_metas
        for j in range(self.n_out):
            k = keys[j]
            attributes[k[0]] = documents[at]
            if (text := documents[at + 1]) is not None:
                attributes[k[1]] = text
            if (score := documents[at + 2]) is not None:
                attributes[k[2]] = score
            if metas is not None and (meta := metas[j]) is not None:
                attributes[k[3]] = meta
            at += 3
        attributes.update(self.omitted)
        return attributes


def _plan(
    room: int | None,
    candidates: Sequence[Candidate],
    outputs: Sequence[Reranked],
    config: TraceConfig,
    max_bytes: int,
    output_content: bool,
) -> DocumentsRecord:
    """The documents that fit in `room` more attributes (None: no limit), as a record."""
    n_in = 0 if config.hide_inputs else len(candidates)
    n_out = 0 if config.hide_outputs else len(outputs)
    if room is None or 4 * (n_in + n_out) <= room - _RESERVED:
        kept_in, kept_out = n_in, n_out  # fits whatever each document holds
    else:
        kept_in, kept_out = _kept(
            candidates, outputs, n_in, n_out, room - _RESERVED, output_content
        )
    cands = candidates[:kept_in]
    outs = outputs[:kept_out]
    if (
        _c is not None
        and type(candidates) is list
        and type(outputs) is list
        and type(max_bytes) is int
        and max_bytes <= _SIZE_MAX
    ):
        documents, metadata = _c.pack_documents(
            candidates, kept_in, outputs, kept_out, max_bytes, output_content, cap_content
        )
    else:
        documents, metadata = _pack(cands, outs, max_bytes, output_content)
    in_metas = out_metas = None
    if metadata:  # else none has any
        in_metas, out_metas = _metadata(candidates, cands, outs, max_bytes, output_content)
    # At most four attributes a document; counted exactly where that bound is too loose to
    # say whether the omitted counts fit after them.
    bound = 4 * (kept_in + kept_out)
    if room is not None and bound + _RESERVED > room:
        bound = _documents_size(documents, in_metas, out_metas)
    omitted: tuple[tuple[str, int], ...] = ()
    for key, count in (
        (ATTR_INPUT_OMITTED, n_in - kept_in),
        (ATTR_OUTPUT_OMITTED, n_out - kept_out),
    ):
        if count and (room is None or bound + len(omitted) < room):
            omitted += ((key, count),)
    return DocumentsRecord(
        documents,
        kept_in,
        in_metas,
        out_metas,
        _INPUT_KEYS.cover(kept_in),
        _OUTPUT_KEYS.cover(kept_out),
        omitted,
        bound + len(omitted),
    )


_SIZE_MAX = sys.maxsize
"""The largest cap the C packing takes (a C ``Py_ssize_t``); a larger one, or one that is not
an int, is packed by `_pack`."""


def _pack(
    cands: Sequence[Candidate], outs: Sequence[Reranked], max_bytes: int, output_content: bool
) -> tuple[list[Any], bool]:
    """`DocumentsRecord.documents` for these documents, and whether any has metadata: each id
    and text capped inline (`capped`'s test, then `cap_content` only for a long or non-ASCII
    one, or one that is not an exact str, such as a str Enum member, which it takes by its
    characters: at ~200 per call the function calls alone were a tenth of the span's cost,
    issue 26). `_speedups.pack_documents` does the same in C."""
    documents: list[Any] = []
    metadata = False
    for c in cands:
        text = c.id
        documents.append(
            text
            if type(text) is str and len(text) <= max_bytes and text.isascii()
            else cap_content(text, max_bytes)
        )
        text = c.text
        documents.append(
            text
            if type(text) is str and len(text) <= max_bytes and text.isascii()
            else cap_content(text, max_bytes)
        )
        documents.append(c.score)
        metadata = metadata or bool(c.metadata)
    for r in outs:
        c = r.candidate
        text = c.id
        documents.append(
            text
            if type(text) is str and len(text) <= max_bytes and text.isascii()
            else cap_content(text, max_bytes)
        )
        if output_content:
            text = c.text
            documents.append(
                text
                if type(text) is str and len(text) <= max_bytes and text.isascii()
                else cap_content(text, max_bytes)
            )
        else:
            documents.append(None)
        documents.append(r.score)
        metadata = metadata or bool(c.metadata)
    return documents, metadata


def _documents_size(
    documents: list[Any],
    in_metas: list[str | None] | None,
    out_metas: list[str | None] | None,
) -> int:
    """How many attributes `DocumentsRecord.attributes` makes of these documents: an id each,
    every text and score that is not None, every metadata JSON that is not None."""
    size = len(documents) - documents.count(None)
    for metas in (in_metas, out_metas):
        if metas is not None:
            size += len(metas) - metas.count(None)
    return size


def _metadata(
    candidates: Sequence[Candidate],
    cands: Sequence[Candidate],
    outs: Sequence[Reranked],
    max_bytes: int,
    output_content: bool,
) -> tuple[list[str | None] | None, list[str | None] | None]:
    """The metadata JSON of each kept input and (with `output_content`) output that has
    metadata, None for one that has none; a list None when none has any. An output that is
    the kept input at its `input_index` takes that input's JSON: it is computed once."""
    in_metas: list[str | None] | None = None
    if any(map(_METADATA_OF, cands)):
        in_metas = [metadata_json(c.metadata, max_bytes) if c.metadata else None for c in cands]
    out_metas: list[str | None] | None = None
    if output_content and any(map(_METADATA_OF, map(_CANDIDATE, outs))):
        out_metas = []
        for r in outs:
            c = r.candidate
            meta: str | None = None
            if c.metadata:
                i = r.input_index
                if in_metas is not None and 0 <= i < len(in_metas) and candidates[i] is c:
                    meta = in_metas[i]
                if meta is None:
                    meta = metadata_json(c.metadata, max_bytes)
            out_metas.append(meta)
    return in_metas, out_metas


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
