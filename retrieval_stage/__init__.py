"""retrieval-stage: the rerank stage of retrieval pipelines.

A validating rerank client that maps every result back to the caller's own item by index, and
a stage that wraps each call in an OpenInference RERANKER span and falls back to recall order
when the reranker fails.
"""

from ._version import __version__
from .client import AsyncRerankClient, RerankClient
from .client.providers import PROVIDERS
from .errors import (
    RerankChainError,
    RerankClientClosedError,
    RerankError,
    RerankProtocolError,
    RerankStatusError,
    RerankTransportError,
)
from .failover import AsyncRerankerChain, RerankerChain
from .models import Candidate, Reranked, RerankResponse, Usage
from .null import AsyncNullReranker, NullReranker
from .protocols import AsyncReranker, Reranker
from .stage import RerankStage

__all__ = [
    "PROVIDERS",
    "AsyncNullReranker",
    "AsyncRerankClient",
    "AsyncReranker",
    "AsyncRerankerChain",
    "Candidate",
    "NullReranker",
    "RerankChainError",
    "RerankClient",
    "RerankClientClosedError",
    "RerankError",
    "RerankProtocolError",
    "RerankResponse",
    "RerankStage",
    "RerankStatusError",
    "RerankTransportError",
    "Reranked",
    "Reranker",
    "RerankerChain",
    "Usage",
    "__version__",
]
