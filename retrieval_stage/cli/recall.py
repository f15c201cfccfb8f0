"""Which recall `demo` and `eval` run over a corpus: BM25, dense (the embedding model) or both
fused, and the progress bar while a corpus is embedded for the first time.

Dense recall shares the reranker's `EmbeddingReranker` when the reranker is the embedding one:
one model in memory, and each document embedded once, so the rerank then costs one query
embedding. Document embeddings are kept under the user's cache directory by `DenseRecall`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..errors import RerankError
from ..models import Candidate
from .console import EXIT_FAILURE, err, fail, note
from .options import RecallChoice
from .reranker import Chosen, recall_embedder

__all__ = ["Recall", "index_corpus", "make_recall"]


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
    from ..recall import DenseRecall, HybridRecall

    embedder = recall_embedder(chosen)
    dense = DenseRecall(documents, embedder=embedder)
    index_corpus(dense)
    name = embedder.model_name
    if choice is RecallChoice.dense:
        return Recall(dense, f"dense ({name}, cosine)", "cosine")
    hybrid = HybridRecall(BM25Recall(documents), dense)
    return Recall(hybrid, f"hybrid (BM25 + dense {name}, reciprocal rank fusion)", "rrf")


def index_corpus(dense: Any) -> None:
    """Embed the corpus (or load it from disk), showing a bar on stderr while embedding."""
    stderr = err()
    progress = Progress(
        TextColumn(f"embedding {len(dense):,} documents (once; then cached on disk)"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=stderr,
        transient=True,
        disable=not sys.stderr.isatty(),
    )
    task = progress.add_task("", total=len(dense))
    started = False

    began = time.monotonic()
    next_tenth = 1

    def advance(done: int, total: int) -> None:
        nonlocal started, next_tenth
        if not started:  # first batch done: the corpus is being embedded, not loaded
            started = True
            if progress.disable:
                note(
                    stderr,
                    f"embedding {total:,} documents once (then cached on disk; a minute or "
                    "more on a busy 2-CPU machine)…",
                )
        # Piped (no bar): a line per tenth, so a log shows it is moving.
        if progress.disable and total and done * 10 >= next_tenth * total:
            next_tenth = done * 10 // total + 1
            elapsed = time.monotonic() - began
            note(stderr, f"embedded {done:,} of {total:,} documents ({elapsed:.0f} s)")
        progress.update(task, completed=done, total=total)

    try:
        with progress:
            dense.index(progress=advance)
    except RerankError as exc:
        fail(EXIT_FAILURE, f"dense recall: {exc}")
    if dense.cache_error is not None:
        note(stderr, f"document embeddings not cached ({dense.cache_error})", "yellow")
