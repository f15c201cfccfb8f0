"""Reading an evaluation's inputs: queries, relevance judgements and candidate runs.

The readers accept TREC formats (topics as ``qid<TAB>text``, qrels as ``qid iter docid rel``,
runs as ``qid Q0 docid rank score tag``) and JSON lines, and name the file and line of anything
they cannot read (`EvalInputError`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..jsonl import candidate_fields, check_id, check_unicode, json_object, json_type
from ..models import Candidate, recall_order

__all__ = [
    "EvalInputError",
    "Qrels",
    "check_candidates",
    "read_candidates",
    "read_qrels",
    "read_queries",
    "recall_ranking",
]

Qrels = dict[str, dict[str, int]]
"""Relevance judgements: query id → document id → grade (> 0 means relevant)."""


class EvalInputError(ValueError):
    """An input file that cannot be read; the message names the file and the line."""

    def __init__(self, path: str | Path, line: int | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.reason = message
        where = f"{self.path}, line {line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


def _lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, stripped line) for each line that is not blank or a # comment.

    Lines end at ``\n`` (so a U+2028 inside a JSON string stays in its line) and each is
    decoded strictly, so text that is not UTF-8 is reported with its line number.
    """
    try:
        with Path(path).open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    decoded = raw.decode("utf-8-sig" if number == 1 else "utf-8")
                except UnicodeDecodeError as exc:
                    raise EvalInputError(path, number, f"not UTF-8 text ({exc.reason})") from None
                line = decoded.strip()
                if line and not line.startswith("#"):
                    yield number, line
    except FileNotFoundError:
        raise EvalInputError(path, None, "no such file") from None
    except OSError as exc:
        raise EvalInputError(path, None, exc.strerror or str(exc)) from None


def _is_jsonl(path: str | Path) -> bool:
    first = next(_lines(path), None)
    return first is not None and first[1].startswith("{")


def _json_object(path: str | Path, number: int, line: str) -> dict[str, Any]:
    try:
        return json_object(line)
    except ValueError as exc:
        raise EvalInputError(path, number, str(exc)) from None


def _field(
    path: str | Path, number: int, record: Mapping[str, Any], names: Sequence[str], kind: str
) -> Any:
    for name in names:
        if name in record:
            value = record[name]
            if kind == "id":
                try:
                    return check_id(value, name)
                except ValueError as exc:
                    raise EvalInputError(path, number, str(exc)) from None
            if kind == "text":
                if not isinstance(value, str):
                    raise EvalInputError(
                        path, number, f'"{name}" must be a string, got {json_type(value)}'
                    )
                try:
                    check_unicode(value, name)
                except ValueError as exc:
                    raise EvalInputError(path, number, str(exc)) from None
            return value
    raise EvalInputError(path, number, f'missing "{names[0]}"')


def read_queries(path: str | Path) -> dict[str, str]:
    """Query id → text, from ``qid<TAB>text`` lines or JSON lines ``{"id", "text"}``.

    JSON lines may also spell the fields ``query_id``/``qid`` and ``query``.
    """
    queries: dict[str, str] = {}
    jsonl = _is_jsonl(path)
    for number, line in _lines(path):
        if jsonl:
            record = _json_object(path, number, line)
            qid = _field(path, number, record, ("id", "query_id", "qid"), "id")
            text = _field(path, number, record, ("text", "query"), "text")
        else:
            qid, tab, text = line.partition("\t")
            if not tab or not text.strip():
                raise EvalInputError(path, number, "expected <query id><TAB><query text>")
        if qid in queries:
            raise EvalInputError(path, number, f"query {qid!r} appears twice")
        queries[qid] = text.strip()
    return queries


def read_qrels(path: str | Path) -> Qrels:
    """Judgements from TREC qrels (``qid iter docid rel``) or JSON lines.

    JSON lines: ``{"query_id", "doc_id", "relevance"}``. Grades are integers; a document judged
    twice for one query is an error.
    """
    qrels: Qrels = {}
    jsonl = _is_jsonl(path)
    for number, line in _lines(path):
        if jsonl:
            record = _json_object(path, number, line)
            qid = _field(path, number, record, ("query_id", "qid"), "id")
            doc = _field(path, number, record, ("doc_id", "docid", "id"), "id")
            grade: Any = _field(path, number, record, ("relevance", "rel"), "grade")
        else:
            parts = line.split()
            if len(parts) != 4:
                raise EvalInputError(
                    path, number, f"expected 4 columns (qid iter docid rel), got {len(parts)}"
                )
            qid, _, doc, grade = parts
        try:
            value = _grade(grade)
        except ValueError:
            raise EvalInputError(
                path, number, f"relevance must be an integer, got {grade!r}"
            ) from None
        judged = qrels.setdefault(qid, {})
        if doc in judged:
            raise EvalInputError(path, number, f"{doc!r} is judged twice for query {qid!r}")
        judged[doc] = value
    return qrels


def _grade(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return int(value)
    raise ValueError(value)


def read_candidates(
    path: str | Path, documents: Mapping[str, Candidate] | None = None
) -> dict[str, list[Candidate]]:
    """Each query's recall candidates, in file order, from JSON lines or a TREC run.

    JSON lines: ``{"query_id", "id", "text", "score"?, "metadata"?}``; ``text`` may be left out
    when `documents` has the id. A TREC run (``qid Q0 docid rank score tag``) carries no text,
    so every docid must be in `documents`. A candidate listed twice for one query is an error.
    `EvalInputError` names the first bad line; `check_candidates` lists them all.
    """
    found, errors = check_candidates(path, documents)
    if errors:
        raise errors[0]
    return found


def check_candidates(
    path: str | Path, documents: Mapping[str, Candidate] | None = None
) -> tuple[dict[str, list[Candidate]], list[EvalInputError]]:
    """`read_candidates` that checks every line: the candidates of the good lines, and an
    `EvalInputError` per bad line, in file order. A file that cannot be read, or a line that
    is not UTF-8, still raises at once (the lines after it cannot be told apart)."""
    found: dict[str, list[Candidate]] = {}
    seen: dict[str, dict[str, int]] = {}
    errors: list[EvalInputError] = []
    jsonl = _is_jsonl(path)
    for number, line in _lines(path):
        try:
            qid, candidate = _candidate_line(path, number, line, jsonl, documents)
            first = seen.setdefault(qid, {}).get(candidate.id)
            if first is not None:
                raise EvalInputError(
                    path,
                    number,
                    f"{candidate.id!r} is listed twice for query {qid!r} (first on line {first})",
                )
        except EvalInputError as exc:
            errors.append(exc)
            continue
        seen[qid][candidate.id] = number
        found.setdefault(qid, []).append(candidate)
    return found, errors


def _candidate_line(
    path: str | Path,
    number: int,
    line: str,
    jsonl: bool,
    documents: Mapping[str, Candidate] | None,
) -> tuple[str, Candidate]:
    """(query id, candidate) of one line of a run; `EvalInputError` says what is wrong."""
    if jsonl:
        record = _json_object(path, number, line)
        qid = _field(path, number, record, ("query_id", "qid"), "id")
        try:
            doc, text, score, metadata = candidate_fields(
                record, id_keys=("id", "doc_id", "docid"), require_text=False
            )
        except ValueError as exc:
            raise EvalInputError(path, number, str(exc)) from None
    else:
        parts = line.split()
        if len(parts) != 6:
            raise EvalInputError(
                path,
                number,
                f"expected 6 columns (qid Q0 docid rank score tag), got {len(parts)}",
            )
        qid, doc, text, metadata = parts[0], parts[2], None, {}
        try:
            score = float(parts[4])
        except ValueError:
            raise EvalInputError(path, number, f"score {parts[4]!r} is not a number") from None
        if not math.isfinite(score):
            raise EvalInputError(path, number, f"score {parts[4]!r} is not finite")
    if text is None:
        known = documents.get(doc) if documents is not None else None
        if known is None:
            raise EvalInputError(
                path, number, f"no text for document {doc!r} (give it, or pass its corpus)"
            )
        text, metadata = known.text, metadata or dict(known.metadata)
    return qid, Candidate(doc, text, score, metadata)


def recall_ranking(candidates: Sequence[Candidate]) -> list[str]:
    """Document ids in recall order: by score, best first; unscored last; ties in input order."""
    return [candidates[i].id for i in recall_order(candidates)]
