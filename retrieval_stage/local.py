"""In-process rerankers: a cross-encoder and an embedding model through sentence-transformers,
and a lexical fallback.

`CrossEncoderReranker` runs a cross-encoder in this process, so the main job needs no server.
`EmbeddingReranker` scores by the cosine of embeddings from any sentence-transformers embedding
model; its default, all-MiniLM-L6-v2, is installed with the package's ``[local]`` extra, so it
runs offline on any machine. Both need that extra (sentence-transformers and torch), imported
only when a model is first loaded, so importing this module costs nothing. Where a model's files
come from is decided in one place, `retrieval_stage.model_source`.

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
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from ._args import rank, snapshot
from .errors import RerankError, RerankProtocolError
from .model_source import (
    DEFAULT_EMBEDDING_MODEL,
    ModelSource,
    ModelUnavailableError,
    cached_model_dir,
    check_cross_encoder,
    display_name,
    packaged_model_path,
    resolve_model,
)

__all__ = [
    "DEFAULT_EMBEDDING_MODEL",
    "DEFAULT_LOCAL_MODEL",
    "INSTALL_HINT",
    "AsyncCrossEncoderReranker",
    "AsyncEmbeddingReranker",
    "CrossEncoderReranker",
    "EmbeddingCache",
    "EmbeddingReranker",
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


def _files_on_disk(model: str) -> Path | None:
    """The directory holding `model` when it is on this machine (no network): else None."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    return packaged_model_path(model) or cached_model_dir(model)


def model_in_cache(model: str) -> bool:
    """True when the Hugging Face cache already holds `model`, so loading needs no network."""
    try:
        hub = importlib.import_module("huggingface_hub")
        found = hub.try_to_load_from_cache(model, "config.json")
    except Exception:  # not installed, or not a valid repo id (a path, a typo)
        return False
    return isinstance(found, str)


_M = TypeVar("_M", bound="_InProcessModel")
_A = TypeVar("_A", bound="_InThread[Any]")
_S = TypeVar("_S", bound="_InProcessModel")


class _InProcessModel:
    """What every in-process model reranker shares: loaded once on first use (or by `load()`)
    under a lock, dropped by `close()`, usable as a context manager. Subclasses say how to
    load in `_load`."""

    provider = "local"

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

    def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        """The items with the model's scores, best first; ties keep input order."""
        raise NotImplementedError

    def load(self) -> None:
        """Load the model now (idempotent); `RerankError` says why it could not be loaded."""
        self._loaded()

    def _loaded(self) -> Any:
        """The loaded model, loading it first if needed. Callers keep the returned object:
        a `close()` from another thread between two reads of the attribute cannot leave them
        holding None."""
        with self._lock:
            if self._encoder is None:
                self._encoder = self._load()
            return self._encoder

    def close(self) -> None:
        """Drop the loaded model, so its memory can be freed; the next call loads it again."""
        with self._lock:
            self._encoder = None

    def __enter__(self: _M) -> _M:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _InThread(Generic[_S]):
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


class CrossEncoderReranker(_InProcessModel):
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
        if not local_available():
            raise ImportError(
                f"the local cross-encoder needs sentence-transformers: {INSTALL_HINT}"
            )
        self.model = os.fspath(model)
        self.device = device
        self.batch_size = batch_size
        self.max_length = max_length
        self.local_files_only = local_files_only
        super().__init__()
        on_disk = _files_on_disk(self.model)
        if on_disk is not None:  # refused now, before anything loads or scores
            check_cross_encoder(on_disk)

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
        # Imported here, not at module level: the [local] extra is optional and heavy.
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
        encoder = self._loaded()
        try:
            raw = encoder.predict(
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


class AsyncCrossEncoderReranker(_InThread[CrossEncoderReranker]):
    """The awaitable twin of `CrossEncoderReranker`: loads and scores in a worker thread."""

    def __init__(self, model: str | os.PathLike[str] = DEFAULT_LOCAL_MODEL, **kw: Any) -> None:
        self.sync = CrossEncoderReranker(model, **kw)


class EmbeddingCache:
    """Document embeddings kept in memory, keyed by (model, text).

    Reranking a known corpus with a filled cache costs one query embedding. `max_entries`
    bounds it (least recently used dropped first; None: unbounded). Safe to share between
    threads and between rerankers: the key names the model, so models never mix. `hits` and
    `misses` count look-ups.
    """

    def __init__(self, max_entries: int | None = None) -> None:
        if max_entries is not None and (isinstance(max_entries, bool) or max_entries < 1):
            raise ValueError(f"max_entries must be >= 1 or None, got {max_entries!r}")
        self.max_entries = max_entries
        self.hits = 0
        self.misses = 0
        self._vectors: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._vectors)

    def __repr__(self) -> str:
        return f"EmbeddingCache({len(self)} embeddings, max_entries={self.max_entries})"

    def get(self, model: str, text: str) -> Any:
        """The cached vector of `text` under `model`, or None."""
        with self._lock:
            vector = self._vectors.get((model, text))
            if vector is None:
                self.misses += 1
                return None
            self._vectors.move_to_end((model, text))
            self.hits += 1
            return vector

    def put(self, model: str, text: str, vector: Any) -> None:
        """Keep `vector` (copied, read-only) as the embedding of `text` under `model`."""
        kept = vector.copy()
        kept.setflags(write=False)
        with self._lock:
            self._vectors[(model, text)] = kept
            self._vectors.move_to_end((model, text))
            if self.max_entries is not None:
                while len(self._vectors) > self.max_entries:
                    self._vectors.popitem(last=False)

    def clear(self) -> None:
        """Forget every embedding (the counters stay)."""
        with self._lock:
            self._vectors.clear()


class EmbeddingReranker(_InProcessModel):
    """Scores each text by the cosine of its embedding with the query's, in process.

    Any sentence-transformers embedding model (a bi-encoder): `model` is a directory, an
    installed model package or a hub name, resolved offline first (`resolve_model`); None is
    the packaged all-MiniLM-L6-v2. Embeddings are normalised, so the score is their dot product,
    in [-1, 1]. A model's configured query and document prompts are applied (e5- and bge-style
    models need them). With an `EmbeddingCache`, a document embedded once is never embedded
    again by this model. A model that cannot be loaded or fails raises `RerankError`, so a
    `RerankStage` falls back to recall order.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        device: str | None = None,
        batch_size: int = 32,
        max_length: int | None = None,
        local_files_only: bool = False,
        cache: EmbeddingCache | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_length is not None and max_length < 1:
            raise ValueError(f"max_length must be >= 1 or None, got {max_length}")
        if not local_available():
            raise ImportError(f"the embedding reranker needs sentence-transformers: {INSTALL_HINT}")
        self.model = None if model is None else os.fspath(model)
        self.device = device
        self.batch_size = batch_size
        self.max_length = max_length
        self.local_files_only = local_files_only
        self.cache = cache
        self.source: ModelSource | None = None
        super().__init__()
        self._model_name = display_name(self.model, DEFAULT_EMBEDDING_MODEL)

    @property
    def model_name(self) -> str:
        """The hub name for the packaged or a cached model, the directory's name for a directory."""
        return self._model_name

    @property
    def cache_key(self) -> str:
        """What names this model in an `EmbeddingCache`: where it loaded from, and its length cap.

        Known once the model is loaded (`load()`).
        """
        if self.source is None:
            raise RuntimeError("the model is not loaded yet: call load() first")
        return f"{self.source.location}\x00max_length={self.max_length}"

    def __repr__(self) -> str:
        return f"EmbeddingReranker(model={self.model_name!r}, device={self.device!r})"

    def _load(self) -> Any:
        try:
            source = resolve_model(
                self.model,
                default=DEFAULT_EMBEDDING_MODEL,
                local_files_only=self.local_files_only,
            )
        except ModelUnavailableError as exc:
            raise ModelUnavailableError(f"could not load embedding model: {exc}") from exc
        # Imported here, not at module level: the [local] extra is optional and heavy.
        sentence_transformer = importlib.import_module("sentence_transformers").SentenceTransformer
        try:
            encoder = sentence_transformer(
                source.location,
                device=self.device,
                local_files_only=source.local_files_only,
            )
            if self.max_length is not None:
                encoder.max_seq_length = self.max_length
        except Exception as exc:  # the loader raises OSError, ValueError, HTTP errors...
            raise RerankError(
                f"could not load embedding model {source.location!r}: {type(exc).__name__}: {exc}"
            ) from exc
        self.source = source
        return encoder

    def _encode(self, texts: list[str], role: str) -> Any:
        """Normalised float32 embeddings of `texts` (one row each) as the query or documents."""
        import numpy as np

        encoder = self._loaded()
        method = getattr(encoder, f"encode_{role}", None) or encoder.encode
        try:
            vectors = method(
                texts,
                batch_size=self.batch_size,
                show_progress_bar=False,
                convert_to_numpy=True,
                normalize_embeddings=True,
            )
        except Exception as exc:  # torch and tokenizer errors have no common base
            raise RerankError(f"embedding model failed: {type(exc).__name__}: {exc}") from exc
        array = np.asarray(vectors, dtype=np.float32)
        if array.ndim != 2 or array.shape[0] != len(texts):
            raise RerankProtocolError(
                f"embedding model returned shape {array.shape} for {len(texts)} texts"
            )
        if not np.isfinite(array).all():
            raise RerankProtocolError("embedding model returned a non-finite value")
        return array

    def embed_query(self, query: str) -> Any:
        """The query's normalised embedding (a 1-D float32 numpy array)."""
        self.load()
        return self._encode([query], "query")[0]

    def embed_documents(
        self,
        texts: Sequence[str],
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> Any:
        """The normalised embeddings of `texts`, one row each (a 2-D float32 numpy array).

        Texts in the cache are not embedded again; each distinct missing text is embedded once,
        and cached when there is a cache. `progress(done, total)` is called after each batch of
        `batch_size` texts embedded (never when everything came from the cache).
        """
        import numpy as np

        self.load()
        texts = list(texts)
        rows: list[Any] = [None] * len(texts)
        key = self.cache_key
        missing: dict[str, list[int]] = {}
        for i, text in enumerate(texts):
            cached = self.cache.get(key, text) if self.cache is not None else None
            if cached is None:
                missing.setdefault(text, []).append(i)
            else:
                rows[i] = cached
        todo = list(missing)
        if todo:
            step = self.batch_size if progress is not None else len(todo)
            for start in range(0, len(todo), step):
                chunk = todo[start : start + step]
                for text, vector in zip(chunk, self._encode(chunk, "document"), strict=True):
                    for i in missing[text]:
                        rows[i] = vector
                    if self.cache is not None:
                        self.cache.put(key, text, vector)
                if progress is not None:
                    progress(min(start + step, len(todo)), len(todo))
        if not rows:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack(rows)

    def remember(self, texts: Sequence[str], vectors: Any) -> None:
        """Put embeddings computed elsewhere (dense recall's on-disk cache) into the cache."""
        if self.cache is None:
            return
        self.load()
        if len(vectors) != len(texts):
            raise ValueError(f"{len(vectors)} vectors for {len(texts)} texts")
        key = self.cache_key
        for text, vector in zip(texts, vectors, strict=True):
            self.cache.put(key, text, vector)

    def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        """The items with the cosine of their embedding and the query's, best first.

        Ties keep input order; `top_k` keeps the best k (0/None: all).
        """
        kept, texts, cap = snapshot(query, items, text, top_k)
        if not texts:
            return []
        query_vector = self.embed_query(query)
        documents = self.embed_documents(texts)
        if documents.shape[1] != query_vector.shape[0]:
            raise RerankProtocolError(
                f"document embeddings have {documents.shape[1]} dimensions, the query's "
                f"{query_vector.shape[0]}"
            )
        scores = [float(s) for s in (documents @ query_vector).tolist()]
        for i, score in enumerate(scores):
            if not math.isfinite(score):
                raise RerankProtocolError(f"embedding score {score!r} for item {i}")
        return [(kept[i], s) for i, s in rank(list(enumerate(scores)), cap)]


class AsyncEmbeddingReranker(_InThread[EmbeddingReranker]):
    """The awaitable twin of `EmbeddingReranker`: loads and embeds in a worker thread."""

    def __init__(self, model: str | os.PathLike[str] | None = None, **kw: Any) -> None:
        self.sync = EmbeddingReranker(model, **kw)

    @property
    def cache(self) -> EmbeddingCache | None:
        """The wrapped reranker's document-embedding cache."""
        return self.sync.cache


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
