"""A RERANKER span's documents held as one record until something reads them (issue 38).

A 50-document call ends with ~300 document attributes (OpenInference flattens each document
into its own keys, and Phoenix reads nothing else). Building and storing them on the caller's
thread cost more than the rest of the span; encoding them cost as much again. Here the span's
attribute store keeps the call's `fit.DocumentsRecord` instead, and:

- anything that reads or writes the span's attributes (`span.attributes`, ``len``, iteration,
  ``set_attribute``, ``to_json``, a copy, any span processor or exporter) finds them flattened,
  exactly as the eager path would have stored them: the first such access flattens the record
  into the SDK's own dict, once, under the store's lock, and the store is a plain
  `BoundedAttributes` again from then on;
- our OTLP encoder (`telemetry.otlp_encoder`, with its C loops) reads `snapshot` instead and
  writes the documents' bytes straight from the record, so they are never flattened at all.

How it is done: the span's `BoundedAttributes` object changes class, to `DeferredAttributes`
(the same layout plus the record), so every reference to the store, the SDK's own
`ReadableSpan` included, sees the deferred behaviour, and changes back when flattened. This is
one more private write into the SDK (listed in docs/architecture.md with the test that pins
it); `defer` does it only where the result is provably the same as the eager write: an SDK
span that is still recording, whose store is exactly a `BoundedAttributes` with no value-length
limit and room for every document, and none of whose keys is a document key. Everywhere else
(and with ``RETRIEVAL_STAGE_DEFER_DOCUMENTS=0``) the documents are written at once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from .._log import get_logger
from ..validate import InvalidSetting, env_flag
from .fit import DocumentsRecord
from .otel_private import plain_attributes, set_again, set_span_attributes, writable_store

__all__ = [
    "DEFER_ENV",
    "DeferredAttributes",
    "defer",
    "defer_from_env",
    "snapshot",
    "write_outcome",
]

log = get_logger("retrieval_stage.spans")

DEFER_ENV = "RETRIEVAL_STAGE_DEFER_DOCUMENTS"
"""``0``/``false``/``no``/``off``: a RERANKER span's documents are written when the call ends."""

_DOCUMENT_MARK = "_documents."
"""In every key a record flattens to (OpenInference's ``reranker.input_documents.*`` and
``reranker.output_documents.*``, our omitted counts): a span already holding a key with it is
written eagerly, where a key set again would move."""


def defer_from_env() -> bool:
    """Whether documents are deferred when the writer does not say (`DEFER_ENV`, default yes);
    an unparseable value is logged and the default kept."""
    try:
        value = env_flag(DEFER_ENV)
    except InvalidSetting:
        log.warning(
            "rerank.config_invalid", variable=DEFER_ENV, value=os.environ.get(DEFER_ENV, "")
        )
        return True
    return True if value is None else value


_KEPT = tuple(f"_record_{name}" for name in DocumentsRecord._fields)
"""Where a deferred store keeps its record's fields: in its own instance dict (which changing
its class makes CPython build anyway), not in a record object beside it. A span waiting to be
exported then holds two objects more than an eager one (that dict and the record's list), not
three: each object a queued span holds makes the garbage collector run more often (the export
queue frees spans in bulk, so most of their frees never offset its allocation count)."""


class DeferredAttributes(BoundedAttributes):
    """A span's `BoundedAttributes` whose tail is still a `DocumentsRecord`.

    Every method flattens the record first (`_flatten`), then does what `BoundedAttributes`
    does; the Mapping methods it inherits all go through these.
    """

    def _record(self) -> DocumentsRecord:
        fields = vars(self)
        return DocumentsRecord._make([fields[name] for name in _KEPT])

    def _flatten(self) -> None:
        with self._lock:
            if type(self) is DeferredAttributes:
                self._dict.update(self._record().attributes())
                fields = vars(self)
                for name in _KEPT:
                    del fields[name]
                self.__class__ = BoundedAttributes  # type: ignore[assignment]

    # Each method names `BoundedAttributes` itself, not super(): once flattened, `self` is
    # a plain BoundedAttributes, which a zero-argument super() in this class would refuse.

    def __repr__(self) -> str:
        self._flatten()
        return BoundedAttributes.__repr__(self)

    def __getitem__(self, key: str) -> AttributeValue:
        self._flatten()
        return BoundedAttributes.__getitem__(self, key)

    def __setitem__(self, key: str, value: AttributeValue) -> None:
        self._flatten()
        BoundedAttributes.__setitem__(self, key, value)

    def _set_items(self, attributes: Any) -> None:
        self._flatten()
        BoundedAttributes._set_items(self, attributes)

    def __delitem__(self, key: str) -> None:
        self._flatten()
        BoundedAttributes.__delitem__(self, key)

    def __iter__(self) -> Any:
        self._flatten()
        return BoundedAttributes.__iter__(self)  # type: ignore[no-untyped-call]

    def __len__(self) -> int:
        self._flatten()
        return BoundedAttributes.__len__(self)

    def __contains__(self, key: object) -> bool:
        self._flatten()
        return BoundedAttributes.__contains__(self, key)

    def __deepcopy__(self, memo: dict[int, Any]) -> BoundedAttributes:
        self._flatten()
        return BoundedAttributes.__deepcopy__(self, memo)

    def copy(self) -> Any:
        self._flatten()
        return BoundedAttributes.copy(self)


def write_outcome(
    span: Span,
    head: Mapping[str, AttributeValue],
    record: DocumentsRecord,
    *,
    vouched: bool,
    deferring: bool = True,
) -> None:
    """``span.set_attributes(head)``, then the documents: kept as `record` (with `deferring`,
    where `defer` would keep them) or written after `head`. One lock for both where the span
    allows it (`otel_private.set_span_attributes`'s conditions); `vouched` as there."""
    writable = writable_store(span) if deferring and record.documents else None
    if writable is not None and (vouched or plain_attributes(head)):
        sdk_span, bounded = writable
        with sdk_span._lock:
            if sdk_span._end_time is None:
                with bounded._lock:
                    if _store_and_keep(bounded, head, record):
                        return
    set_span_attributes(span, head, vouched=vouched)
    if not (deferring and defer(span, record)):
        set_span_attributes(span, record.attributes(), vouched=True)


def _store_and_keep(
    bounded: BoundedAttributes, head: Mapping[str, AttributeValue], record: DocumentsRecord
) -> bool:
    """Under the span's and the store's locks: `head` stored as the SDK stores it (a key set
    again moves to the end) and `record` kept after it, when everything fits and no key on the
    span could be one of the record's; else False, with nothing changed."""
    if type(bounded) is not BoundedAttributes:  # another writer deferred it first
        return False
    stored = bounded._dict
    again = set_again(stored, head)
    fresh = len(head) - len(again)
    if bounded.maxlen is not None and len(stored) + fresh + record.bound > bounded.maxlen:
        return False
    # One search of every key at once; a key merely containing the mark is written eagerly.
    if _DOCUMENT_MARK in "\n".join(stored) or _DOCUMENT_MARK in "\n".join(head):
        return False
    for key in again:
        del stored[key]
    stored.update(head)
    vars(bounded).update(zip(_KEPT, record, strict=True))
    bounded.__class__ = DeferredAttributes
    return True


def defer(span: Span, record: DocumentsRecord) -> bool:
    """Keep `record` as the tail of `span`'s attributes; False (nothing done) where that could
    differ from ``set_attributes(record.attributes())``: the caller then writes them."""
    writable = writable_store(span) if record.documents else None  # none: nothing to keep
    if writable is None:
        return False
    sdk_span, bounded = writable
    with sdk_span._lock:
        if sdk_span._end_time is not None:
            return False
        with bounded._lock:
            return _store_and_keep(bounded, {}, record)


def snapshot(attributes: object) -> tuple[dict[str, Any], DocumentsRecord] | None:
    """For a store `defer` made: its flattened head (a copy) and its record, taken together
    under its lock; None for any other store, or one already flattened."""
    if type(attributes) is not DeferredAttributes:
        return None
    with attributes._lock:
        if type(attributes) is not DeferredAttributes:
            return None
        return attributes._dict.copy(), attributes._record()
