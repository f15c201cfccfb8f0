"""Dense recall with an embedding model.

`DenseRecall` finds the documents whose embeddings are nearest the query's (cosine), so it
finds answers that share no word with the question, which BM25 cannot. Embedding a corpus takes
a while on a CPU (about a minute for the bundled 1,538 documents), so the document embeddings
are kept on disk under the user's cache directory, keyed by the model's files (their content,
so every install of one model shares them) and the corpus's texts, and a later run loads them
in milliseconds. They are written in chunks as they are computed: a run stopped half way keeps
what it did, and the next one embeds only the rest. Each chunk names its rows and their texts
and carries a checksum, so a truncated, corrupt or misplaced one is embedded again, never used.

It has `BM25Recall`'s shape: built over a list of `Candidate`s, `recall(query, k)` returns
copies of the best `k` with their score as `score`, best first. Needs the ``[local]`` extra.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import struct
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..cache_files import default_cache_dir, file_digest, write_atomically
from ..models import Candidate
from .arguments import check_query, check_unique_ids

if TYPE_CHECKING:
    from ..local import EmbeddingReranker

__all__ = ["CHUNK_ROWS", "DenseRecall", "default_cache_dir"]

CHUNK_ROWS = 32
"""Documents per on-disk chunk (the embedding model's default batch): an interrupted first
run loses at most this many embeddings (a second or two of a busy CPU); the bundled corpus is
49 files of ~49 KB."""

_SPOT_CHECK_TOLERANCE = 1e-3
"""How far a re-embedded document may drift from its cached row (batching changes the last
digits) before the cached file is taken for another model's and embedded again."""

_CHUNK_HEADER = struct.Struct("<8sQII32s32s")
"""A chunk file's header: magic, first row, rows, dimensions, SHA-256 of the rows' texts,
SHA-256 of the payload (rows x dimensions little-endian float32) that follows."""
_CHUNK_MAGIC = b"RSEMB\x00\x01\n"

_MEMO_MIN_BYTES = 1 << 20
"""Files at least this large (the weights) have their digest remembered in the cache
directory by path, inode, size and times, so a run hashes them only when they changed."""


def _corpus_hash(texts: Sequence[str]) -> str:
    """A digest of the texts in order (each length-prefixed, so no two corpora collide)."""
    digest = hashlib.sha256()
    for text in texts:
        data = text.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def _model_fingerprint(
    location: str, max_length: int | None, memo_dir: Path | None = None, *, variant: str = ""
) -> str:
    """A digest of a model's files: each file's path inside the model directory and the
    SHA-256 of its content (hidden files and ``__pycache__`` left out), the length cap, and
    `variant` (how it is run, when that changes its vectors: another precision).

    The same model installed in two places (two virtualenvs) has one fingerprint, so their
    runs share the cached embeddings; a model changed in place gets a new one, so its
    documents are embedded again rather than scored against another model's vectors. A model
    that is not a directory (a hub name) is named by its name. Large files' digests are
    remembered under `memo_dir` (`retrieval_stage.cache_files.file_digest`): hashing the
    packaged MiniLM's 91 MB of weights takes ~0.1 s, once per install.
    """
    digest = hashlib.sha256(f"max_length={max_length}\x00{variant}".encode())
    root = Path(location)
    if not root.is_dir():
        digest.update(f"\x00name={location}".encode("utf-8", "surrogatepass"))
        return digest.hexdigest()
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if any(part.startswith(".") or part == "__pycache__" for part in relative.parts):
            continue
        if path.is_file():
            name = relative.as_posix().encode("utf-8", "surrogatepass")
            digest.update(
                b"\x00"
                + name
                + b"\x00"
                + file_digest(path, memo_dir, min_bytes=_MEMO_MIN_BYTES).encode()
            )
    return digest.hexdigest()


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")[:60] or "model"


def _chunk_bytes(start: int, texts: Sequence[str], matrix: Any) -> bytes:
    """One chunk file: its header, then the rows as little-endian float32."""
    import numpy as np

    payload = np.ascontiguousarray(matrix, dtype="<f4").tobytes()
    header = _CHUNK_HEADER.pack(
        _CHUNK_MAGIC,
        start,
        matrix.shape[0],
        matrix.shape[1],
        bytes.fromhex(_corpus_hash(texts)),
        hashlib.sha256(payload).digest(),
    )
    return header + payload


def _read_chunk(path: Path, start: int, texts: Sequence[str]) -> Any:
    """The rows a chunk file holds for `texts` (the corpus's rows from `start` on), or None
    when the file is absent or is not exactly that: wrong magic, rows or texts, a payload
    truncated or longer than its header says, a checksum that does not match, a non-finite
    value."""
    import numpy as np

    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < _CHUNK_HEADER.size:
        return None
    magic, first, rows, dim, texts_digest, checksum = _CHUNK_HEADER.unpack_from(data)
    payload = data[_CHUNK_HEADER.size :]
    if (
        magic != _CHUNK_MAGIC
        or first != start
        or rows != len(texts)
        or dim < 1
        or len(payload) != rows * dim * 4
        or texts_digest != bytes.fromhex(_corpus_hash(texts))
        or hashlib.sha256(payload).digest() != checksum
    ):
        return None
    matrix = np.frombuffer(payload, dtype="<f4").astype(np.float32).reshape(rows, dim)
    return matrix if np.isfinite(matrix).all() else None


class DenseRecall:
    """Cosine nearest neighbours of the query among `documents`' embeddings.

    `embedder` is the `EmbeddingReranker` whose model embeds (share one with the rerank stage:
    one model in memory, and with its `EmbeddingCache` the rerank then costs only the query);
    None makes one with `model` (default: the packaged all-MiniLM-L6-v2). Documents are
    embedded on first `recall`, or by `index()`, which can report progress. Their embeddings
    are kept under `cache_dir` (default `default_cache_dir()`; ``disk_cache=False``: not at
    all) in chunks of `chunk_rows` documents, each written atomically as soon as it is
    embedded. After `index()` (or during it, for a progress report), `cache_path` is the
    directory of the chunks, `resumed_rows` how many documents were already on disk,
    `cached_rows` how many are now, `from_disk` whether all of them came from there, and
    `cache_error` why they could not be written (None if they were).
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
        chunk_rows: int = CHUNK_ROWS,
    ) -> None:
        if embedder is not None and model is not None:
            raise ValueError("give either embedder or model, not both")
        if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
            raise ValueError(f"chunk_rows must be an int >= 1, got {chunk_rows!r}")
        self.documents = list(documents)
        check_unique_ids(self.documents)
        if embedder is None:
            from ..local import EmbeddingReranker

            embedder = EmbeddingReranker(model)
        self.embedder = embedder
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.disk_cache = disk_cache
        self.chunk_rows = chunk_rows
        self.cache_path: Path | None = None
        self.cache_error: str | None = None
        self.from_disk = False
        self.resumed_rows = 0
        self.cached_rows = 0
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

        `progress(done, total)` is called after each chunk embedded (and written), `done`
        counting the documents already on disk too; never when everything was loaded from
        disk (with ``disk_cache=False``: after each of the model's batches). Raises
        `RerankError` when the model cannot be loaded. Interrupted (KeyboardInterrupt), it
        keeps every chunk written so far: the next `index()` embeds only the rest.
        """
        with self._lock:
            if self._matrix is not None:
                return
            texts = [d.text for d in self.documents]
            self.embedder.load()
            if not self.disk_cache:
                self._matrix = self.embedder.embed_documents(texts, progress=progress)
                return
            self.cache_path = self._path_for(texts)
            self._matrix = self._chunked(self.cache_path, texts, progress)

    def _path_for(self, texts: Sequence[str]) -> Path:
        source = self.embedder.source
        assert source is not None  # loaded above
        # A model run at another precision (int8) embeds a little differently: its own cache.
        precision = getattr(self.embedder, "precision", "fp32")
        fingerprint = _model_fingerprint(
            source.location,
            self.embedder.max_length,
            self.cache_dir / "file-digests",
            variant="" if precision == "fp32" else f"precision={precision}",
        )
        name = f"{_slug(self.embedder.model_name)}-{fingerprint[:16]}-{_corpus_hash(texts)[:24]}"
        return self.cache_dir / "embeddings" / name

    def _spans(self, count: int) -> list[tuple[int, int]]:
        return [(s, min(s + self.chunk_rows, count)) for s in range(0, count, self.chunk_rows)]

    def _chunked(
        self, directory: Path, texts: list[str], progress: Callable[[int, int], None] | None
    ) -> Any:
        """The embeddings of `texts`: each chunk from `directory` when it is whole and this
        model's, else embedded now and written there before the next is started."""
        import numpy as np

        spans = self._spans(len(texts))
        found = {
            start: rows
            for start, end in spans
            if (rows := _read_chunk(self._chunk_path(directory, start), start, texts[start:end]))
            is not None
        }
        if len({rows.shape[1] for rows in found.values()}) > 1 or not self._spot_check(
            texts, found
        ):
            found = {}  # chunks of different models, or another model's vectors: none is kept
        self.resumed_rows = self.cached_rows = sum(len(rows) for rows in found.values())
        if len(found) == len(spans):
            self.from_disk = True
            if not texts:
                return np.zeros((0, 0), dtype=np.float32)
            matrix = np.concatenate([found[start] for start, _ in spans])
            self.embedder.remember(texts, matrix)
            return matrix
        for start, end in spans:  # the rerank's in-memory cache has them too
            if start in found:
                self.embedder.remember(texts[start:end], found[start])
        parts: list[Any] = []
        done = self.cached_rows
        for start, end in spans:
            if start in found:
                parts.append(found[start])
                continue
            rows = self.embedder.embed_documents(texts[start:end])
            self._write_chunk(directory, start, texts[start:end], rows)
            parts.append(rows)
            done += end - start
            if progress is not None:  # after the write: what it counts is kept
                progress(done, len(texts))
        return np.concatenate(parts)

    @staticmethod
    def _chunk_path(directory: Path, start: int) -> Path:
        return directory / f"rows-{start:09d}.f32"

    def _spot_check(self, texts: Sequence[str], found: dict[int, Any]) -> bool:
        """Whether the first document of the first chunk found, embedded now, matches its
        cached row: vectors another model wrote under this name are not used."""
        import numpy as np

        if not found:
            return True
        start = min(found)
        fresh = self.embedder.embed_documents([texts[start]])
        cached = found[start]
        return bool(
            fresh.shape[1] == cached.shape[1]
            and np.allclose(fresh[0], cached[0], atol=_SPOT_CHECK_TOLERANCE)
        )

    def _write_chunk(self, directory: Path, start: int, texts: Sequence[str], rows: Any) -> None:
        """Save one chunk atomically; a failure is recorded and no later chunk is tried."""
        if self.cache_error is not None:
            return
        try:
            write_atomically(self._chunk_path(directory, start), _chunk_bytes(start, texts, rows))
        except OSError as exc:  # a read-only or full disk costs the cache, not the recall
            self.cache_error = f"{type(exc).__name__}: {exc.strerror or exc}"
            return
        self.cached_rows += len(texts)

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
