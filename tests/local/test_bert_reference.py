"""The numpy encoder against reference embeddings shipped with the tests: checked where torch
and sentence-transformers are not installed (the images' and ``make demo``'s install).

``data/minilm_reference.json`` holds the packaged all-MiniLM-L6-v2's embeddings of five texts
(one past the 256-token cut) as sentence-transformers made them, rounded to 1e-5. Regenerate
with sentence-transformers' ``SentenceTransformer(packaged_path()).encode(texts)`` if the
packaged model changes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("numpy", reason="the numpy backend needs the [local] extra")
pytest.importorskip("tokenizers", reason="the numpy backend needs the [local] extra")
pytest.importorskip("safetensors", reason="the numpy backend needs the [local] extra")

import numpy as np

from retrieval_stage.local import BertEncoder

from .._minilm import packaged_path

REFERENCE = Path(__file__).parent / "data" / "minilm_reference.json"
COMPONENT_TOLERANCE = 1e-4
"""The rounding (5e-6) plus float32 sums in another order, with room to spare: a wrong
attention scale moves components by ~1e-2."""
COSINE_FLOOR = 1 - 1e-6


def test_the_numpy_encoder_reproduces_the_reference_embeddings() -> None:
    reference = json.loads(REFERENCE.read_text(encoding="utf-8"))
    expected = np.asarray(reference["embeddings"], dtype=np.float64)
    assert expected.shape == (5, 384)
    got = np.asarray(
        BertEncoder.from_directory(packaged_path()).embed(reference["texts"], role="document"),
        dtype=np.float64,
    )
    assert got.shape == expected.shape
    worst = float(np.abs(got - expected).max())
    assert worst < COMPONENT_TOLERANCE, worst
    cosines = (got * expected).sum(axis=1) / (
        np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1)
    )
    assert float(cosines.min()) > COSINE_FLOOR, cosines
