"""In-process rerankers: a cross-encoder through sentence-transformers, and a lexical fallback.

`CrossEncoderReranker` is the embedded default: it runs a cross-encoder in this process, so the
main job needs no server. It needs the ``[local]`` extra (sentence-transformers and torch),
imported only when the model is first loaded, so importing this module costs nothing.

`LexicalReranker` is what runs when that extra is missing. It is honest about being a
bag-of-words heuristic: its `provider` is ``"lexical"``, which the stage writes to the span as
``retrieval_stage.provider``, and the command line says so and how to get a real reranker.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import itertools
import math
import os
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ._args import rank, snapshot
from .errors import RerankError, RerankProtocolError

__all__ = [
    "DEFAULT_LOCAL_MODEL",
    "INSTALL_HINT",
    "AsyncCrossEncoderReranker",
    "CrossEncoderReranker",
    "LexicalReranker",
    "local_available",
    "model_in_cache",
]

T = TypeVar("T")

DEFAULT_LOCAL_MODEL = "cross-encoder/ms-marco-MiniLM-L-6-v2"
"""A small (22M parameter) MS MARCO cross-encoder: fast on a CPU, a real lift over BM25."""

INSTALL_HINT = "pip install 'retrieval-stage[local]'"


def local_available() -> bool:
    """True when sentence-transformers can be imported (the ``[local]`` extra is installed)."""
    return importlib.util.find_spec("sentence_transformers") is not None


def model_in_cache(model: str) -> bool:
    """True when the Hugging Face cache already holds `model`, so loading needs no network."""
    try:
        hub = importlib.import_module("huggingface_hub")
        found = hub.try_to_load_from_cache(model, "config.json")
    except Exception:  # not installed, or not a valid repo id (a path, a typo)
        return False
    return isinstance(found, str)


class CrossEncoderReranker:
    """A sentence-transformers `CrossEncoder` scoring (query, text) pairs in process.

    `model` is a Hugging Face model id (default `DEFAULT_LOCAL_MODEL`, downloaded once into the
    Hugging Face cache) or the path of a local model directory (no network). The model is loaded
    on first use, or by `load()`; a model that cannot be loaded raises `RerankError`, so a
    `RerankStage` falls back to recall order as for any other reranker failure. Scores are what
    the model's head (and its configured activation) gives: their scale is model-specific.
    """

    provider = "local"

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
        if not local_available():
            raise ImportError(
                f"the local cross-encoder needs sentence-transformers: {INSTALL_HINT}"
            )
        self.model = os.fspath(model)
        self.device = device
        self.batch_size = batch_size
        self.max_length = max_length
        self.local_files_only = local_files_only
        self._encoder: Any = None
        self._lock = threading.Lock()

    @property
    def model_name(self) -> str:
        """The model id, or the directory's name for a local model."""
        path = Path(self.model)
        return path.name if path.is_dir() else self.model

    def __repr__(self) -> str:
        return f"CrossEncoderReranker(model={self.model!r}, device={self.device!r})"

    def close(self) -> None:
        """Drop the loaded model, so its memory can be freed; the next call loads it again."""
        with self._lock:
            self._encoder = None

    def __enter__(self) -> CrossEncoderReranker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def load(self) -> None:
        """Load the model now (idempotent); `RerankError` says why it could not be loaded."""
        with self._lock:
            if self._encoder is not None:
                return
            # Imported here, not at module level: the [local] extra is optional and heavy.
            cross_encoder = importlib.import_module("sentence_transformers").CrossEncoder
            try:
                self._encoder = cross_encoder(
                    self.model,
                    device=self.device,
                    max_length=self.max_length,
                    local_files_only=self.local_files_only,
                )
            except Exception as exc:  # the loader raises OSError, ValueError, HTTP errors...
                raise RerankError(
                    f"could not load cross-encoder {self.model!r}: {type(exc).__name__}: {exc}"
                ) from exc

    def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        """The items with the model's scores, best first; ties keep input order."""
        kept, texts, cap = snapshot(query, items, text, top_k)
        if not texts:
            return []
        self.load()
        try:
            raw = self._encoder.predict(
                [(query, t) for t in texts],
                batch_size=self.batch_size,
                show_progress_bar=False,
                convert_to_numpy=True,
            )
        except Exception as exc:  # torch and tokenizer errors have no common base
            raise RerankError(f"cross-encoder failed: {type(exc).__name__}: {exc}") from exc
        scores = [float(s) for s in raw.reshape(-1).tolist()]
        if len(scores) != len(texts):
            raise RerankProtocolError(
                f"cross-encoder returned {len(scores)} scores for {len(texts)} texts"
            )
        for i, score in enumerate(scores):
            if not math.isfinite(score):
                raise RerankProtocolError(f"cross-encoder score {score!r} for item {i}")
        return [(kept[i], s) for i, s in rank(list(enumerate(scores)), cap)]


class AsyncCrossEncoderReranker:
    """The awaitable twin of `CrossEncoderReranker`: scores in a worker thread.

    The model is CPU- (or GPU-) bound Python code; running it in a thread keeps the event loop
    serving other requests while it scores.
    """

    provider = "local"

    def __init__(self, model: str | os.PathLike[str] = DEFAULT_LOCAL_MODEL, **kw: Any) -> None:
        self.sync = CrossEncoderReranker(model, **kw)

    @property
    def model_name(self) -> str:
        """The wrapped reranker's model name."""
        return self.sync.model_name

    def __repr__(self) -> str:
        return f"Async{self.sync!r}"

    async def aclose(self) -> None:
        """Drop the loaded model (see `CrossEncoderReranker.close`)."""
        self.sync.close()

    async def __aenter__(self) -> AsyncCrossEncoderReranker:
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
        """`CrossEncoderReranker.rerank` in a worker thread."""
        return await asyncio.to_thread(self.sync.rerank, query, items, text=text, top_k=top_k)


_WORD = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset(
    (
        "a", "an", "and", "are", "as", "at", "be", "but", "by", "can", "do", "does", "for",
        "from", "how", "i", "if", "in", "into", "is", "it", "its", "of", "on", "or", "that",
        "the", "this", "to", "was", "what", "when", "where", "which", "while", "who", "why",
        "will", "with", "you", "your",
    )
)  # fmt: skip


def _stem(word: str) -> str:
    """A crude suffix strip so that 'files'/'file' and 'sorting'/'sort' meet."""
    for suffix in ("ing", "ies", "ed", "es", "ly", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)] + ("y" if suffix == "ies" else "")
    return word


def _terms(text: str) -> list[str]:
    return [_stem(w) for w in _WORD.findall(text.lower()) if w not in _STOPWORDS and len(w) > 1]


class LexicalReranker:
    """A bag-of-words reranker: no model, no server, and it says so.

    Each text scores in [0, 1]: 0.6 x the IDF-weighted share of the query's terms it contains
    (IDF over the candidates given), 0.2 x the share of adjacent query-term pairs that occur
    within three words of each other, 0.2 x the IDF-weighted share of query terms in its first
    twelve words (a name and first sentence). It rewards coverage and proximity that BM25
    ignores, but understands no meaning: use the cross-encoder or a rerank service for that.
    """

    provider = "lexical"
    model_name = "lexical-coverage-proximity"

    _LEAD_WORDS = 12
    _WINDOW = 3

    def __repr__(self) -> str:
        return "LexicalReranker()"

    def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        """The items with their lexical scores, best first; ties keep input order."""
        kept, texts, cap = snapshot(query, items, text, top_k)
        if not texts:
            return []
        query_terms = list(dict.fromkeys(_terms(query)))
        docs = [_terms(t) for t in texts]
        n = len(docs)
        document_frequency = {term: sum(1 for d in docs if term in set(d)) for term in query_terms}
        idf = {
            t: math.log(1.0 + (n - df + 0.5) / (df + 0.5)) for t, df in document_frequency.items()
        }
        scores = [self._score(query_terms, idf, d) for d in docs]
        return [(kept[i], s) for i, s in rank(list(enumerate(scores)), cap)]

    def _score(self, query_terms: list[str], idf: dict[str, float], doc: list[str]) -> float:
        total = sum(idf.values())
        if not query_terms or total <= 0.0 or not doc:
            return 0.0
        present = set(doc)
        coverage = sum(idf[t] for t in query_terms if t in present) / total
        lead = set(doc[: self._LEAD_WORDS])
        lead_share = sum(idf[t] for t in query_terms if t in lead) / total
        pairs = list(itertools.pairwise(query_terms))
        proximity = sum(self._near(doc, a, b) for a, b in pairs) / len(pairs) if pairs else 0.0
        return 0.6 * coverage + 0.2 * proximity + 0.2 * lead_share

    def _near(self, doc: list[str], a: str, b: str) -> bool:
        at_a = [i for i, w in enumerate(doc) if w == a]
        if not at_a:
            return False
        at_b = [i for i, w in enumerate(doc) if w == b]
        return any(abs(i - j) <= self._WINDOW for i in at_a for j in at_b)
