"""Failover across rerankers: `RerankerChain` and `AsyncRerankerChain` try their tiers in order,
each behind its own `CircuitBreaker`, within one deadline shared by every tier.

`chain` holds the two chains; `breaker` the I/O-free circuit each tier sits behind. A chain
from the environment (``RERANK_FALLBACKS``) is built in `retrieval_stage.config`.
"""

from .breaker import (
    DEFAULT_COOLDOWN_S,
    DEFAULT_FAILURE_THRESHOLD,
    BreakerState,
    CircuitBreaker,
    Permit,
    Transition,
)
from .chain import DEFAULT_CHAIN_TIMEOUT_S, AsyncRerankerChain, RerankerChain

__all__ = [
    "DEFAULT_CHAIN_TIMEOUT_S",
    "DEFAULT_COOLDOWN_S",
    "DEFAULT_FAILURE_THRESHOLD",
    "AsyncRerankerChain",
    "BreakerState",
    "CircuitBreaker",
    "Permit",
    "RerankerChain",
    "Transition",
]
