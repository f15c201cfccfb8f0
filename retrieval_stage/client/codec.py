"""JSON on the wire: orjson where it gives the standard library's bytes and values, else json.

Encoding a 50-document request and decoding its answer with the standard library was about a
fifth of the async client's CPU per call (issue 26); orjson does both several times faster. It
is used only where it is the standard library's twin, so what a server sees and what the flow
judges do not depend on which one ran:

- `dumps` is ``json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)``
  encoded as UTF-8: httpx's encoding of ``json=``, byte for byte (orjson writes the same for
  the str, int, bool and None a request holds; `tests/client/test_codec.py` checks it).
  Anything orjson refuses (an integer past 64 bits, a lone surrogate) goes to the standard
  library, which then raises what it always raised.
- `loads` is ``json.loads(content)``. orjson refuses what the standard library reads
  (``NaN``, ``Infinity``, ``1e400``, a byte-order mark, UTF-16, a lone surrogate escape):
  those go to the standard library, so a NaN score is still judged "not finite", not "not
  JSON". orjson reads an integer past 64 bits as a float where the standard library keeps an
  int: any run of `LONG_DIGITS` digits sends the body to the standard library as well.

orjson has wheels for CPython only (it is a dependency there); elsewhere the standard library
does everything, with the same results.
"""

from __future__ import annotations

import json
from typing import Any

from .._orjson import ORJSON

__all__ = ["LONG_DIGITS", "ORJSON", "dumps", "dumps_stdlib", "loads", "loads_stdlib"]


LONG_DIGITS = 19
"""Digits in a row from which a number may be an integer orjson reads as a float (below
-2**63 or from 2**64 on): such a body is decoded by the standard library."""

# Every digit read as "0", so one substring search finds a run of digits (a regular
# expression took longer than orjson's whole decoding).
_DIGITS_AS_ZERO = bytes(0x30 if 0x30 <= b <= 0x39 else b for b in range(256))
_LONG_RUN = b"0" * LONG_DIGITS


def dumps_stdlib(body: Any) -> bytes:
    """httpx's encoding of ``json=`` with the standard library."""
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.encode()


def loads_stdlib(content: bytes) -> Any:
    """``json.loads``: ValueError or RecursionError for what is not JSON."""
    return json.loads(content)


def dumps(body: Any) -> bytes:
    """The request body's JSON bytes, exactly as httpx's ``json=`` writes them."""
    if ORJSON is not None:
        try:
            encoded: bytes = ORJSON.dumps(body)
            return encoded
        except TypeError:  # orjson.JSONEncodeError: what it cannot write, json judges
            pass
    return dumps_stdlib(body)


def loads(content: bytes) -> Any:
    """The body's JSON value, as ``json.loads`` reads it; ValueError or RecursionError when it
    is not JSON."""
    if ORJSON is not None and _LONG_RUN not in content.translate(_DIGITS_AS_ZERO):
        try:
            return ORJSON.loads(content)
        except ValueError:  # orjson.JSONDecodeError: json reads some of these (NaN, UTF-16)
            pass
    return loads_stdlib(content)
