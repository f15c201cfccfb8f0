"""A direct OTLP/protobuf writer for trace export: the bytes of an ExportTraceServiceRequest.

The SDK's `encode_spans` builds a protobuf message object per attribute and then serialises the
tree; for a 50-document RERANKER span (~320 attributes) that costs more CPU than the rerank call
itself. This module writes the same wire format directly: each attribute is a few list appends
of bytes precomputed per key, per string size and per KeyValue length (see `_attributes`), each
span one join, and the request one more. Its output is byte-identical to
``encode_spans(spans).SerializePartialToString()`` of the installed SDK (opentelemetry-proto
field numbers, fields in ascending number order, proto3 defaults omitted, oneof members always
written), which the tests prove over generated spans.

Anything it does not handle the way the SDK does (a value type it does not know, a string with
a lone surrogate, an integer outside int64, an exception anywhere) raises inside
`encode_spans_fast`; `serialize_spans` then encodes the whole batch with the SDK instead, so a
span is never dropped or corrupted by this module.

Where the package was built with its C loops (`retrieval_stage._native`), every attribute
mapping is written by them, and a RERANKER span whose documents are still a record
(`spans.deferred`) has them written straight from the record, never flattened; they write the
same bytes as the Python loops below, which run where the extension is missing or
``RETRIEVAL_STAGE_SPEEDUPS=0``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from struct import Struct
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from .._native import SPEEDUPS
from ..spans.deferred import snapshot
from ..spans.fit import DocumentsRecord

__all__ = [
    "UnsupportedValue",
    "documents_bytes",
    "encode_spans_fast",
    "sdk_serialize_spans",
    "serialize_spans",
    "speedups",
]

_logger = logging.getLogger(__name__)

_DOUBLE = Struct("<d").pack
_FIXED64 = Struct("<Q").pack
_FIXED32 = Struct("<I").pack

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_UINT32_MAX = (1 << 32) - 1
_UINT64_MASK = (1 << 64) - 1

# SpanFlags from trace.proto: the SDK always says whether the parent is remote.
_FLAGS_HAS_IS_REMOTE = 0x100
_FLAGS_IS_REMOTE = 0x200
_FLAGS_LOCAL = _FIXED32(_FLAGS_HAS_IS_REMOTE)
_FLAGS_REMOTE = _FIXED32(_FLAGS_HAS_IS_REMOTE | _FLAGS_IS_REMOTE)

# Span.SpanKind numbers from trace.proto (INTERNAL = 1 ... CONSUMER = 5).
_KIND = {
    SpanKind.INTERNAL: b"\x30\x01",
    SpanKind.SERVER: b"\x30\x02",
    SpanKind.CLIENT: b"\x30\x03",
    SpanKind.PRODUCER: b"\x30\x04",
    SpanKind.CONSUMER: b"\x30\x05",
}

_SMALL_VARINT_LIMIT = 1 << 14


def _varint_slow(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_VARINTS: list[bytes] = [_varint_slow(i) for i in range(_SMALL_VARINT_LIMIT)]


def _varint(n: int) -> bytes:
    """The unsigned varint of `n` (0 <= n < 2**64)."""
    if n < _SMALL_VARINT_LIMIT:
        return _VARINTS[n]
    if n > _UINT64_MASK:
        raise UnsupportedValue(f"varint out of range: {n}")
    return _varint_slow(n)


class UnsupportedValue(Exception):
    """Raised for input the fast encoder leaves to the SDK's encoder."""


# AnyValue members (common.proto): 1 string, 2 bool, 3 int64, 4 double, 5 array, 6 kvlist, 7 bytes.
_TRUE = b"\x10\x01"
_FALSE = b"\x10\x00"

_Parts = list[bytes | bytearray]
"""Pieces of a message, joined once (`bytes.join` takes bytearrays too)."""

_KEY_CACHE_LIMIT = 8192
"""Keys remembered per field tag; the cache is emptied when full (a span with unbounded
distinct keys costs CPU, never memory)."""


class _Key:
    """What every attribute with this key starts with, computed once per key and field tag.

    `head` is KeyValue.key (field 1, absent for "") followed by the tag of KeyValue.value
    (field 2); `size` is its length. `float_head` is a whole double attribute up to its 8
    bytes: the field `tag`, the KeyValue's length, `head`, the AnyValue's length (9) and the
    double_value tag.
    """

    __slots__ = ("float_head", "head", "size")

    def __init__(self, key: str, tag: bytes) -> None:
        if type(key) is not str:
            raise UnsupportedValue(f"attribute key of type {type(key).__name__}")
        raw = key.encode("utf-8")
        self.head = (b"\x0a" + _varint(len(raw)) + raw if raw else b"") + b"\x12"
        self.size = len(self.head)
        self.float_head = tag + _varint(self.size + 10) + self.head + b"\x09\x21"


# One key cache per field tag (span, event, link, resource, scope attributes).
_key_caches: dict[bytes, dict[str, _Key]] = {}


def _key(cache: dict[str, _Key], key: str, tag: bytes) -> _Key:
    if len(cache) >= _KEY_CACHE_LIMIT:
        cache.clear()
    entry = cache[key] = _Key(key, tag)
    return entry


# AnyValue.string_value's tag and length, for the lengths most strings have.
_STRING_HEADS: list[bytes] = [b"\x0a" + v for v in _VARINTS]

_MID_LIMIT = 4096
"""String sizes (UTF-8 bytes) whose whole KeyValue.value framing is precomputed: every value
our spans cap (2000 bytes by default) is below it."""

# For a string of `size` bytes: what lies between a KeyValue's key and the string's bytes
# (the AnyValue's length, then string_value's tag and length), and how many bytes that framing
# and the string add to the KeyValue's length. One lookup each instead of three varints.
_STRING_MIDS: list[bytes] = [
    _varint(len(_STRING_HEADS[size]) + size) + _STRING_HEADS[size] for size in range(_MID_LIMIT)
]
_STRING_EXTRAS: list[int] = [len(_STRING_MIDS[size]) + size for size in range(_MID_LIMIT)]

_TAGGED_LIMIT = _MID_LIMIT + 256
"""KeyValue lengths whose field tag + length varint is precomputed per tag: a string under
`_MID_LIMIT` bytes under a key of up to ~250 bytes."""

_tagged_varints: dict[bytes, list[bytes]] = {}

_INT_TABLE = 1024
"""Non-negative ints whose KeyValue.value (AnyValue length, int_value tag, varint) is
precomputed: our spans' counts (documents, top_k, requests, retries, batches)."""
_INT_VALUES: list[bytes] = [
    _varint(1 + len(_VARINTS[n])) + b"\x18" + _VARINTS[n] for n in range(_INT_TABLE)
]
_BOOL_VALUES = {True: b"\x02" + _TRUE, False: b"\x02" + _FALSE}


def _tagged(tag: bytes) -> list[bytes]:
    """`tag` followed by the varint of n, for every n below `_TAGGED_LIMIT` (built once)."""
    table = _tagged_varints.get(tag)
    if table is None:
        table = _tagged_varints[tag] = [tag + v for v in _VARINTS[:_TAGGED_LIMIT]]
    return table


def _any_value(value: Any) -> bytes:
    """The body of an AnyValue message for `value`, following the SDK's `_encode_value` order."""
    kind = type(value)
    if kind is str:
        raw: bytes = value.encode("utf-8")
        return b"\x0a" + _varint(len(raw)) + raw
    if kind is bool:
        return _TRUE if value else _FALSE
    if kind is int:
        if value < 0:
            if value < _INT64_MIN:
                raise UnsupportedValue("int below int64")
            return b"\x18" + _varint(value & _UINT64_MASK)
        if value > _INT64_MAX:
            raise UnsupportedValue("int above int64")
        return b"\x18" + _varint(value)
    if kind is float:
        return b"\x21" + _DOUBLE(value)
    if kind is tuple or kind is list:
        return _array(value)
    return _any_value_slow(value)


def _array(values: Sequence[Any]) -> bytes:
    parts = bytearray()
    for item in values:
        body = _any_value(item)
        parts += b"\x0a"
        parts += _varint(len(body))
        parts += body
    return b"\x2a" + _varint(len(parts)) + parts


def _any_value_slow(value: Any) -> bytes:
    """Subclasses and the rarer types, in the SDK's isinstance order.

    A subclass of str, int, float or bytes (a ``str`` Enum or an `IntEnum` member, numpy's
    float64) is written as its own value, which is what the SDK's protobuf messages read: its
    characters, its integer, its double, its bytes, taken by the base type's own method, never
    by one the subclass overrides (``str()`` of a str Enum member is "Tier.GOLD", its
    characters "gold")."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return _TRUE if value else _FALSE
    if isinstance(value, str):
        return _any_value(str.__str__(value))
    if isinstance(value, int):
        return _any_value(int.__int__(value))
    if isinstance(value, float):
        return b"\x21" + _DOUBLE(float.__float__(value))
    if isinstance(value, bytes):
        raw = bytes.__getitem__(value, _WHOLE)  # the bytes themselves, as an exact bytes
        return b"\x3a" + _varint(len(raw)) + raw
    if isinstance(value, Sequence):
        return _array(value)
    raise UnsupportedValue(f"attribute value of type {type(value).__name__}")


_WHOLE = slice(None)


def _attribute(parts: _Parts, tag: bytes, entry: _Key, value: Any) -> None:
    """Append one KeyValue field `tag` of any value type: the general path."""
    body = _any_value(value)
    body_len = _varint(len(body))
    parts.append(tag + _varint(entry.size + len(body_len) + len(body)) + entry.head + body_len)
    parts.append(body)


_LAYOUTS_PER_TAG = 8
"""Key sequences remembered per field tag, with their cache entries in order."""

_layouts: dict[bytes, list[tuple[list[str], list[_Key]]]] = {}


def _entries(tag: bytes, keys: list[str]) -> list[_Key]:
    """The cache entries for `keys`, in order.

    The last few key sequences per tag are remembered with their entries: a RERANKER span's
    ~320 keys are the same objects from one span to the next (the stage keeps key tables),
    so one list comparison, mostly identity checks, replaces a dict lookup per attribute.
    """
    layouts = _layouts.get(tag)
    if layouts is None:
        layouts = _layouts[tag] = []
    for known, entries in layouts:
        if known == keys:
            return entries
    cache = _key_caches.get(tag)
    if cache is None:
        cache = _key_caches[tag] = {}
    entries = []
    for key in keys:
        entry = cache.get(key)
        if entry is None:
            entry = _key(cache, key, tag)
        entries.append(entry)
    if len(layouts) >= _LAYOUTS_PER_TAG:
        del layouts[0]
    layouts.append((keys, entries))
    return entries


def _attributes(parts: _Parts, tag: bytes, attributes: Mapping[str, Any] | None) -> None:
    """Append each attribute as a KeyValue field `tag`, in the mapping's order.

    The loop below is the hot path of a RERANKER span (~320 attributes, nearly all str or
    float, a few small ints and bools): per attribute one type check and list appends of bytes
    that are precomputed per key, per value size and per KeyValue length, all joined once by
    the caller; other values go through `_attribute`. A string or
    key too long for those tables raises IndexError there; the mapping is then written again
    by the general path, which computes every length.
    """
    if not attributes:
        return
    try:
        # BoundedAttributes (also behind a MappingProxyType) copies its dict in C: far cheaper
        # than iterating the Mapping mixin in Python.
        copied: Mapping[str, Any] = attributes.copy()  # type: ignore[attr-defined]
    except AttributeError:
        copied = dict(attributes)
    if _c is not None:
        if type(copied) is not dict:
            copied = dict(copied)
        parts.append(_c.attributes(tag, copied, _c_key_cache(tag)))
        return
    entries = _entries(tag, list(copied))
    values = copied.values()
    start = len(parts)
    tagged = _tagged(tag)
    mids = _STRING_MIDS
    extras = _STRING_EXTRAS
    double = _DOUBLE
    bools = _BOOL_VALUES
    ints = _INT_VALUES
    int_table = _INT_TABLE
    try:
        for entry, value in zip(entries, values, strict=True):
            # Direct parts.append calls (not a bound method) use CPython's list-append fast path.
            kind = type(value)
            if kind is str:
                raw = value.encode()  # UTF-8, strict: a lone surrogate raises (SDK fallback)
                size = len(raw)
                parts.append(tagged[entry.size + extras[size]])
                parts.append(entry.head)
                parts.append(mids[size])
                parts.append(raw)
            elif kind is float:
                parts.append(entry.float_head)
                parts.append(double(value))
            elif kind is bool:
                parts.append(tagged[entry.size + 3])
                parts.append(entry.head)
                parts.append(bools[value])
            elif kind is int and 0 <= value < int_table:
                body = ints[value]
                parts.append(tagged[entry.size + len(body)])
                parts.append(entry.head)
                parts.append(body)
            else:
                _attribute(parts, tag, entry, value)
    except IndexError:  # a string of _MID_LIMIT bytes or more, or a very long key
        del parts[start:]
        for entry, value in zip(entries, values, strict=True):
            _attribute(parts, tag, entry, value)


def _span_attributes(parts: _Parts, span: ReadableSpan) -> None:
    """Span.attributes (field 9). A span whose documents are still a record (`spans.deferred`)
    has them written by the C loops straight from it, after the attributes stored before them
    and followed by the omitted counts: the order `DocumentsRecord.attributes` gives them."""
    if _c is not None:
        held = snapshot(getattr(span, "_attributes", None))
        if held is not None:
            head, record = held
            cache = _c_key_cache(b"\x4a")
            parts.append(_c.attributes(b"\x4a", head, cache))
            parts.append(documents_bytes(record))
            if record.omitted:
                parts.append(_c.attributes(b"\x4a", dict(record.omitted), cache))
            return
    _attributes(parts, b"\x4a", span.attributes)


def documents_bytes(record: DocumentsRecord) -> bytes:
    """A deferred record's documents as the KeyValue fields of Span.attributes, written by the
    C loops straight from the record (which must be there: `_c` not None)."""
    data: bytes = _c.documents(
        b"\x4a",
        _c_key_cache(b"\x4a"),
        record.in_keys,
        record.out_keys,
        record.documents,
        record.n_in,
        record.in_metas,
        record.out_metas,
    )
    return data


def _attributes_bytes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    parts: _Parts = []
    _attributes(parts, tag, attributes)
    return b"".join(parts)


def _string_field(out: bytearray, tag: bytes, value: str | None) -> None:
    if value:
        raw = value.encode("utf-8")
        out += tag
        out += _varint(len(raw))
        out += raw


def _uint32_field(out: bytearray, tag: bytes, value: int) -> None:
    if value:
        if not 0 <= value <= _UINT32_MAX:
            raise UnsupportedValue(f"uint32 out of range: {value}")
        out += tag
        out += _varint(value)


def _message_field(out: bytearray, tag: bytes, body: bytes | bytearray) -> None:
    out += tag
    out += _varint(len(body))
    out += body


def _span_parts(span: ReadableSpan) -> _Parts:
    """The body of one Span message (trace.proto), fields in ascending number order, in
    pieces: they are joined once, with the whole request, so a RERANKER span's ~48 KB are not
    copied once more per span. The fields around the attributes come from the C loops where
    the span has no trace state, events or links (`_speedups.span_frame`)."""
    if _c is not None:
        framed = _c.span_frame(span)
        if framed is not None:
            head, tail = framed
            parts: _Parts = [head]
            _span_attributes(parts, span)
            parts.append(tail)
            return parts
    return _python_span_parts(span)


def _python_span_parts(span: ReadableSpan) -> _Parts:
    """`_span_parts` written in Python, for every span."""
    out = bytearray()
    context = span.get_span_context()
    if context is None:
        raise UnsupportedValue("span without a context")
    out += b"\x0a\x10"
    out += context.trace_id.to_bytes(16, "big")
    out += b"\x12\x08"
    out += context.span_id.to_bytes(8, "big")
    trace_state = context.trace_state
    if trace_state is not None:
        _string_field(out, b"\x1a", ",".join([f"{k}={v}" for k, v in trace_state.items()]))
    parent = span.parent
    if parent:
        out += b"\x22\x08"
        out += parent.span_id.to_bytes(8, "big")
    _string_field(out, b"\x2a", span.name)
    out += _KIND[span.kind]
    start = span.start_time
    if start:
        out += b"\x39"
        out += _FIXED64(start)
    end = span.end_time
    if end:
        out += b"\x41"
        out += _FIXED64(end)
    parts: _Parts = [out]
    _span_attributes(parts, span)
    out = bytearray()
    parts.append(out)
    _uint32_field(out, b"\x50", span.dropped_attributes)
    for event in span.events:
        _message_field(out, b"\x5a", _event(event))
    _uint32_field(out, b"\x60", span.dropped_events)
    for link in span.links:
        _message_field(out, b"\x6a", _link(link))
    _uint32_field(out, b"\x70", span.dropped_links)
    status = span.status
    if status is not None:
        body = bytearray()
        _string_field(body, b"\x12", status.description)
        code = status.status_code.value
        if code:
            body += b"\x18"
            body += _varint(code)
        _message_field(out, b"\x7a", body)
    out += b"\x85\x01"
    out += _FLAGS_REMOTE if parent and parent.is_remote else _FLAGS_LOCAL
    return parts


def _event(event: Any) -> bytearray:
    """Span.Event: 1 time_unix_nano, 2 name, 3 attributes, 4 dropped_attributes_count."""
    out = bytearray()
    timestamp = event.timestamp
    if timestamp:
        out += b"\x09"
        out += _FIXED64(timestamp)
    _string_field(out, b"\x12", event.name)
    out += _attributes_bytes(b"\x1a", event.attributes)
    _uint32_field(out, b"\x20", event.dropped_attributes)
    return out


def _link(link: Any) -> bytearray:
    """Span.Link as the SDK writes it (no trace_state): ids, attributes, dropped, flags."""
    out = bytearray()
    context = link.context
    out += b"\x0a\x10"
    out += context.trace_id.to_bytes(16, "big")
    out += b"\x12\x08"
    out += context.span_id.to_bytes(8, "big")
    out += _attributes_bytes(b"\x22", link.attributes)
    _uint32_field(out, b"\x28", link.dropped_attributes)
    out += b"\x35"
    out += _FLAGS_REMOTE if context and context.is_remote else _FLAGS_LOCAL
    return out


_CACHE_LIMIT = 64
_resource_cache: dict[int, tuple[Any, bytes]] = {}
_scope_cache: dict[int, tuple[Any, bytes]] = {}


def _cached(cache: dict[int, tuple[Any, bytes]], obj: Any, encode: Any) -> bytes:
    """`encode(obj)`, remembered per object (resources and scopes are immutable and few)."""
    hit = cache.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]
    encoded: bytes = encode(obj)
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[id(obj)] = (obj, encoded)
    return encoded


def _resource_fields(resource: Any) -> bytes:
    """ResourceSpans field 1 (the Resource, always present) plus field 3 (its schema_url)."""
    body = bytearray()
    body += _attributes_bytes(b"\x0a", resource.attributes)
    out = bytearray()
    _message_field(out, b"\x0a", body)
    return bytes(out)


def _scope_field(scope: Any) -> bytes:
    """ScopeSpans field 1: InstrumentationScope 1 name, 2 version, 3 attributes."""
    body = bytearray()
    if scope is not None:
        _string_field(body, b"\x0a", scope.name)
        _string_field(body, b"\x12", scope.version)
        body += _attributes_bytes(b"\x1a", scope.attributes)
    out = bytearray()
    _message_field(out, b"\x0a", body)
    return bytes(out)


_hash_cache: dict[int, tuple[Any, int]] = {}


class _Grouping:
    """A resource or scope as a dict key: the SDK's equality, with the object's hash computed
    once per object across batches (`Resource.__hash__` dumps its attributes as JSON)."""

    __slots__ = ("hashed", "value")

    def __init__(self, value: Any) -> None:
        self.value = value
        hit = _hash_cache.get(id(value))
        if hit is not None and hit[0] is value:
            self.hashed = hit[1]
        else:
            self.hashed = hash(value)
            if len(_hash_cache) >= _CACHE_LIMIT:
                _hash_cache.clear()
            _hash_cache[id(value)] = (value, self.hashed)

    def __hash__(self) -> int:
        return self.hashed

    def __eq__(self, other: object) -> bool:
        return type(other) is _Grouping and bool(self.value == other.value)


_SPAN_PARTS_KEPT = 16
"""A span in at most this many pieces (the C loops write its attributes in one to three) is
joined only with the request; one in more (~4 per attribute from the Python loops) is joined on
its own first, so a batch does not keep hundreds of thousands of small pieces alive at once."""


def encode_spans_fast(spans: Sequence[ReadableSpan]) -> bytes:
    """The serialised ExportTraceServiceRequest for `spans`; raises on anything unhandled.

    Spans are grouped by resource, then by instrumentation scope, by equality and in order of
    first appearance, exactly as the SDK's `_encode_resource_spans` groups them.
    """
    # Equality classes found once per distinct object, first appearance in this batch winning.
    canonical: dict[int, Any] = {}
    resource_classes: dict[_Grouping, Any] = {}
    scope_classes: dict[_Grouping, Any] = {}
    groups: dict[int, dict[int, _Parts]] = {}  # each scope's spans, framed, in one flat list
    keys: dict[int, Any] = {}
    for span in spans:
        resource = span.resource
        scope = span.instrumentation_scope or None
        resource_key = canonical.get(id(resource))
        if resource_key is None:
            resource_key = resource_classes.setdefault(_Grouping(resource), resource)
            canonical[id(resource)] = resource_key
        scope_key = canonical.get(id(scope))
        if scope_key is None:
            scope_key = scope_classes.setdefault(_Grouping(scope), scope)
            canonical[id(scope)] = scope_key
        keys[id(resource_key)] = resource_key
        keys[id(scope_key)] = scope_key
        parts = _span_parts(span)
        if len(parts) > _SPAN_PARTS_KEPT:  # the Python loops' many small pieces: join them now
            parts = [b"".join(parts)]
        framed = groups.setdefault(id(resource_key), {}).setdefault(id(scope_key), [])
        framed.append(b"\x12" + _varint(sum(map(len, parts))))
        framed += parts  # no list per span kept for the batch: fewer objects for the collector

    chunks: list[bytes | bytearray] = []
    for resource_id, scopes in groups.items():
        resource = keys[resource_id]
        resource_chunks: list[bytes | bytearray] = [
            _cached(_resource_cache, resource, _resource_fields)
        ]
        for scope_id, encoded_spans in scopes.items():
            scope = keys[scope_id]
            scope_chunks: list[bytes | bytearray] = [_cached(_scope_cache, scope, _scope_field)]
            scope_chunks += encoded_spans
            if scope is not None and scope.schema_url:
                tail = bytearray()
                _string_field(tail, b"\x1a", scope.schema_url)
                scope_chunks.append(tail)
            scope_len = sum(map(len, scope_chunks))
            resource_chunks.append(b"\x12" + _varint(scope_len))
            resource_chunks.extend(scope_chunks)
        if resource.schema_url:
            tail = bytearray()
            _string_field(tail, b"\x1a", resource.schema_url)
            resource_chunks.append(tail)
        chunks.append(b"\x0a" + _varint(sum(map(len, resource_chunks))))
        chunks.extend(resource_chunks)
    return b"".join(chunks)


_c: Any = SPEEDUPS
if _c is not None:
    _c.setup_encoder(_any_value, UnsupportedValue)

speedups: bool = _c is not None
"""Whether the C loops write the attributes (the bytes are the same either way)."""

_c_key_caches: dict[bytes, dict[str, bytes]] = {}
"""Per field tag: each key's KeyValue head, made and kept by the C loops (bounded there)."""


def _c_key_cache(tag: bytes) -> dict[str, bytes]:
    cache = _c_key_caches.get(tag)
    if cache is None:
        cache = _c_key_caches[tag] = {}
    return cache


def sdk_serialize_spans(spans: Sequence[ReadableSpan]) -> bytes:
    """The SDK's own encoding of `spans`: the reference and the fallback."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    encoded: bytes = encode_spans(spans).SerializePartialToString()
    return encoded


def serialize_spans(spans: Sequence[ReadableSpan]) -> bytes:
    """`encode_spans_fast(spans)`, or the SDK's encoding of the batch if the fast path fails."""
    try:
        return encode_spans_fast(spans)
    except Exception as exc:  # any failure hands the batch to the SDK encoder
        _logger.debug("fast OTLP encoder fell back to the SDK encoder: %r", exc)
        return sdk_serialize_spans(spans)
