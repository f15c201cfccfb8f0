"""`BM25Recall` builds bm25s's index with numpy, so the [cli] extra needs no scipy: the same
documents and scores as bm25s's scipy build (its default when scipy is installed), over the
whole bundled corpus."""

from __future__ import annotations

from typing import Any

import pytest

from retrieval_stage.evaluation.corpus import EXAMPLE_QUERIES, data_path, load_corpus
from retrieval_stage.evaluation.readers import read_queries
from retrieval_stage.recall import BM25Recall

pytest.importorskip("scipy.sparse", reason="scipy (the test extra) builds the reference index")


@pytest.fixture(scope="module")
def recalls() -> tuple[BM25Recall, BM25Recall]:
    import bm25s

    documents = load_corpus()
    ours = BM25Recall(documents)
    reference = BM25Recall(documents)
    scipy_index = bm25s.BM25(k1=1.5, b=0.75, csc_backend="scipy")
    scipy_index.index(reference._tokenize([d.text for d in documents]), show_progress=False)
    reference._index = scipy_index
    reference._vocab = dict(scipy_index.vocab_dict)
    return ours, reference


def test_the_index_is_built_by_numpy() -> None:
    index: Any = BM25Recall(load_corpus()[:20])._index
    assert index.csc_backend == "numpy"


def test_numpy_and_scipy_indexes_recall_the_same_documents_and_scores(
    recalls: tuple[BM25Recall, BM25Recall],
) -> None:
    ours, reference = recalls
    queries = list(read_queries(data_path(EXAMPLE_QUERIES)).values())
    assert len(queries) >= 20
    for query in [*queries, "read a file line by line", "json dumps indent sort keys"]:
        got, expected = ours.recall(query, 50), reference.recall(query, 50)
        assert [c.id for c in got] == [c.id for c in expected], query
        assert [c.score for c in got] == pytest.approx([c.score for c in expected], rel=1e-6)
