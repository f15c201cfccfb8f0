"""Dense recall with an embedding model.

`DenseRecall` finds the documents whose embeddings are nearest the query's (cosine), so it
finds answers that share no word with the question, which BM25 cannot. Embedding a corpus takes
a while on a CPU (about a minute for the bundled 1,538 documents), so the document embeddings
are kept on disk under the user's cache directory, keyed by the model and the corpus's texts,
and a later run loads them in milliseconds.

It has `BM25Recall`'s shape: built over a list of `Candidate`s, `recall(query, k)` returns
copies of the best `k` with their score as `score`, best first. Needs the ``[local]`` extra.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..models import Candidate
from .arguments import check_query, check_unique_ids

if TYPE_CHECKING:
    from ..local import EmbeddingReranker

__all__ = ["DenseRecall", "default_cache_dir"]

_SPOT_CHECK_TOLERANCE = 1e-3
"""How far a re-embedded document may drift from its cached row (batching changes the last
digits) before the cached file is taken for another model's and embedded again."""


def default_cache_dir() -> Path:
    """The user's cache directory for this package: ``$XDG_CACHE_HOME/retrieval-stage``.

    ``~/.cache/retrieval-stage`` when ``XDG_CACHE_HOME`` is unset, ``%LOCALAPPDATA%`` on
    Windows.
    """
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    if not base and os.name == "nt":
        base = os.environ.get("LOCALAPPDATA", "").strip()
    root = Path(base) if base else Path.home() / ".cache"
    return root / "retrieval-stage"


def _corpus_hash(texts: Sequence[str]) -> str:
    """A digest of the texts in order (each length-prefixed, so no two corpora collide)."""
    digest = hashlib.sha256()
    for text in texts:
        data = text.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def _model_fingerprint(location: str, max_length: int | None) -> str:
    """A digest naming a model's exact files: a directory's file names, sizes and times.

    A model retrained in place gets a new fingerprint, so its documents are embedded again
    rather than scored against another model's vectors.
    """
    digest = hashlib.sha256(f"{location}\x00max_length={max_length}".encode())
    root = Path(location)
    if root.is_dir():
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            stat = path.stat()
            relative = path.relative_to(root).as_posix()
            digest.update(f"\x00{relative}\x00{stat.st_size}\x00{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")[:60] or "model"


class DenseRecall:
    """Cosine nearest neighbours of the query among `documents`' embeddings.

    `embedder` is the `EmbeddingReranker` whose model embeds (share one with the rerank stage:
    one model in memory, and with its `EmbeddingCache` the rerank then costs only the query);
    None makes one with `model` (default: the packaged all-MiniLM-L6-v2). Documents are
    embedded on first `recall`, or by `index()`, which can report progress. Their embeddings
    are kept under `cache_dir` (default `default_cache_dir()`; ``disk_cache=False``: not at
    all), written atomically. After `index()`, `from_disk` says whether they came from there,
    `cache_path` where they are and `cache_error` why they could not be written (None if they
    were).
    """

    name = "dense"

    def __init__(
        self,
        documents: Sequence[Candidate],
        *,
        embedder: EmbeddingReranker | None = None,
        model: str | os.PathLike[str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        disk_cache: bool = True,
    ) -> None:
        if embedder is not None and model is not None:
            raise ValueError("give either embedder or model, not both")
        self.documents = list(documents)
        check_unique_ids(self.documents)
        if embedder is None:
            from ..local import EmbeddingReranker

            embedder = EmbeddingReranker(model)
        self.embedder = embedder
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.disk_cache = disk_cache
        self.cache_path: Path | None = None
        self.cache_error: str | None = None
        self.from_disk = False
        self._matrix: Any = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.documents)

    def __repr__(self) -> str:
        return f"DenseRecall({len(self.documents)} documents, model={self.embedder.model_name!r})"

    @property
    def indexed(self) -> bool:
        """True once the document embeddings are in memory."""
        return self._matrix is not None

    def index(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Embed the documents now, or load their embeddings from disk (idempotent).

        `progress(done, total)` is called after each batch embedded; not when loaded from disk.
        Raises `RerankError` when the model cannot be loaded.
        """
        with self._lock:
            if self._matrix is not None:
                return
            texts = [d.text for d in self.documents]
            self.embedder.load()
            if self.disk_cache:
                self.cache_path = self._path_for(texts)
                matrix = self._read(self.cache_path, texts)
                if matrix is not None:
                    self.from_disk = True
                    self.embedder.remember(texts, matrix)
                    self._matrix = matrix
                    return
            matrix = self.embedder.embed_documents(texts, progress=progress)
            if self.cache_path is not None:
                self._write(self.cache_path, matrix)
            self._matrix = matrix

    def _path_for(self, texts: Sequence[str]) -> Path:
        source = self.embedder.source
        assert source is not None  # loaded above
        fingerprint = _model_fingerprint(source.location, self.embedder.max_length)
        name = f"{_slug(self.embedder.model_name)}-{fingerprint[:16]}-{_corpus_hash(texts)[:24]}"
        return self.cache_dir / "embeddings" / f"{name}.npy"

    def _read(self, path: Path, texts: Sequence[str]) -> Any:
        """The cached embeddings when they are whole and this model's; else None."""
        import numpy as np

        try:
            matrix = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError):  # absent, truncated, not an array
            return None
        if (
            matrix.dtype != np.float32
            or matrix.ndim != 2
            or matrix.shape[0] != len(texts)
            or not np.isfinite(matrix).all()
        ):
            return None
        if texts:  # spot check: the first document, embedded now, must match its row
            fresh = self.embedder.embed_documents(texts[:1])
            if fresh.shape[1] != matrix.shape[1] or not np.allclose(
                fresh[0], matrix[0], atol=_SPOT_CHECK_TOLERANCE
            ):
                return None
        return matrix

    def _write(self, path: Path, matrix: Any) -> None:
        """Save atomically (a temporary file renamed over the target); a failure is recorded."""
        import numpy as np

        temporary: str | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
            with os.fdopen(handle, "wb") as out:
                np.save(out, matrix, allow_pickle=False)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, path)
            temporary = None
            self.cache_error = None
        except OSError as exc:  # a read-only or full disk costs the cache, not the recall
            self.cache_error = f"{type(exc).__name__}: {exc.strerror or exc}"
        finally:
            if temporary is not None:
                Path(temporary).unlink(missing_ok=True)

    def scores(self, query: str) -> Any:
        """Every document's cosine with `query`, in corpus order (a 1-D numpy array)."""
        import numpy as np

        self.index()
        if not self.documents:
            return np.zeros(0, dtype=np.float32)
        query_vector = self.embedder.embed_query(query)
        return self._matrix @ query_vector

    def recall(self, query: str, k: int) -> list[Candidate]:
        """The best `k` documents for `query` with their cosine as `score`, best first.

        Ties keep corpus order. Every document has a similarity, so the result has
        ``min(k, len(documents))`` entries.
        """
        import numpy as np

        check_query(query, k)
        if not self.documents:
            return []
        scores = self.scores(query)
        order = np.lexsort((np.arange(len(scores)), -scores))[:k]
        return [
            dataclasses.replace(self.documents[i], score=float(scores[i])) for i in order.tolist()
        ]
