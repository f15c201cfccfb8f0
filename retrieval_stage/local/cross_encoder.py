"""`CrossEncoderReranker`: a cross-encoder run in this process, so the main job needs no server."""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import RerankError, RerankProtocolError
from . import base
from .base import DEFAULT_LOCAL_MODEL, TORCH_INSTALL_HINT, InProcessModel, InThread
from .model_source import (
    ModelUnavailableError,
    cached_model_dir,
    check_cross_encoder,
    on_disk,
    resolve_model,
)

__all__ = ["AsyncCrossEncoderReranker", "CrossEncoderReranker"]


class CrossEncoderReranker(InProcessModel):
    """A sentence-transformers `CrossEncoder` scoring (query, text) pairs in process.

    `model` is a Hugging Face model id (default `DEFAULT_LOCAL_MODEL`, downloaded once into the
    Hugging Face cache) or the path of a local model directory (no network). The model is loaded
    on first use, or by `load()`; a model that cannot be loaded raises `RerankError`, so a
    `RerankStage` falls back to recall order as for any other reranker failure. Scores are what
    the model's head (and its configured activation) gives: their scale is model-specific.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] = DEFAULT_LOCAL_MODEL,
        *,
        device: str | None = None,
        batch_size: int = 32,
        max_length: int | None = None,
        local_files_only: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not base.local_available():
            raise ImportError(
                "the local cross-encoder needs sentence-transformers and torch (the [torch] "
                f"extra): {TORCH_INSTALL_HINT}"
            )
        self.model = os.fspath(model)
        self.device = device
        self.batch_size = batch_size
        self.max_length = max_length
        self.local_files_only = local_files_only
        super().__init__()
        found = on_disk(self.model)
        if found is not None:  # refused now, before anything loads or scores
            check_cross_encoder(found.location)

    @property
    def model_name(self) -> str:
        """The model id, or the directory's name for a local model."""
        path = Path(self.model)
        return path.name if path.is_dir() else self.model

    def __repr__(self) -> str:
        return f"CrossEncoderReranker(model={self.model!r}, device={self.device!r})"

    def _load(self) -> Any:
        try:
            source = resolve_model(
                self.model,
                default=DEFAULT_LOCAL_MODEL,
                local_files_only=self.local_files_only,
            )
        except ModelUnavailableError as exc:
            raise ModelUnavailableError(
                f"could not load cross-encoder {self.model!r}: {exc}"
            ) from exc
        if source.origin != "hub":
            check_cross_encoder(source.location)
        # Imported here, not at module level: the [torch] extra is optional and heavy.
        cross_encoder = importlib.import_module("sentence_transformers").CrossEncoder
        try:
            encoder = cross_encoder(
                source.location,
                device=self.device,
                max_length=self.max_length,
                local_files_only=source.local_files_only,
            )
        except Exception as exc:  # the loader raises OSError, ValueError, HTTP errors...
            raise RerankError(
                f"could not load cross-encoder {self.model!r}: {type(exc).__name__}: {exc}"
            ) from exc
        downloaded = cached_model_dir(source.location) if source.origin == "hub" else None
        if downloaded is not None:  # judged now that its files are on disk
            check_cross_encoder(downloaded)
        return encoder

    def _scores(self, query: str, texts: list[str]) -> list[float]:
        return self.score_pairs([(query, t) for t in texts])

    def score_pairs(self, pairs: Sequence[tuple[str, str]], *, raw: bool = False) -> list[float]:
        """One score per (query, text) pair, in order; each pair is read on its own, so the
        pairs may come from different queries (the rerank server batches requests so).

        Scores go through the model's activation (a sigmoid for one label) unless `raw`.
        `RerankError` when the model fails, `RerankProtocolError` for a score that is not a
        finite number or a count that does not match.
        """
        if not pairs:
            return []
        encoder = self._loaded()
        try:
            activation: Any = None
            if raw:
                import torch

                activation = torch.nn.Identity()
            out = encoder.predict(
                list(pairs),
                batch_size=self.batch_size,
                show_progress_bar=False,
                convert_to_numpy=True,
                activation_fn=activation,
            )
        except Exception as exc:  # torch and tokenizer errors have no common base
            raise RerankError(f"cross-encoder failed: {type(exc).__name__}: {exc}") from exc
        scores = [float(s) for s in out.reshape(-1).tolist()]
        if len(scores) != len(pairs):
            raise RerankProtocolError(
                f"cross-encoder returned {len(scores)} scores for {len(pairs)} texts"
            )
        for i, score in enumerate(scores):
            if not math.isfinite(score):
                raise RerankProtocolError(f"cross-encoder score {score!r} for item {i}")
        return scores

    @property
    def tokenizer(self) -> Any:
        """The loaded model's tokenizer (loads the model first)."""
        return self._loaded().tokenizer

    @property
    def max_input_length(self) -> int:
        """Tokens of one (query, text) pair the model reads; the rest is cut (loads the model)."""
        encoder = self._loaded()
        return int(encoder.max_length or encoder.tokenizer.model_max_length)


class AsyncCrossEncoderReranker(InThread[CrossEncoderReranker]):
    """The awaitable twin of `CrossEncoderReranker`: loads and scores in a worker thread."""

    def __init__(self, model: str | os.PathLike[str] = DEFAULT_LOCAL_MODEL, **kw: Any) -> None:
        self.sync = CrossEncoderReranker(model, **kw)
