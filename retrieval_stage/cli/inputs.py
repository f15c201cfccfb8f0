"""Reading what the user gives: candidates and documents as JSON lines, from a file or stdin,
and ``eval --candidates`` runs.

Every line is checked before anything is reranked; bad lines are reported with their numbers,
all of them in one message (exit 2), and nothing is written to stdout.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from ..models import Candidate
from .console import EXIT_USAGE, err, fail, note

__all__ = [
    "LineError",
    "bad_lines",
    "check_text",
    "parse_candidates",
    "read_candidates",
    "read_pools",
]

MAX_ERRORS_SHOWN = 10


@dataclass(frozen=True)
class LineError:
    """A problem with one input line (1-based)."""

    line: int
    message: str


def parse_candidates(lines: Sequence[str]) -> tuple[list[Candidate], list[LineError]]:
    """Candidates from JSON lines ``{"id", "text", "score"?, "metadata"?}``, and every error.

    Every line is checked before anything is reranked; blank lines are skipped, other keys
    ignored. An id is a non-empty JSON string (``7`` is refused, not turned into
    ``"7"``), unique; a text is not empty.
    """
    candidates: list[Candidate] = []
    errors: list[LineError] = []
    first_seen: dict[str, int] = {}
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        problem, candidate = _parse_line(raw)
        if candidate is not None and candidate.id in first_seen:
            problem = f'id "{candidate.id}" was already given on line {first_seen[candidate.id]}'
        if problem is not None:
            errors.append(LineError(number, problem))
            continue
        assert candidate is not None
        first_seen[candidate.id] = number
        candidates.append(candidate)
    return candidates, errors


def _parse_line(raw: str) -> tuple[str | None, Candidate | None]:
    """(problem, None) or (None, candidate): the same checks as ``eval --candidates``."""
    from ..jsonl import candidate_fields, json_object

    try:
        ident, text, score, metadata = candidate_fields(json_object(raw))
    except ValueError as exc:
        return str(exc), None
    assert text is not None  # required
    return None, Candidate(ident, text, score, metadata)


def _read_lines(source: str, what: str) -> list[str]:
    """The lines of `source` (a path, or ``-`` for stdin); exit 2 naming option `what` when it
    cannot be read.

    Read as bytes and decoded strictly: Python's stdin would turn bytes that are not UTF-8
    into lone surrogates, which fail much later (or go to the reranker as garbage). Lines end
    at ``\n`` only, as JSON lines do: a U+2028 inside a JSON string does not split its line.
    """
    name = "stdin" if source == "-" else source
    try:
        if source == "-":
            if sys.stdin is None or sys.stdin.closed:  # started with stdin closed (<&-)
                fail(EXIT_USAGE, f"{what} stdin: stdin is closed; pass {what} FILE")
            if sys.stdin.isatty():
                note(err(), "reading candidates from stdin (JSON lines; end with Ctrl-D)")
            data = _stdin_bytes()
        else:
            data = Path(source).read_bytes()
    except FileNotFoundError:
        fail(EXIT_USAGE, f"{what} {name}: no such file")
    except IsADirectoryError:
        fail(EXIT_USAGE, f"{what} {name}: is a directory")
    except OSError as exc:
        fail(EXIT_USAGE, f"{what} {name}: {exc.strerror or exc}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        fail(EXIT_USAGE, f"{what} {name}: line {line} is not UTF-8 text ({exc.reason})")
    return text.removeprefix("\ufeff").split("\n")


def _stdin_bytes() -> bytes:
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is not None:
        data: bytes = buffer.read()
        return data
    return str(sys.stdin.read()).encode("utf-8", errors="surrogateescape")


def check_text(value: str, what: str) -> None:
    """Exit 2 when `value` cannot be encoded as UTF-8: an argument in another encoding."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        fail(EXIT_USAGE, f"{what} is not UTF-8 text (is the terminal's locale UTF-8?)")


def read_candidates(source: str, what: str) -> list[Candidate]:
    """Every candidate of `source`, or exit 2 listing the bad lines; `what` names the option
    in messages (``--input``, ``--corpus``, ``--docs``)."""
    candidates, errors = parse_candidates(_read_lines(source, what))
    if errors:
        name = "stdin" if source == "-" else source
        bad_lines(what, name, errors, ", nothing reranked" if what == "--input" else "")
    return candidates


def read_pools(path: Path, documents: Mapping[str, Candidate]) -> dict[str, list[Candidate]]:
    """``eval --candidates``: each query's candidates (a TREC run or JSON lines, texts from
    `documents` where a line has none), every line checked; exit 2 listing the bad lines as
    `read_candidates` does, or naming the file when it cannot be read."""
    from ..evaluation.readers import EvalInputError, check_candidates

    try:
        pools, errors = check_candidates(path, documents)
    except EvalInputError as exc:
        fail(EXIT_USAGE, str(exc))
    if errors:
        found = [LineError(e.line or 0, e.reason) for e in errors]
        bad_lines("--candidates", str(path), found, ", nothing reranked")
    return pools


def bad_lines(what: str, name: str, errors: Sequence[LineError], consequence: str) -> NoReturn:
    """Exit 2: ``error: WHAT NAME: N bad lines<consequence>``, then each (the first
    `MAX_ERRORS_SHOWN`) as ``line N: why``."""
    shown = [f"line {e.line}: {e.message}" for e in errors[:MAX_ERRORS_SHOWN]]
    if len(errors) > MAX_ERRORS_SHOWN:
        shown.append(f"… and {len(errors) - MAX_ERRORS_SHOWN} more")
    plural = "s" if len(errors) > 1 else ""
    fail(EXIT_USAGE, f"{what} {name}: {len(errors)} bad line{plural}{consequence}", *shown)
