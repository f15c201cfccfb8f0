"""What the three framework adapters share, with no framework imported here.

An adapter holds a `Stages`: the `RerankStage` its sync path delegates to and the one its async
path does (the same stage when the caller gave a reranker; two, each made on first use, when
the reranker is built from `RerankSettings`, so an async framework call gets a real
`AsyncRerankClient` rather than a thread). The adapter itself only converts documents.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Mapping
from typing import Any

from retrieval_stage import RerankStage, validate
from retrieval_stage.config import RerankSettings, make_async_reranker, make_reranker
from retrieval_stage.spans.content import as_text

__all__ = ["RERANKED", "RETRIEVAL_SCORE", "Stages", "candidate_id", "recall_score"]

_STAGE_SIGNATURE = inspect.signature(RerankStage)
"""`RerankStage`'s keywords, to refuse an option it does not take."""

RETRIEVAL_SCORE = "retrieval_score"
"""Metadata key of the recall score on every document an adapter returns."""

RERANKED = "reranked"
"""Metadata key saying whether the reranker ordered and scored the document (False after a
fallback to recall order, when the score slot still holds the recall score)."""


class Stages:
    """The stage(s) one adapter delegates to: from a reranker, or from settings.

    `reranker` and `settings` are alternatives; with neither, settings come from the
    ``RERANK_*`` environment (`RerankSettings.from_env`: reranking off when no endpoint is
    set). `stage_options` are `RerankStage`'s keywords; they are checked here, at construction,
    so a typo fails where it was written rather than at the first query.
    """

    def __init__(
        self,
        reranker: Any,
        *,
        top_k: int | None,
        settings: RerankSettings | None,
        stage_options: Mapping[str, Any],
    ) -> None:
        if reranker is not None and settings is not None:
            raise TypeError("give either a reranker or settings, not both")
        if settings is not None and not isinstance(settings, RerankSettings):
            raise TypeError(
                f"settings must be a retrieval_stage.config.RerankSettings, "
                f"got {type(settings).__name__}"
            )
        self.options: dict[str, Any] = {"top_k": top_k, **stage_options}
        self.reranker = reranker
        self.settings = settings
        self._sync: RerankStage | None = None
        self._async: RerankStage | None = None
        if reranker is not None:
            self._sync = self._async = RerankStage(reranker, **self.options)
        else:
            if self.settings is None:
                self.settings = RerankSettings.from_env()
            # A misspelt option fails here as it would building the stage (TypeError), a bad
            # value with the stage's own rule (`InvalidSetting`); no stage is built.
            try:
                _STAGE_SIGNATURE.bind(None, **self.options)
            except TypeError as exc:  # say whose keyword it is, as building the stage does
                raise TypeError(f"RerankStage.__init__() {exc}") from None
            validate.stage_options(self.options)

    @property
    def top_k(self) -> int | None:
        """The stage's own top_k (None: keep all)."""
        top_k: int | None = self.options["top_k"] or None
        return top_k

    def sync(self) -> RerankStage:
        """The stage for the framework's sync path (built from settings on first use)."""
        if self._sync is None:
            self._sync = RerankStage(make_reranker(self.settings), **self.options)
        return self._sync

    def asynchronous(self) -> RerankStage:
        """The stage for the framework's async path: an awaitable reranker where built from
        settings; a caller's sync reranker runs in a worker thread (`RerankStage.arun`)."""
        if self._async is None:
            self._async = RerankStage(make_async_reranker(self.settings), **self.options)
        return self._async


def recall_score(value: Any) -> float | None:
    """The framework's score as a recall score: a finite real number, else None (no score)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        score = float(value)
    except (OverflowError, ValueError):
        return None
    return score if math.isfinite(score) else None


def candidate_id(value: Any, position: int) -> str:
    """The framework's document id as a candidate id; the input position when it has none.

    The id is taken as the spans take text (`spans.content.as_text`): a str subclass (a str
    Enum member) by its characters, as the framework's own JSON writes it; anything else by
    ``str``, and one whose ``str`` raises as its ``<unprintable ...>`` placeholder rather than
    failing the call. Results are joined back to documents by position (the stage tracks
    identity), never by id, so a missing or repeated id labels the span but cannot move a score.
    """
    if value is None or value == "":
        return str(position)
    return as_text(value)
