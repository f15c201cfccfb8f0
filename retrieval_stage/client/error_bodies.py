"""Error bodies of the rerank APIs: the provider's own message, and the batch cap it states.

Every provider words its errors its own way (TEI's ``{"error", "error_type"}``, Cohere's
``{"message"}``, FastAPI's ``{"detail": [...]}``, ...). `error_message` picks the message out
of any of them, and `batch_cap` reads the largest batch a refusal says the server takes, so
the client can split and retry. What is quoted from here is cleaned by `client.sanitize`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, TypeGuard

__all__ = ["ERROR_JSON_BYTES", "batch_cap", "batch_size_refusal", "error_message"]


def _count(value: Any) -> TypeGuard[int]:
    """Whether `value` is a JSON integer above zero (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


_BATCH_REFUSALS = (
    # TEI: "batch size 64 > maximum allowed batch size 32"
    re.compile(r"batch size (?P<sent>\d{1,9}) > maximum allowed batch size (?P<cap>\d{1,9})\b"),
    # Infinity and any pydantic/FastAPI server:
    # "List should have at most 2048 items after validation, not 3000"
    re.compile(
        r"should have at most (?P<cap>\d{1,9}) items? after validation, not (?P<sent>\d{1,9})\b"
    ),
)


def batch_size_refusal(message: str) -> int | None:
    """The server's batch cap from a refusal message: TEI's ``batch size N > maximum allowed
    batch size M`` or pydantic's ``List should have at most M items after validation, not N``
    (Infinity, FastAPI servers); None when the message states no cap."""
    for pattern in _BATCH_REFUSALS:
        match = pattern.search(message)
        if match is not None:
            cap = int(match.group("cap"))
            return cap if 0 < cap < int(match.group("sent")) else None
    return None


def batch_cap(content: bytes, sent: int) -> int | None:
    """The batch cap an error body states for a request of `sent` texts, or None.

    Reads FastAPI's structured ``{"detail": [{"type": "too_long", "ctx": {"max_length": M,
    "actual_length": N}}]}`` (only when N is the number of texts sent, so a too-long *string*
    is never taken for a list cap), else the wording `batch_size_refusal` knows.
    """
    body = _error_json(content)
    detail = body.get("detail") if isinstance(body, dict) else None
    for entry in detail if isinstance(detail, list) else ():
        ctx = entry.get("ctx") if isinstance(entry, dict) else None
        if isinstance(ctx, dict) and entry.get("type") == "too_long":
            cap, actual = ctx.get("max_length"), ctx.get("actual_length")
            if _count(cap) and actual == sent and cap < sent:
                return cap
    cap = batch_size_refusal(content[:ERROR_JSON_BYTES].decode("utf-8", errors="replace"))
    return cap if cap is not None and cap < sent else None


ERROR_JSON_BYTES = 256 * 1024
"""Error bodies up to this size are read as JSON; a larger one is taken as text (its start):
an explanation never needs more, and decoding megabytes would cost more than the error."""


def _error_json(content: bytes) -> Any:
    """An error body's JSON value, or None when it is not JSON (or too large to decode)."""
    if len(content) > ERROR_JSON_BYTES:
        return None
    try:
        return json.loads(content)
    except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
        return None


def _without_echo(value: Any) -> Any:
    """`value` without FastAPI's ``input`` fields, which echo what was sent."""
    if isinstance(value, dict):
        return {k: _without_echo(v) for k, v in value.items() if k != "input"}
    if isinstance(value, list):
        return [_without_echo(v) for v in value]
    return value


def _same(text: str) -> str:
    return text


def _fastapi_detail(detail: list[Any], limit: int) -> str:
    """``type: msg (at loc)`` per FastAPI validation error, without the echoed ``input``,
    joined by ``; ``; entries stop once `limit` characters are assembled (the rest could not
    be quoted anyway, and a list of thousands must not cost thousands of steps)."""
    parts: list[str] = []
    size = 0
    for entry in detail:
        if size > limit:
            break
        if not isinstance(entry, dict):
            text = json.dumps(_without_echo(entry))
        else:
            kind, msg, loc = entry.get("type"), entry.get("msg"), entry.get("loc")
            if msg is not None and not isinstance(msg, str):
                msg = json.dumps(_without_echo(msg))
            text = f"{kind}: {msg}" if kind and msg else str(msg or kind or "")
            if isinstance(loc, list) and loc:
                text += f" (at {'.'.join(str(part) for part in loc)})"
        parts.append(text)
        size += len(text) + 2
    return "; ".join(parts)


def error_message(content: bytes, limit: int = 500, clean: Callable[[str], str] = _same) -> str:
    """The server's error text from any provider's error body, cut to `limit` characters.

    Knows TEI's ``{"error", "error_type"}``, Cohere's and Mixedbread's ``{"message"}`` (also
    older vLLM's flat ``{"object": "error", "message"}``), Jina's, Voyage's and FastAPI's
    ``{"detail"}`` (a FastAPI validation list becomes ``type: msg (at loc)``, its echoed
    ``input`` dropped) and vLLM's and Infinity's ``{"error": {"message"}}``; anything else
    (or a body over `ERROR_JSON_BYTES`) is returned as text. The message is assembled whole
    and cut, then `clean` is applied to it once: cleaning pieces before joining them would let
    pieces each too short to count as an echo join into one (`client.sanitize` cleans).
    """
    body = _error_json(content)
    try:
        if body is not None:  # JSON null is shown as text: "null"
            return clean(_message(body, limit)[:limit])
    except (ValueError, RecursionError):  # nested too deep to walk: as text
        pass
    return clean(content[: limit * 4].decode("utf-8", errors="replace").strip()[:limit])


def _message(body: Any, limit: int) -> str:
    """The provider's own message out of a decoded error body (see `error_message`)."""
    message: Any = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            message = error.get("message")
        elif isinstance(error, str):
            kind = body.get("error_type")
            message = f"{error} ({kind})" if isinstance(kind, str) and kind else error
        if message is None:
            message = body.get("message", body.get("detail"))
    if isinstance(message, list):
        return _fastapi_detail(message, limit)
    if message is None:
        return json.dumps(_without_echo(body))
    return message if isinstance(message, str) else json.dumps(_without_echo(message))
