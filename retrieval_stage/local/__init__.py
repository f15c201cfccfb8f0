"""In-process rerankers: a cross-encoder and an embedding model through sentence-transformers,
and a lexical fallback.

- `cross_encoder`: `CrossEncoderReranker` (and its async twin);
- `embedding`: `EmbeddingReranker`, `EmbeddingCache` (and the async twin);
- `lexical`: `LexicalReranker`, a bag-of-words heuristic that needs no extra;
- `base`: what the model rerankers share (load once, close, the worker-thread twin);
- `model_source`: where a model's files come from, offline first.

sentence-transformers and torch (the ``[local]`` extra) are imported only when a model is first
loaded, so importing this package costs nothing.
"""

from .base import DEFAULT_LOCAL_MODEL, INSTALL_HINT, local_available
from .cross_encoder import AsyncCrossEncoderReranker, CrossEncoderReranker
from .embedding import (
    DEFAULT_EMBEDDING_MODEL,
    AsyncEmbeddingReranker,
    EmbeddingCache,
    EmbeddingReranker,
)
from .lexical import LexicalReranker

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
]
