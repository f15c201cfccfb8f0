"""The sanitiser cleans what it quotes as one text, after assembling it (issue 23, cases 9 and
10, and the masking promises the mutant audit found unguarded).

Before, FastAPI's ``type``, ``msg`` and ``loc`` were cleaned one by one and then joined, so
pieces each under the 10-character echo threshold put a document back together; a document
holding NUL (the internal separator) was never masked; a key holding ``"`` or ``\\`` came back
JSON-escaped when the server's message was an object; and every entry of a long FastAPI list
cost a scan of every submitted text.
"""

from __future__ import annotations

import json
import sys

import pytest

from retrieval_stage._redact import ECHO_MIN_CHARS, ECHOED
from retrieval_stage.client.sanitize import server_text

DOC = "Glucose level 9.4 mmol per litre at night for Anna"
QUERY = "what insulin dose"


def fastapi(*entries: dict[str, object]) -> bytes:
    return json.dumps({"detail": list(entries)}).encode()


def test_pieces_under_the_threshold_cannot_rebuild_a_document() -> None:
    """``type: msg (at loc)`` where each piece is under 10 characters of the document but the
    joined text quotes 10 or more of it."""
    doc = "abcde: fghij (at klmno)"
    body = fastapi({"type": "abcde", "msg": "fghij", "loc": ["klmno"]})
    text = server_text(body, [QUERY, doc])
    assert "abcde: fghij" not in text, text
    assert "fghij (at klmno)" not in text, text


def test_pieces_joined_across_entries_cannot_rebuild_a_document() -> None:
    doc = "short one; short two"
    body = fastapi({"msg": "short one"}, {"msg": "short two"})
    text = server_text(body, [QUERY, doc])
    assert doc not in text, text


def test_a_document_holding_nul_is_still_masked() -> None:
    """NUL every few characters: with NUL as the separator no window of 10 was ever checked."""
    doc = "Anna\x00has\x00type\x001\x00diabetes\x00since\x002019"
    body = json.dumps({"error": f"cannot read {doc}"}).encode()
    text = server_text(body, [QUERY, doc])
    assert "diabetes" not in text, text
    assert ECHOED in text, text


@pytest.mark.parametrize("key", ['sk"quoted\\key-0123456789', 'a"b\\c'])
def test_a_key_holding_quotes_or_backslashes_never_comes_back_escaped(key: str) -> None:
    """The server's message is an object, which the sanitiser quotes as JSON: the key inside
    it is escaped on the way out and must be masked in that form too (also when shorter than
    the 8 characters a partial key must have)."""
    body = json.dumps({"error": {"message": {"got": key, "why": "bad key"}}}).encode()
    text = server_text(body, [QUERY], key)
    for form in (key, json.dumps(key)[1:-1], json.dumps(json.dumps(key))[1:-1]):
        assert form not in text, text


def test_a_short_key_echoed_json_escaped_is_masked() -> None:
    key = "k\\y7"  # under KEY_MIN_CHARS: only its whole forms can be masked
    body = json.dumps({"message": f"key {key} refused"}).encode()  # escaped in the raw bytes
    text = server_text(body, [QUERY], key)
    assert key not in text, text
    assert json.dumps(key)[1:-1] not in text, text


def test_a_json_escaped_non_ascii_document_is_masked() -> None:
    """A server that escapes non-ASCII (``\\u00ef``) quotes the document in a form that is
    not its raw text; the escaped form is masked too."""
    doc = "naïve café résumé über alles here"
    body = json.dumps({"message": f"bad: {json.dumps(doc)}"}, ensure_ascii=True).encode()
    text = server_text(body, [QUERY, doc])
    assert "caf" not in text or ECHOED in text
    assert json.dumps(doc)[1:-1] not in text, text
    assert doc not in text, text


def test_a_run_exactly_at_the_threshold_is_masked_and_one_below_is_kept() -> None:
    doc = "0123456789abcdef"
    at = doc[:ECHO_MIN_CHARS]
    below = doc[: ECHO_MIN_CHARS - 1]
    assert at not in server_text(f"x {at} y".encode(), [doc])
    assert below in server_text(f"x {below} y".encode(), [doc])


def test_cleaning_a_long_fastapi_list_costs_one_pass_not_one_per_entry() -> None:
    """1,000 entries against 1,000 documents: what is quoted is cut first, then cleaned
    once, so the number of entries does not multiply the work. Counted, not timed: the
    haystack search is done at most a bounded number of times."""
    import retrieval_stage._redact as sanitize

    docs = [f"document number {i} about topic {i % 7} " * 3 for i in range(1000)]
    body = fastapi(*({"type": "value_error", "msg": f"bad item {i}", "loc": ["body", i]}
                     for i in range(1000)))  # fmt: skip
    calls = 0
    original = sanitize._mask_runs

    def counting(*args: object, **kw: object) -> str:
        nonlocal calls
        calls += 1
        return original(*args, **kw)  # type: ignore[arg-type]

    sanitize._mask_runs = counting  # type: ignore[assignment]
    try:
        server_text(body, docs, "secret-key-123")
    finally:
        sanitize._mask_runs = original
    assert calls <= 4, calls


def test_deep_json_in_a_description_is_a_protocol_error() -> None:
    from retrieval_stage import RerankProtocolError
    from retrieval_stage.client.providers import get_format, parse_response

    nested: object = []
    for _ in range(sys.getrecursionlimit() + 10):
        nested = [nested]
    body = [{"index": nested, "score": 0.5}]
    with pytest.raises(RerankProtocolError):
        parse_response(get_format("tei"), body, {}, n_texts=1, expected=1)
