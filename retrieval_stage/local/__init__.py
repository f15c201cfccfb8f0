"""In-process rerankers: an embedding model (numpy, or sentence-transformers), a cross-encoder
through sentence-transformers, and a lexical fallback.

- `cross_encoder`: `CrossEncoderReranker` (and its async twin);
- `embedding`: `EmbeddingReranker`, `EmbeddingCache` (and the async twin);
- `lexical`: `LexicalReranker`, a bag-of-words heuristic that needs no extra, and `word_count`,
  the words it reads (what the server charges a lexical request);
- `bert`: `BertEncoder`, all-MiniLM-L6-v2 (a BERT encoder with mean pooling) in numpy, no torch;
- `base`: what the model rerankers share (load once, close, the worker-thread twin);
- `model_source`: where a model's files come from, offline first.

The embedding model needs the light ``[local]`` extra (tokenizers, safetensors, numpy, the
packaged model); the cross-encoder needs sentence-transformers and torch (``[torch]``). Either
is imported only when a model is first loaded, so importing this package costs nothing.
"""

from .base import (
    DEFAULT_LOCAL_MODEL,
    INSTALL_HINT,
    TORCH_INSTALL_HINT,
    embedding_available,
    light_embedding_available,
    local_available,
)
from .bert import BertEncoder, UnsupportedModelError
from .cross_encoder import AsyncCrossEncoderReranker, CrossEncoderReranker
from .embedding import (
    DEFAULT_EMBEDDING_MODEL,
    AsyncEmbeddingReranker,
    EmbeddingCache,
    EmbeddingReranker,
    choose_backend,
)
from .lexical import LexicalReranker, word_count

__all__ = [
    "DEFAULT_EMBEDDING_MODEL",
    "DEFAULT_LOCAL_MODEL",
    "INSTALL_HINT",
    "TORCH_INSTALL_HINT",
    "AsyncCrossEncoderReranker",
    "AsyncEmbeddingReranker",
    "BertEncoder",
    "CrossEncoderReranker",
    "EmbeddingCache",
    "EmbeddingReranker",
    "LexicalReranker",
    "UnsupportedModelError",
    "choose_backend",
    "embedding_available",
    "light_embedding_available",
    "local_available",
    "word_count",
]
