"""`InProcessModel.rerank`, written once for every in-process model: each score stays with the
item it was computed for, and a model that answers with the wrong number of scores is refused."""

from __future__ import annotations

from typing import Any

import pytest

from retrieval_stage import RerankProtocolError
from retrieval_stage.local.base import InProcessModel


class _ByLength(InProcessModel):
    """Scores a text by its length; `drop` leaves the last score out."""

    def __init__(self, *, drop: bool = False) -> None:
        super().__init__()
        self.drop = drop
        self.seen: list[list[str]] = []

    @property
    def model_name(self) -> str:
        return "by-length"

    def _load(self) -> Any:
        return object()

    def _scores(self, query: str, texts: list[str]) -> list[float]:
        self.seen.append(texts)
        scores = [float(len(t)) for t in texts]
        return scores[:-1] if self.drop else scores


def test_each_item_keeps_its_own_score_best_first_and_ties_in_input_order() -> None:
    items = [{"id": "a", "t": "xx"}, {"id": "b", "t": "xxxx"}, {"id": "c", "t": "yy"}]
    ranked = _ByLength().rerank("q", items, text=lambda item: item["t"])
    assert [(item["id"], score) for item, score in ranked] == [("b", 4.0), ("a", 2.0), ("c", 2.0)]


def test_top_k_keeps_the_best_and_no_texts_asks_the_model_nothing() -> None:
    model = _ByLength()
    assert model.rerank("q", ["a", "abc", "ab"], top_k=2) == [("abc", 3.0), ("ab", 2.0)]
    assert model.rerank("q", []) == []
    assert model.seen == [["a", "abc", "ab"]]


def test_a_model_giving_fewer_scores_than_texts_is_refused() -> None:
    with pytest.raises(RerankProtocolError, match="2 scores for 3 texts"):
        _ByLength(drop=True).rerank("q", ["a", "b", "c"])
