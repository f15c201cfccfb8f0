"""The models the server runs, behind one small contract: count tokens, score many requests.

A `Scorer` scores a model batch: several requests' (query, texts) at once, one list of scores
per request, each in its request's input order. Packing requests together must not change a
score: the cross-encoder scores each pair on its own, the embedding model embeds each text on
its own, and the lexical reranker (whose IDF is taken over one request's texts) scores each
request apart. The models are the library's in-process rerankers (`retrieval_stage.local`), so
a text scores the same through the server as through ``RerankStage`` with that reranker.

Every method but the token count runs on the server's one model thread; `count` runs on the
request's side with its own copy of the tokenizer (a fast tokenizer must not be shared between
threads).
"""

from __future__ import annotations

import copy
import importlib.util
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = ["Group", "Scorer", "make_scorer", "set_threads"]


@dataclass(frozen=True, slots=True)
class Group:
    """One request's share of a model batch: its query, texts and whether to skip the
    activation (TEI's ``raw_scores``)."""

    query: str
    texts: tuple[str, ...]
    raw_scores: bool = False


class Scorer(Protocol):
    """What the batcher needs of a model."""

    kind: str
    """``embedding``, ``local`` (a cross-encoder) or ``lexical``."""
    splittable: bool
    """True when a request's texts may be scored in separate batches (pairs are independent)."""

    @property
    def model_id(self) -> str:
        """The model's name, for ``/info``, spans and metrics."""
        ...

    @property
    def max_input_length(self) -> int:
        """The longest input in tokens the model reads; longer ones are truncated (or refused)."""
        ...

    def load(self) -> None:
        """Load the model (slow; in a worker thread); raises when it cannot be loaded."""
        ...

    def count(self, query: str, texts: Sequence[str]) -> tuple[int, list[int]]:
        """Tokens of the query alone, and of each text as the model reads it with the query:
        untruncated, so that a caller asking for no truncation can be refused."""
        ...

    def score(self, groups: Sequence[Group]) -> list[list[float]]:
        """One score per text of each group, in the group's order."""
        ...


def _is_rust_tokenizer(tokenizer: Any) -> bool:
    """True for a `tokenizers.Tokenizer` (the numpy embedding backend's), not a transformers one."""
    return type(tokenizer).__module__.split(".")[0] == "tokenizers"


def _counter(tokenizer: Any) -> Any:
    """A copy of `tokenizer` for the request side; a Rust tokenizer's copy never truncates."""
    counter = copy.deepcopy(tokenizer)
    if _is_rust_tokenizer(counter):
        counter.no_truncation()
        counter.no_padding()
    return counter


def _lengths(tokenizer: Any, first: Sequence[str], second: Sequence[str] | None) -> list[int]:
    if _is_rust_tokenizer(tokenizer):
        inputs: list[Any] = list(first) if second is None else list(zip(first, second, strict=True))
        return [len(e.ids) for e in tokenizer.encode_batch(inputs, add_special_tokens=True)]
    encoded = tokenizer(
        list(first),
        list(second) if second is not None else None,
        add_special_tokens=True,
        truncation=False,
        verbose=False,
    )
    return [len(ids) for ids in encoded["input_ids"]]


class _InProcessScorer:
    """What the two in-process models share: the library reranker behind them, its name, its
    input length once loaded, and a request-side copy of its tokenizer (`_counter`)."""

    splittable = True

    def __init__(self, reranker: Any) -> None:
        self.reranker = reranker
        self._counter: Any = None
        self._max_length = 512

    @property
    def model_id(self) -> str:
        name: str = self.reranker.model_name
        return name

    @property
    def max_input_length(self) -> int:
        return self._max_length

    def load(self) -> None:
        self.reranker.load()
        self._max_length = self.reranker.max_input_length
        self._counter = _counter(self.reranker.tokenizer)


class CrossEncoderScorer(_InProcessScorer):
    """A sentence-transformers cross-encoder (`retrieval_stage.local.CrossEncoderReranker`):
    each (query, text) pair read together; scores through the model's activation (a sigmoid
    for one label, as TEI applies) unless ``raw_scores``."""

    kind = "local"

    def __init__(self, model: str, *, batch_size: int = 32) -> None:
        from ..local import CrossEncoderReranker

        super().__init__(CrossEncoderReranker(model, batch_size=batch_size, device="cpu"))

    def count(self, query: str, texts: Sequence[str]) -> tuple[int, list[int]]:
        return _lengths(self._counter, [query], None)[0], _lengths(
            self._counter, [query] * len(texts), texts
        )

    def score(self, groups: Sequence[Group]) -> list[list[float]]:
        out: list[list[float]] = [[] for _ in groups]
        for raw in (False, True):
            chosen = [i for i, g in enumerate(groups) if g.raw_scores is raw]
            pairs = [(groups[i].query, t) for i in chosen for t in groups[i].texts]
            flat = self.reranker.score_pairs(pairs, raw=raw)
            start = 0
            for i in chosen:
                n = len(groups[i].texts)
                out[i] = flat[start : start + n]
                start += n
        return out


NUMPY_THREADS_CAP = 8
"""At most this many threads by default: a request's 50-100 texts split further gain little."""


def default_numpy_threads() -> int:
    """The numpy embedding backend's threads when ``--model-threads`` is not given: every core
    this process may run on (up to `NUMPY_THREADS_CAP`), so one request's batch uses them all."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, NUMPY_THREADS_CAP))


class EmbeddingScorer(_InProcessScorer):
    """An embedding model (`retrieval_stage.local.EmbeddingReranker`, numpy or
    sentence-transformers as `RETRIEVAL_STAGE_EMBEDDING_BACKEND` says, default ``auto``):
    the cosine of the query's and each text's normalised embeddings, a bi-encoder's score.
    ``raw_scores`` changes nothing: a cosine has no activation to skip."""

    kind = "embedding"

    def __init__(
        self,
        model: str | None,
        *,
        batch_size: int = 32,
        cache_size: int = 0,
        threads: int | None = None,
        precision: str = "fp32",
    ) -> None:
        from ..local import EmbeddingCache, EmbeddingReranker

        cache = EmbeddingCache(cache_size) if cache_size > 0 else None
        super().__init__(
            EmbeddingReranker(
                model,
                batch_size=batch_size,
                device="cpu",
                cache=cache,
                # The numpy backend's threads, each a batch of texts side by side.
                # The int8 graph's intra-op threads likewise: every core on one request.
                threads=threads if threads is not None else default_numpy_threads(),
                precision=precision,
            )
        )

    @property
    def precision(self) -> str:
        """The precision that runs (``fp32`` where ``int8`` was asked for but cannot run)."""
        precision: str = self.reranker.precision
        return precision

    def count(self, query: str, texts: Sequence[str]) -> tuple[int, list[int]]:
        return _lengths(self._counter, [query], None)[0], _lengths(self._counter, texts, None)

    def score(self, groups: Sequence[Group]) -> list[list[float]]:
        queries = list(dict.fromkeys(g.query for g in groups))
        by_query = dict(zip(queries, self.reranker.embed_queries(queries), strict=True))
        documents = self.reranker.embed_documents([t for g in groups for t in g.texts])
        out: list[list[float]] = []
        start = 0
        for group in groups:
            n = len(group.texts)
            rows = documents[start : start + n]
            scores = [float(s) for s in (rows @ by_query[group.query]).tolist()]
            if not all(math.isfinite(s) for s in scores):
                raise ValueError("the embedding model gave a score that is not finite")
            out.append(scores)
            start += n
        return out


class LexicalScorer:
    """The lexical reranker (`retrieval_stage.local.LexicalReranker`): no model, and it says
    so in ``/info``. Its IDF is taken over one request's texts, so requests are never split."""

    kind = "lexical"
    splittable = False
    max_input_length = 1_000_000

    def __init__(self) -> None:
        from ..local import LexicalReranker

        self.reranker = LexicalReranker()

    @property
    def model_id(self) -> str:
        return self.reranker.model_name

    def load(self) -> None:
        return None

    def count(self, query: str, texts: Sequence[str]) -> tuple[int, list[int]]:
        from ..local import word_count

        # The words the reranker reads (not whitespace-split ones: "a-b-c" is three).
        return word_count(query), [word_count(t) for t in texts]

    def score(self, groups: Sequence[Group]) -> list[list[float]]:
        out: list[list[float]] = []
        for group in groups:
            texts = group.texts
            ranked = self.reranker.rerank(
                group.query, list(range(len(texts))), text=texts.__getitem__
            )
            scores = [math.nan] * len(group.texts)
            for index, score in ranked:
                scores[index] = score
            out.append(scores)
        return out


def set_threads(threads: int | None) -> None:
    """torch's intra-op threads for this process (None: leave torch's default); nothing where
    torch is not installed (the numpy embedding backend takes its threads from the scorer)."""
    if threads is not None and importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(threads)


def make_scorer(
    reranker: str,
    model: str | Path | None,
    *,
    batch_size: int = 32,
    cache_size: int = 0,
    threads: int | None = None,
    precision: str = "fp32",
) -> Scorer:
    """The scorer for ``--reranker`` (`embedding`, `local` or `lexical`) and ``--model``;
    `precision` is the embedding model's (``fp32``, ``int8``, ``bf16``; the others run
    float32).

    Nothing is loaded here (see `Scorer.load`); a model that cannot be used at all (the
    ``[local]`` extra missing, a bi-encoder folder given as a cross-encoder) raises now.
    """
    spec = None if model is None else str(model)
    if reranker == "lexical":
        if spec is not None:
            raise ValueError("--model does not apply to the lexical reranker")
        return LexicalScorer()
    if precision != "fp32" and reranker != "embedding":
        raise ValueError(f"precision {precision!r} applies to the embedding reranker only")
    if reranker == "embedding":
        return EmbeddingScorer(
            spec,
            batch_size=batch_size,
            cache_size=cache_size,
            threads=threads,
            precision=precision,
        )
    if reranker == "local":
        from ..local import DEFAULT_LOCAL_MODEL

        return CrossEncoderScorer(spec or DEFAULT_LOCAL_MODEL, batch_size=batch_size)
    raise ValueError(f"unknown reranker {reranker!r}: embedding, local or lexical")
