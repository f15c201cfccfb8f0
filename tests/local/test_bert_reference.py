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


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_the_numpy_encoder_reproduces_the_reference_embeddings(workers: int) -> None:
    """On one thread and with its batches side by side (`workers`), each text its own row."""
    reference = json.loads(REFERENCE.read_text(encoding="utf-8"))
    expected = np.asarray(reference["embeddings"], dtype=np.float64)
    assert expected.shape == (5, 384)
    encoder = BertEncoder.from_directory(packaged_path())
    got = np.asarray(
        encoder.embed(reference["texts"], role="document", batch_size=2, workers=workers),
        dtype=np.float64,
    )
    assert got.shape == expected.shape
    worst = float(np.abs(got - expected).max())
    assert worst < COMPONENT_TOLERANCE, worst
    cosines = (got * expected).sum(axis=1) / (
        np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1)
    )
    assert float(cosines.min()) > COSINE_FLOOR, cosines


def test_batches_side_by_side_give_every_text_its_own_embedding() -> None:
    """Many texts of many lengths (the batches are made longest first, then put back): on 2
    and 4 workers, each row equals the one-thread row of the same text."""
    encoder = BertEncoder.from_directory(packaged_path())
    words = [
        "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "rust",
        "parses", "json",
    ]  # fmt: skip
    texts = [" ".join(words[(i * 5 + k) % len(words)] for k in range(1 + (i * 7) % 40))
             for i in range(51)]  # fmt: skip
    alone = encoder.embed(texts, role="document", batch_size=8)
    for workers in (2, 4):
        side_by_side = encoder.embed(texts, role="document", batch_size=8, workers=workers)
        assert side_by_side.shape == alone.shape
        worst = float(np.abs(side_by_side - alone).max())
        assert worst < 1e-5, (workers, worst)
        # No row is another text's: each is nearest to its own.
        nearest = (side_by_side @ alone.T).argmax(axis=1)
        assert nearest.tolist() == list(range(len(texts)))
