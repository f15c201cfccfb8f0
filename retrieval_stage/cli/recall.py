"""Which recall `demo` and `eval` run over a corpus: BM25, dense (the embedding model) or both
fused, and the progress bar while a corpus is embedded for the first time.

Dense recall shares the reranker's `EmbeddingReranker` when the reranker is the embedding one:
one model in memory, and each document embedded once, so the rerank then costs one query
embedding. Document embeddings are kept under the user's cache directory by `DenseRecall`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..errors import RerankError
from ..models import Candidate
from .console import EXIT_FAILURE, err, fail, note
from .interrupt import while_doing
from .options import RecallChoice
from .reranker import Chosen, recall_embedder

__all__ = ["CHUNK_ROWS_ENV", "Recall", "dense_recall", "index_corpus", "make_recall"]

CHUNK_ROWS_ENV = "RETRIEVAL_STAGE_EMBEDDING_CHUNK_ROWS"
"""Documents per on-disk chunk of embeddings (default `recall.dense.CHUNK_ROWS`): the tests
set a small one so an interrupted first run over a small corpus has chunks to keep."""


@dataclass(frozen=True)
class Recall:
    """A recaller (``recall(query, k)``), what to call it, and the name of its score column."""

    recaller: Any
    label: str
    score_label: str


def make_recall(choice: RecallChoice, documents: Sequence[Candidate], chosen: Chosen) -> Recall:
    """The recall `choice` names over `documents`, indexed now (dense: embedded, or loaded from
    the on-disk cache; a bar on stderr while embedding). Exit 1 when the model cannot run."""
    from ..recall import BM25Recall

    if choice is RecallChoice.bm25:
        return Recall(BM25Recall(documents), "BM25", "bm25")
    from ..recall import HybridRecall

    embedder = recall_embedder(chosen)
    dense = dense_recall(documents, embedder)
    index_corpus(dense)
    name = embedder.model_name
    if choice is RecallChoice.dense:
        return Recall(dense, f"dense ({name}, cosine)", "cosine")
    hybrid = HybridRecall(BM25Recall(documents), dense)
    return Recall(hybrid, f"hybrid (BM25 + dense {name}, reciprocal rank fusion)", "rrf")


def dense_recall(documents: Sequence[Candidate], embedder: Any) -> Any:
    """`DenseRecall` over `documents` with `embedder`, its embeddings cached on disk in
    chunks of `CHUNK_ROWS` (`CHUNK_ROWS_ENV` sets another size: for the tests, which interrupt
    a first run over a small corpus)."""
    from ..recall import DenseRecall
    from ..recall.dense import CHUNK_ROWS

    given = os.environ.get(CHUNK_ROWS_ENV, "").strip()
    rows = int(given) if given.isascii() and given.isdigit() and int(given) > 0 else CHUNK_ROWS
    return DenseRecall(documents, embedder=embedder, chunk_rows=rows)


def index_corpus(dense: Any) -> None:
    """Embed the corpus (or load it from disk), showing a bar on stderr while embedding.

    Interrupted (Ctrl-C, SIGTERM), the line says how many documents are embedded and kept on
    disk, from which the next run goes on (`cli.interrupt`)."""
    stderr = err()
    total = len(dense)
    progress = Progress(
        TextColumn(f"embedding {total:,} documents (once; then cached on disk)"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=stderr,
        transient=True,
        disable=not sys.stderr.isatty(),
    )
    task = progress.add_task("", total=total)
    started = False

    began = time.monotonic()
    next_tenth = 1

    def advance(done: int, total: int) -> None:
        nonlocal started, next_tenth
        if not started:  # first batch done: the corpus is being embedded, not loaded
            started = True
            if progress.disable:
                note(stderr, _embedding_note(dense.resumed_rows, total))
            next_tenth = dense.resumed_rows * 10 // total + 1 if total else 1
        # Piped (no bar): a line per tenth, so a log shows it is moving.
        if progress.disable and total and done * 10 >= next_tenth * total:
            next_tenth = done * 10 // total + 1
            elapsed = time.monotonic() - began
            note(stderr, f"embedded {done:,} of {total:,} documents ({elapsed:.0f} s)")
        progress.update(task, completed=done, total=total)

    try:
        with while_doing(lambda: _interrupted(dense, total)), progress:
            dense.index(progress=advance)
    except RerankError as exc:
        fail(EXIT_FAILURE, f"dense recall: {exc}")
    if dense.cache_error is not None:
        note(stderr, f"document embeddings not cached ({dense.cache_error})", "yellow")


def _embedding_note(resumed: int, total: int) -> str:
    """The line that says a corpus is being embedded: all of it, or the rest of it."""
    if resumed:
        return (
            f"embedding the other {total - resumed:,} of {total:,} documents ({resumed:,} "
            "were cached by an earlier run)…"
        )
    return (
        f"embedding {total:,} documents once (then cached on disk; a minute or more on a busy "
        "2-CPU machine)…"
    )


def _interrupted(dense: Any, total: int) -> str:
    """What an interrupt leaves of the corpus's embeddings, for people."""
    cached = dense.cached_rows
    if dense.cache_error is not None:
        return (
            f"interrupted: embedded part of {total:,} documents, but they could not be cached "
            f"({dense.cache_error}): the next run starts over"
        )
    if cached == 0:
        return (
            f"interrupted while embedding {total:,} documents, before the first "
            f"{min(dense.chunk_rows, total):,} were done: nothing is cached yet"
        )
    return (
        f"interrupted: embedded {cached:,} of {total:,} documents; those are cached, the next "
        "run goes on from there"
    )
