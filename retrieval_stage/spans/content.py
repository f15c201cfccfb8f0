"""What a span may hold of a text: content capped in UTF-8 bytes, metadata as JSON, the output.

Tempo truncates attribute values over 2048 bytes and the exporter drops a whole batch over a
string UTF-8 cannot encode, so every id, text, query and metadata value on our spans passes
through `cap_content` (or `metadata_json`), with the same cap on every span of a call.

Both take what they are given as text first (`as_text`): a str subclass (a ``str`` Enum
member) by its characters, which is what the SDK's encoder exports and what json writes, never
by its own ``__str__`` ("Tier.GOLD" for the member whose characters are "gold"); anything else
by ``str``; and a value whose ``str`` raises as the placeholder `unprintable` makes,
``<unprintable Row: RuntimeError>``, which costs that value only, never the span.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from itertools import accumulate
from json.encoder import encode_basestring as _quote  # json.dumps's own, for a str
from operator import add, attrgetter
from typing import Any

from .._native import SPEEDUPS as _c
from .._orjson import ORJSON as _ORJSON
from ..models import Reranked

__all__ = [
    "DEFAULT_MAX_CONTENT_BYTES",
    "TRUNCATION_MARKER",
    "as_text",
    "cap_content",
    "capped",
    "float_reprs",
    "metadata_json",
    "output_value",
    "unprintable",
]

DEFAULT_MAX_CONTENT_BYTES = 2000
"""Default cap on a document's content on the span: below Tempo's 2048-byte value limit."""

TRUNCATION_MARKER = "…[truncated]"
_MARKER_BYTES = len(TRUNCATION_MARKER.encode("utf-8"))
_COMPACT = (",", ":")
_FLOAT = frozenset((float,))
_STR = frozenset((str,))
_SCORE_KEY = ',"score":'
_CANDIDATE_ID = attrgetter("candidate.id")


def unprintable(value: object, exc: BaseException) -> str:
    """What a span shows for a `value` that could not be turned into text because `exc` was
    raised: ``<unprintable Row: RuntimeError>``, the value's class and the exception's."""
    return f"<unprintable {type(value).__name__}: {type(exc).__name__}>"


def as_text(value: object) -> str:
    """`value` as an exact str, as a span holds it.

    A str is its characters: an exact str as it is, a subclass (a ``str`` Enum member among
    them) through ``str.__str__``, never through a method it overrides, so the span says what
    the SDK's encoder and json say ("gold", not "Tier.GOLD"). Anything else is ``str(value)``;
    one whose ``str`` raises is the `unprintable` placeholder.
    """
    if type(value) is str:
        return value
    if isinstance(value, str):
        return str.__str__(value)
    try:
        text = str(value)
    except Exception as exc:  # a lazy attribute of a detached row, a dead proxy, ...
        return unprintable(value, exc)
    return text if type(text) is str else str.__str__(text)


def cap_content(text: str, max_bytes: int) -> str:
    """`text` cut to at most `max_bytes` UTF-8 bytes, ending in a marker when it was cut.

    Never splits a character, and replaces what UTF-8 cannot encode (a lone surrogate), which
    would otherwise make the exporter drop the whole batch of spans. Anything but an exact str
    is taken as `as_text` gives it first, so the result is always an exact str.
    """
    if type(text) is not str:
        text = as_text(text)
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

    Keys are taken as text (`as_text`), values JSON cannot hold are shown by `str`, NaN and
    infinities (not JSON) by `repr` (the whole mapping then under ``"_repr"``); past
    `max_bytes` the text is kept, cut, under ``"_truncated"`` so it stays valid JSON. A key or
    value that cannot be shown at all (its ``str`` raises, or its JSON does) is the placeholder
    ``"<unprintable Row: RuntimeError>"`` (`unprintable`) and costs nothing else: every other
    key keeps its value.
    """
    plain = {key if type(key) is str else as_text(key): value for key, value in metadata.items()}
    try:
        text = json.dumps(
            plain, ensure_ascii=False, default=as_text, sort_keys=True, allow_nan=False
        )
    except (TypeError, ValueError):  # NaN, an infinity, a cycle, a nested mapping's odd keys
        text = json.dumps({"_repr": _repr(plain)}, ensure_ascii=False)
    except Exception:  # one value raised while json read it: that value only
        text = _dumps_each(plain)
    if len(text) <= max_bytes // 4 or len(text.encode("utf-8", errors="replace")) <= max_bytes:
        return cap_content(text, max_bytes)
    return json.dumps({"_truncated": cap_content(text, max_bytes // 2)}, ensure_ascii=False)


def _dumps(value: Any) -> str:
    """`metadata_json`'s JSON of one value: what JSON cannot hold by `as_text`, which never
    raises (a value whose ``str`` raises is its placeholder)."""
    return json.dumps(value, ensure_ascii=False, default=as_text, sort_keys=True, allow_nan=False)


def _dumps_each(plain: dict[str, Any]) -> str:
    """`_dumps(plain)` written value by value, as json.dumps lays it out, for a mapping one of
    whose values raised: that value is its placeholder (`_shown` for NaN and the like)."""
    entries = []
    for key in sorted(plain):
        value = plain[key]
        try:
            text = _dumps(value)
        except (TypeError, ValueError):
            text = _quote(_shown(value))
        except Exception as exc:
            text = _quote(unprintable(value, exc))
        entries.append(f"{_quote(key)}: {text}")
    return "{" + ", ".join(entries) + "}"


def _shown(value: Any) -> str:
    """``repr(value)``, or its placeholder where that raises."""
    try:
        return repr(value)
    except Exception as exc:
        return unprintable(value, exc)


def _repr(plain: dict[str, Any]) -> str:
    """``repr(plain)``, each value that cannot be shown as its placeholder."""
    try:
        return repr(plain)
    except Exception:
        return "{" + ", ".join(f"{key!r}: {_shown(value)}" for key, value in plain.items()) + "}"


def capped(text: str, max_bytes: int) -> str:
    """`cap_content` with its common case (a short ASCII str, returned as is) inlined."""
    if type(text) is str and len(text) <= max_bytes and text.isascii():
        return text
    return cap_content(text, max_bytes)


_PLAIN_LOW = 1e-4
"""From here up to `_PLAIN_HIGH` (and at 0) ``repr`` writes a float without an exponent."""
_PLAIN_HIGH = 1e16


def float_reprs(values: list[float]) -> list[str]:
    """``list(map(repr, values))`` for finite floats: what ``json.dumps`` writes for each.

    Python's shortest round-trip digits cost about a microsecond per float; orjson writes the
    same shortest digits in a tenth of that for one list, and the same text wherever ``repr``
    writes no exponent (0, and magnitudes from 1e-4 to below 1e16); below 1e-4 orjson writes
    ``0.00001`` where ``repr`` writes ``1e-05``, so those few are written by ``repr``.
    """
    if _ORJSON is None or not values:
        return list(map(repr, values))
    texts: list[str] = _ORJSON.dumps(values).decode()[1:-1].split(",")
    magnitudes = list(map(abs, values))
    if min(magnitudes) < _PLAIN_LOW or max(magnitudes) >= _PLAIN_HIGH:
        for i, size in enumerate(magnitudes):
            if size and not _PLAIN_LOW <= size < _PLAIN_HIGH:
                texts[i] = repr(values[i])
    return texts


def _plain_output(outputs: Sequence[Reranked], max_bytes: int) -> str | None:
    """``output.value`` of an answered call, written whole and cut in one pass, or None where
    its text could differ from the general path's: every id printable ASCII with no quote or
    backslash and no longer than `max_bytes` (nothing to escape or cap, so the text is its own
    UTF-8 and each entry's length is known), every score a finite float, 0 or of a magnitude
    where orjson's shortest digits are ``repr``'s (`float_reprs`).

    A 50-document answer with full-precision scores is longer than the default 2,000 bytes, so
    the cut is the common case: it is found from the entries' lengths (`bisect` over their
    running sum) and made by slicing the whole text, not by building each entry again."""
    if _ORJSON is None:
        return None
    scores: list[Any] = list(map(_SCORE_OF, outputs))
    if not set(map(type, scores)) <= _FLOAT:
        return None
    raw: bytes = _ORJSON.dumps(scores)
    if _c is not None:  # the same, in C (`retrieval_stage._native`); None: not its case
        text: str | None = _c.output_value(outputs, scores, raw, max_bytes)
        return text
    ids: list[str] = list(map(_CANDIDATE_ID, outputs))
    if not set(map(type, ids)) <= _STR:  # a subclass's len() may be its own: `as_text` first
        return None
    joined = "".join(ids)
    if not (joined.isascii() and joined.isprintable()) or '"' in joined or "\\" in joined:
        return None
    if not ids or max(map(len, ids)) > max_bytes:  # none: nothing to gain
        return None
    if b"n" in raw:  # NaN and the infinities, which orjson writes as null
        return None
    magnitudes = list(filter(None, map(abs, scores)))
    if magnitudes and (min(magnitudes) < _PLAIN_LOW or max(magnitudes) >= _PLAIN_HIGH):
        return None
    texts = raw.decode()[1:-1].split(",")
    # Entry i is '{"id":"<id>","score":<text>}', 18 characters and its id and text.
    entries = _ENTRY_JOIN.join(map(_PAIR_JOIN, zip(ids, texts, strict=True)))
    whole = '{"documents":[{"id":"' + entries + "}]}"
    if len(whole) <= max_bytes:
        return whole
    # Each entry and the comma after it, summed: the first k entries and their k - 1 commas
    # fit in `budget` when ends[k - 1] <= budget + 1.
    ends = list(accumulate(map(_ENTRY_AND_COMMA.__add__, map(add, map(len, ids), map(len, texts)))))
    tail = f'],"omitted":{len(ids)}}}'  # the longest the closing part can be
    budget = max_bytes - len(_OUTPUT_HEAD) - len(tail)
    kept = bisect_right(ends, budget + 1)
    head = whole[: len(_OUTPUT_HEAD) + ends[kept - 1] - 1] if kept else _OUTPUT_HEAD
    return head + f'],"omitted":{len(ids) - kept}}}'


_OUTPUT_HEAD = '{"documents":['
_ENTRY_JOIN = '},{"id":"'
_PAIR_JOIN = '","score":'.join
_ENTRY_AND_COMMA = 19
_SCORE_OF = attrgetter("score")


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=_COMPACT)


def output_value(outputs: Sequence[Reranked], *, fell_back: bool, max_bytes: int) -> str:
    """The stage's output as compact JSON for ``output.value`` (Phoenix's span list shows it).

    ``{"documents":[{"id":"b","score":0.97},…]}`` best first; on a fallback the reranker gave
    no scores, so ``{"order":"recall","documents":[{"id":"a"},…]}``. Longer than `max_bytes`
    (UTF-8), the tail is left off and ``"omitted":N`` says how many, so it stays valid JSON.
    """
    # Each entry built at C speed: the id through json's own string encoder, a finite float
    # as its repr (`float_reprs`), which is exactly what json.dumps writes for them, joined
    # by concatenation (str.format per entry cost as much); any other score: json.dumps.
    if not fell_back:
        plain = _plain_output(outputs, max_bytes)
        if plain is not None:
            return plain
    ids: list[str] = list(map(_CANDIDATE_ID, outputs))
    if not (
        set(map(type, ids)) <= _STR
        and all(map(str.isascii, ids))
        and (not ids or max(map(len, ids)) <= max_bytes)
    ):
        ids = [capped(i, max_bytes) for i in ids]  # else `capped` returns each as it is
    entries: list[str] | None = None  # each '{"id":…}' document, when written whole
    bodies: list[str] = []  # else what goes between '{"id":' and '}' of each
    if fell_back:
        head = '{"order":"recall","documents":['
        bodies = list(map(_quote, ids))
    else:
        head = '{"documents":['
        scores: list[Any] = [r.score for r in outputs]
        if set(map(type, scores)) <= _FLOAT and all(map(math.isfinite, scores)):
            bodies = list(
                map(str.__add__, map(_quote, ids), map(_SCORE_KEY.__add__, float_reprs(scores)))
            )
        else:
            entries = [
                _json({"id": i, "score": score}) for i, score in zip(ids, scores, strict=True)
            ]
    if entries is None:
        inner = '{"id":' + '},{"id":'.join(bodies) + "}" if bodies else ""
    else:
        inner = ",".join(entries)
    text = head + inner + "]}"
    if len(text) <= max_bytes // 4 or len(text.encode("utf-8", errors="replace")) <= max_bytes:
        return text
    if entries is None:
        entries = ['{"id":' + body + "}" for body in bodies]
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
