"""Value types that cross the library's boundary: candidates in, reranked results out."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import is_, itemgetter
from types import MappingProxyType
from typing import Any, Generic, TypeVar

__all__ = [
    "Candidate",
    "ClientResponse",
    "RerankResponse",
    "Reranked",
    "Usage",
    "recall_order",
    "reranked_outputs",
    "trusted_indices",
]

T = TypeVar("T")

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


@dataclass(frozen=True, slots=True)
class Candidate:
    """One recalled item: the caller's `id`, the `text` to score, and its recall `score`.

    `metadata` travels to the trace as a JSON string; it never affects ranking.
    """

    id: str
    text: str
    score: float | None = None
    # Left out of the hash (a mapping is not hashable) but compared, so Candidates can key
    # dicts and sets: equal candidates still hash equal.
    metadata: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str):
            raise TypeError(f"Candidate.id must be a str, got {type(self.id).__name__}")
        if not isinstance(self.text, str):
            raise TypeError(
                f"Candidate.text must be a str, got {type(self.text).__name__} (id={self.id!r})"
            )
        if self.score is not None and (
            isinstance(self.score, bool)
            or not isinstance(self.score, (int, float))
            or not _finite(self.score)
        ):
            raise ValueError(
                f"Candidate.score must be a finite number or None, got {self.score!r} "
                f"(id={self.id!r})"
            )


def recall_order(candidates: Sequence[Candidate]) -> list[int]:
    """Input positions ordered by recall score, best first; stable; missing scores last.

    The order the stage falls back to, and the "before" of every comparison of rankings.
    """
    # A stable sort with reverse=True keeps equal scores in input order: the same order as the
    # key (score is None, -score, position), at C speed (no Python key function per candidate).
    scores = [c.score for c in candidates]
    score_of: Callable[[int], float] = scores.__getitem__  # type: ignore[assignment]
    if None not in scores:
        return sorted(range(len(scores)), key=score_of, reverse=True)
    ranked = [i for i, s in enumerate(scores) if s is not None]
    ranked.sort(key=score_of, reverse=True)
    return ranked + [i for i, s in enumerate(scores) if s is None]


@dataclass(frozen=True, slots=True)
class Reranked:
    """One output of the stage.

    `candidate` is the caller's own `Candidate` object (identity preserved). `score` is the
    reranker's score, or the recall score when the stage fell back to recall order (then
    `reranked` is False and `score` may be None for a candidate that had no recall score).
    `input_index` is the candidate's position in the input list.
    """

    candidate: Candidate
    score: float | None
    input_index: int
    reranked: bool = True


_new = object.__new__
_slots = vars(Reranked)  # the slot descriptors the dataclass made
_set_candidate = _slots["candidate"].__set__
_set_score = _slots["score"].__set__
_set_input_index = _slots["input_index"].__set__
_set_reranked = _slots["reranked"].__set__


def reranked_outputs(
    candidates: Sequence[Candidate], mapped: Sequence[tuple[int, float]]
) -> list[Reranked]:
    """``[Reranked(candidates[i], score, i) for i, score in mapped]``, equal object for object.

    Each field is stored through its slot's own descriptor: the frozen dataclass's
    ``__init__`` stores field by field through ``object.__setattr__``, which made building the
    50 outputs of a call the largest piece of the stage's own work around a sampled-out
    rerank (issue 26). The objects are as frozen as any other `Reranked`.
    """
    out: list[Reranked] = []
    append = out.append
    for i, score in mapped:
        r = _new(Reranked)
        _set_candidate(r, candidates[i])
        _set_score(r, score)
        _set_input_index(r, i)
        _set_reranked(r, True)
        append(r)
    return out


@dataclass(frozen=True, slots=True)
class Usage:
    """What the provider reported it spent on a call, summed over sub-batches.

    Fields are None when the provider did not report them.
    """

    total_tokens: int | None = None
    search_units: float | None = None

    def __add__(self, other: Usage) -> Usage:
        def add(a: Any, b: Any) -> Any:
            if a is None:
                return b
            if b is None:
                return a
            return a + b

        return Usage(
            total_tokens=add(self.total_tokens, other.total_tokens),
            search_units=add(self.search_units, other.search_units),
        )


@dataclass(frozen=True, slots=True)
class RerankResponse(Generic[T]):
    """A rerank call's results with what it cost.

    `results` are the caller's items with scores, best first. `requests` counts HTTP requests
    sent (retries included), `retries` the retried attempts, `batches` the sub-batches.

    `indices`, when the reranker knows them (the HTTP clients do: the APIs answer by index),
    is each result's position in the items it was given, in the order of `results`.
    `RerankStage` takes them as they are only from a `ClientResponse` whose indices name its
    own candidates (`trusted_indices`); any other response's results are checked one by one
    against the candidates (`protocols.map_results`).
    """

    results: list[tuple[T, float]]
    usage: Usage = field(default_factory=Usage)
    model: str | None = None
    requests: int = 0
    retries: int = 0
    batches: int = 0
    indices: list[int] | None = None


@dataclass(frozen=True, slots=True)
class ClientResponse(RerankResponse[T]):
    """A `RerankResponse` made by this library's HTTP clients, and only there (`_finish`).

    Its `indices` are the server's own answers, each checked before it was used (an int in
    range, once, with a finite float score, as many as expected: `providers.parse_response`)
    and each result's item is ``items[indices[j]]`` of a copy of the items given. So
    `RerankStage` maps it without checking every result against its candidates again, once
    each index names its own candidate (`trusted_indices`: a wrapper may have given our
    client other items), which it does for any other reranker's answer.
    """

    served_model: str | None = None
    """The model the server's answer named (its ``model`` field), None when it named none;
    `model` falls back to the configured or ``/info``-reported one. What the span's
    ``gen_ai.response.model`` takes (`retrieval_stage.spans.genai`)."""


_ITEM = itemgetter(0)


def trusted_indices(items: Sequence[Any], response: RerankResponse[Any]) -> list[int] | None:
    """`response.indices` when they are provably each result's position in `items`, else None.

    Only a `ClientResponse` qualifies: its indices were each checked against the server's
    reply (an int, in range, once, with a finite float score, as many as expected). But they
    are positions in the items its client was given, and a reranker wrapping our client may
    have given it a reordered or filtered copy. So they are taken only where each names the
    result's own item in `items` (``items[i] is item``, checked at C speed); any other answer
    is for the caller to check result by result (`protocols.map_results`).
    """
    indices = response.indices
    if type(response) is not ClientResponse or indices is None:
        return None
    results = response.results
    if len(indices) != len(results) or (indices and min(indices) < 0):
        return None
    try:
        named = list(map(items.__getitem__, indices))
    except IndexError:
        return None
    return indices if all(map(is_, named, map(_ITEM, results))) else None
