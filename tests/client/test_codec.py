"""The client's fast paths give what the reference paths give (issue 26).

`codec.dumps`/`codec.loads` (orjson where it is the standard library's twin) against httpx's
``json=`` encoding and ``json.loads``, value for value and type for type (an int is not a
float here: ``1 == 1.0`` would hide a mislabelled index); `providers.plain_pairs` (the cheap
pass over a plain response) against `providers.checked_pairs` (the checks that name a fault).
Pure functions, no I/O; 100-200 examples each.
"""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval_stage.client import codec
from retrieval_stage.client.providers import (
    PROVIDERS,
    build_request,
    checked_pairs,
    get_format,
    parse_response,
    plain_pairs,
)
from retrieval_stage.errors import RerankProtocolError

# Any text a caller may send: every code point but lone surrogates (refused before any I/O).
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


def same(a: Any, b: Any) -> bool:
    """Equal, with the same types all the way down (NaN equal to NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def outcome(decode: Any, content: bytes) -> Any:
    """What `decode` gives for `content`: its value, or "not JSON" when it refuses it."""
    try:
        return decode(content)
    except (ValueError, RecursionError):
        return "not JSON"


def test_same_tells_int_from_float() -> None:
    assert same([1, {"a": math.nan}], [1, {"a": math.nan}])
    assert not same([1], [1.0])
    assert not same({"a": 1, "b": 2}, {"b": 2, "a": 1})


# -- encoding -----------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    provider=st.sampled_from(sorted(PROVIDERS)),
    query=TEXT,
    texts=st.lists(TEXT, max_size=6),
    model=st.none() | TEXT.filter(bool),
    top_n=st.none() | st.integers(1, 10**6),
)
def test_dumps_writes_httpx_json_bytes(
    provider: str, query: str, texts: list[str], model: str | None, top_n: int | None
) -> None:
    body = build_request(get_format(provider), query, texts, model=model, top_n=top_n)
    wire = httpx.Request("POST", "http://h/", json=body).content  # what httpx's json= sends
    assert codec.dumps(body) == wire == codec.dumps_stdlib(body)


def test_dumps_hands_what_orjson_cannot_write_to_json() -> None:
    big = {"top_n": 2**70}
    assert codec.dumps(big) == codec.dumps_stdlib(big) == b'{"top_n":1180591620717411303424}'
    with pytest.raises(UnicodeEncodeError):  # as httpx's json= fails on a lone surrogate
        codec.dumps({"query": "\ud800"})


# -- decoding -----------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | TEXT,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5),
    max_leaves=20,
)

# Literals on both sides of every edge the two decoders differ at.
EDGES = [
    b"NaN",
    b"[-Infinity]",
    b"1e400",
    b'{"score": -1e400}',
    b"9223372036854775807",
    b"-9223372036854775808",
    b"-9223372036854775809",
    b"18446744073709551615",
    b"18446744073709551616",
    b"[0.12345678901234567890123]",
    b'"\\ud800"',
    b'"\\ud83d\\ude00"',
    b"\xef\xbb\xbf[1]",
    "[1, 2]".encode("utf-16"),
    "[1, 2]".encode("utf-32-le"),
    b"[1,]",
    b"",
    b" ",
    b"\xff",
    b'"\x01"',
    b"[" * 5000 + b"]" * 5000,
    b'{"a": 1, "a": 2}',
    b"[1] x",
    b"-0",
    b"-0.0",
]


@pytest.mark.parametrize("content", EDGES, ids=repr)
def test_loads_reads_what_json_reads_at_the_edges(content: bytes) -> None:
    assert same(outcome(codec.loads, content), outcome(codec.loads_stdlib, content))


@settings(max_examples=100, deadline=None)
@given(value=JSON_VALUES, indent=st.none() | st.integers(0, 2))
def test_loads_reads_what_json_reads(value: Any, indent: int | None) -> None:
    content = json.dumps(value, indent=indent, ensure_ascii=False).encode()
    assert same(outcome(codec.loads, content), outcome(codec.loads_stdlib, content))


@settings(max_examples=100, deadline=None)
@given(value=JSON_VALUES, cut=st.integers(0, 200), junk=st.binary(max_size=4))
def test_loads_refuses_what_json_refuses(value: Any, cut: int, junk: bytes) -> None:
    whole = json.dumps(value).encode()
    content = whole[: cut % (len(whole) + 1)] + junk  # cut short, bytes appended
    assert same(outcome(codec.loads, content), outcome(codec.loads_stdlib, content))


def test_without_orjson_the_standard_library_does_it_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "ORJSON", None)
    body = {"query": "q", "texts": ["é", "a\u2028b"]}
    assert codec.dumps(body) == codec.dumps_stdlib(body)
    content = b'[{"index": 0, "score": NaN}, {"index": 18446744073709551616}]'
    assert same(codec.loads(content), json.loads(content))


# -- validation ---------------------------------------------------------------------------------

TEI = get_format("tei")
COHERE = get_format("cohere")

# Each value a result's index or score might take, plain or not.
ODD_VALUES = (
    st.integers(-2, 8)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.booleans()
    | st.none()
    | st.sampled_from(["0", "1.5", [0], {"i": 0}])
)


@st.composite
def responses(draw: st.DrawFn) -> tuple[int, list[Any]]:
    """A plain answer for n texts (a permutation, float scores), then a few entries spoiled,
    the subtle ways included: an index repeated, an index given as the bool equal to it
    (``True == 1``), a score that is an int or a bool."""
    n = draw(st.integers(1, 6))
    order = draw(st.permutations(range(n)))
    scores = draw(st.lists(st.floats(-1e6, 1e6), min_size=n, max_size=n))
    entries: list[Any] = [{"index": i, "score": s} for i, s in zip(order, scores, strict=True)]
    spoils = ["index", "score", "drop index", "drop score", "entry", "repeat", "bool", "int"]
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, n - 1))
        spoil = draw(st.sampled_from(spoils))
        entry = entries[at]
        if not isinstance(entry, dict):  # spoiled already
            continue
        entry = dict(entry)
        if spoil.startswith("drop"):
            entry.pop(spoil.split()[1], None)
        elif spoil == "entry":
            entry = draw(ODD_VALUES)
        elif spoil == "repeat":
            other = entries[draw(st.integers(0, n - 1))]
            entry["index"] = other.get("index") if isinstance(other, dict) else 0
        elif spoil == "bool":
            if entry.get("index") in (0, 1):
                entry["index"] = bool(entry["index"])
        elif spoil == "int":
            entry["score"] = draw(st.sampled_from([0, 1, -3, True, False]))
        else:
            entry[spoil] = draw(ODD_VALUES)
        entries[at] = entry
    return n, entries


def judged(fmt: Any, entries: list[Any], n: int) -> Any:
    """`checked_pairs`' outcome: the pairs, or the message naming the fault."""
    try:
        return checked_pairs(fmt, entries, n_texts=n, expected=len(entries))
    except RerankProtocolError as exc:
        return str(exc)


@settings(max_examples=200, deadline=None)
@given(case=responses())
def test_the_plain_pass_agrees_with_the_checks(case: tuple[int, list[Any]]) -> None:
    n, entries = case
    plain = plain_pairs(entries, "score", n)
    reference = judged(TEI, entries, n)
    if plain is not None:  # taken only where the checks accept, with the very same pairs
        assert same(plain, reference)
    try:
        parsed: Any = parse_response(TEI, entries, {}, n_texts=n, expected=len(entries)).pairs
    except RerankProtocolError as exc:
        parsed = str(exc)
    assert same(parsed, reference)


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        ([{"index": 0, "score": 0.5}, {"index": 0, "score": 0.4}], "duplicate index 0"),
        ([{"index": 0, "score": 0.5}, {"index": True, "score": 0.4}], "must be an integer"),
        ([{"index": 0, "score": math.nan}, {"index": 1, "score": 0.4}], "not finite"),
        ([{"index": 0, "score": 0.5}, {"index": 2, "score": 0.4}], "out of range"),
        ([{"index": 0, "score": False}, {"index": 1, "score": 0.4}], "must be a number"),
        ([{"index": 0, "score": 0.5}, [1, 0.4]], "must be a JSON object"),
    ],
)
def test_the_plain_pass_leaves_every_fault_to_the_checks(entries: list[Any], why: str) -> None:
    assert plain_pairs(entries, "score", 2) is None
    with pytest.raises(RerankProtocolError, match=why):
        parse_response(TEI, entries, {}, n_texts=2, expected=2)


def test_an_int_score_is_taken_by_the_checks() -> None:
    entries = [{"index": 1, "relevance_score": 1}, {"index": 0, "relevance_score": 0.25}]
    assert plain_pairs(entries, "relevance_score", 2) is None
    body = {"results": entries}
    pairs = parse_response(COHERE, body, {}, n_texts=2, expected=2).pairs
    assert same(pairs, [(1, 1.0), (0, 0.25)])
