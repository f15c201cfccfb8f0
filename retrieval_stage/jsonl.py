"""JSON lines, read one way everywhere: the corpus loader, ``rerank --input``, ``--corpus``,
``--docs`` and ``eval``'s files give the same line the same verdict, with its number.

The rules for a candidate's fields live here too (`candidate_fields`), so an id, a text or a
score is accepted or refused with the same words whichever command reads it. Ids are JSON
strings: an id given as the number ``7`` is refused, never turned into ``"7"`` (a join on ids
downstream would silently break on the changed type).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

__all__ = [
    "JsonLineError",
    "candidate_fields",
    "check_id",
    "check_unicode",
    "json_lines",
    "json_object",
    "json_type",
]


class JsonLineError(ValueError):
    """A line that is not what it should be; `line` is its 1-based number."""

    def __init__(self, line: int, message: str) -> None:
        self.line = line
        self.reason = message
        super().__init__(f"line {line}: {message}")


def json_lines(lines: Iterable[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based line number, object) for each line that is not blank; `JsonLineError` at the
    first line that is not a JSON object."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield number, json_object(line)
        except ValueError as exc:
            raise JsonLineError(number, str(exc)) from None


def json_object(line: str) -> dict[str, Any]:
    """One JSON line as an object; ValueError with a message for people otherwise."""
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise ValueError("not valid JSON: nested too deeply") from None
    except ValueError as exc:  # an integer with more digits than Python converts
        raise ValueError(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {json_type(value)}")
    return value


def json_type(value: Any) -> str:
    """How JSON names `value`'s type, for messages: ``an array``, ``a string``, ``null``..."""
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}
    names.update({list: "an array", dict: "an object", type(None): "null"})
    return names.get(type(value), type(value).__name__)


def check_id(value: Any, key: str) -> str:
    """`value` as an id: a non-empty JSON string, or ValueError saying why not."""
    if not isinstance(value, str):
        if isinstance(value, int) and not isinstance(value, bool):
            raise ValueError(
                f'"{key}" must be a string, got the number {value} (write "{value}": ids are '
                "kept as given, never converted)"
            )
        raise ValueError(f'"{key}" must be a string, got {json_type(value)}')
    if not value.strip():
        raise ValueError(f'"{key}" must not be empty')
    check_unicode(value, key)
    return value


def candidate_fields(
    record: Mapping[str, Any], *, id_keys: Sequence[str] = ("id",), require_text: bool = True
) -> tuple[str, str | None, float | None, dict[str, Any]]:
    """(id, text, score, metadata) of one candidate's JSON object, checked; ValueError says why.

    The one parser of a candidate line, for ``rerank --input``, ``demo --corpus``,
    ``eval --docs`` and ``eval --candidates``. The id is the first of `id_keys` present, a
    non-empty string; `text` a non-empty string (None when absent and not `require_text`);
    `score` a finite number or null, as a float; `metadata` an object or null. Strings must be
    valid Unicode: a JSON escape of a lone surrogate (``"\\udce9"``) could be neither sent nor
    printed.
    """
    key = next((k for k in id_keys if k in record), None)
    if key is None:
        raise ValueError(f'missing "{id_keys[0]}"')
    ident = check_id(record[key], key)
    text = record.get("text")
    if text is None:
        if require_text:
            raise ValueError('missing "text"')
    elif not isinstance(text, str):
        raise ValueError(f'"text" must be a string, got {json_type(text)}')
    elif not text.strip():
        raise ValueError('"text" must not be empty')
    else:
        check_unicode(text, "text")
    return ident, text, _score(record.get("score")), _metadata(record.get("metadata"))


def check_unicode(value: str, key: str) -> None:
    if value.isascii():
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f'"{key}" is not valid Unicode (a lone surrogate at character {exc.start})'
        ) from None


def _score(score: Any) -> float | None:
    """A finite float or None; NaN and ±Infinity (which Python's JSON reads) named as such."""
    if score is None:
        return None
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        raise ValueError(f'"score" must be a finite number or null, got {json_type(score)}')
    try:
        value = float(score)
    except OverflowError:  # an integer too large for a float
        raise ValueError(
            '"score" must be a finite number or null, got a number out of range'
        ) from None
    if math.isnan(value):
        raise ValueError('"score": NaN is not a score (use null for no score)')
    if math.isinf(value):
        sign = "-" if value < 0 else ""
        raise ValueError(f'"score": {sign}Infinity is not a score (use null for no score)')
    return value


def _metadata(metadata: Any) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise ValueError(f'"metadata" must be an object or null, got {json_type(metadata)}')
    return metadata
