"""Decoding a large JSON answer in slices, so the async client can give the event loop back.

`json.loads` is one C call that holds the GIL: a 4 MiB answer of small objects holds it for
~0.1-0.4 s, which a worker thread does not help with. `decode_in_steps` decodes the same
document (same values, same errors as `json.loads`) with the standard decoder, one element at
a time for the two levels a rerank answer has (a bare array of results, or an object whose
``results`` is one), and yields after every `STEP_ELEMENTS` elements: the async driver
awaits between steps (`async_reply`); the sync one uses `json.loads`, since nothing waits on it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Generator, Mapping
from typing import Any

import anyio

from .steps import NotJson, Reply

__all__ = ["STEP_BYTES", "STEP_ELEMENTS", "async_reply", "decode_in_steps", "run_through"]

STEP_ELEMENTS = 500
"""Elements decoded between two yields: a result takes ~1-4 µs, so a step is a millisecond
or two."""

STEP_BYTES = 64 * 1024
"""Bodies up to this size are decoded in one go (a millisecond or so)."""

_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\n\r]*")

Steps = Generator[None, None, Any]


def _skip(text: str, i: int) -> int:
    match = _WS.match(text, i)
    assert match is not None  # `*` always matches
    return match.end()


def _error(text: str, i: int, what: str) -> json.JSONDecodeError:
    return json.JSONDecodeError(what, text, i)


def _value(
    text: str, i: int, depth: int, counter: list[int]
) -> Generator[None, None, tuple[Any, int]]:
    if i < len(text) and depth < 2 and text[i] == "[":
        return (yield from _array(text, i, depth, counter))
    if i < len(text) and depth < 1 and text[i] == "{":
        return (yield from _object(text, i, depth, counter))
    value, end = _DECODER.raw_decode(text, i)
    counter[0] += 1
    if counter[0] % STEP_ELEMENTS == 0:
        yield
    return value, end


def _array(
    text: str, i: int, depth: int, counter: list[int]
) -> Generator[None, None, tuple[Any, int]]:
    items: list[Any] = []
    i = _skip(text, i + 1)
    if text.startswith("]", i):
        return items, i + 1
    while True:
        value, i = yield from _value(text, i, depth + 1, counter)
        items.append(value)
        i = _skip(text, i)
        if text.startswith(",", i):
            i = _skip(text, i + 1)
        elif text.startswith("]", i):
            return items, i + 1
        else:
            raise _error(text, i, "Expecting ',' delimiter")


def _object(
    text: str, i: int, depth: int, counter: list[int]
) -> Generator[None, None, tuple[Any, int]]:
    members: dict[str, Any] = {}
    i = _skip(text, i + 1)
    if text.startswith("}", i):
        return members, i + 1
    while True:
        if not text.startswith('"', i):
            raise _error(text, i, "Expecting property name enclosed in double quotes")
        key, i = _DECODER.raw_decode(text, i)
        i = _skip(text, i)
        if not text.startswith(":", i):
            raise _error(text, i, "Expecting ':' delimiter")
        value, i = yield from _value(text, _skip(text, i + 1), depth + 1, counter)
        members[key] = value
        i = _skip(text, i)
        if text.startswith(",", i):
            i = _skip(text, i + 1)
        elif text.startswith("}", i):
            return members, i + 1
        else:
            raise _error(text, i, "Expecting ',' delimiter")


def decode_in_steps(content: bytes) -> Steps:
    """`json.loads(content)`, yielding between slices; raises ValueError (or RecursionError,
    as `json.loads` does) for what is not JSON."""
    text = content.decode(json.detect_encoding(content))
    if len(content) <= STEP_BYTES:
        return json.loads(text)
    i = _skip(text, 0)
    value, i = yield from _value(text, i, 0, [0])
    if _skip(text, i) != len(text):
        raise _error(text, i, "Extra data")
    return value


def run_through(steps: Steps) -> Any:
    """Drive `steps` to its end without stopping; its value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


async def async_reply(status_code: int, headers: Mapping[str, str], content: bytes) -> Reply:
    """The `Reply` for a body read in full, a large 2xx body decoded in slices with the event
    loop given back between them (any async transport can call this: httpx's, aiohttp's)."""
    if not 200 <= status_code < 300 or len(content) <= STEP_BYTES:
        return Reply(status_code, headers, content)
    steps = decode_in_steps(content)
    try:
        while True:
            try:
                next(steps)
            except StopIteration as done:
                value = done.value
                break
            await anyio.sleep(0)
    except (ValueError, RecursionError) as exc:
        return Reply(status_code, headers, content, NotJson(exc))
    return Reply(status_code, headers, content, value)
