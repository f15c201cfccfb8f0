"""Configuration: `RerankSettings` and ``RERANK_*`` (`settings`), a chain's tiers and
``RERANK_FALLBACKS`` (`fallbacks`), and the factories that build rerankers from them
(`factories`). Import from here: ``from retrieval_stage.config import make_reranker``.
"""

from .factories import make_async_chain, make_async_reranker, make_chain, make_reranker
from .fallbacks import (
    BREAKER_COOLDOWN,
    BREAKER_FAILURES,
    CHAIN_ENV_KEYS,
    CHAIN_TIMEOUT,
    ENTRY_FIELDS,
    FALLBACK_API_KEY,
    FALLBACKS,
    ChainSettings,
    chain_values,
    parse_fallbacks,
)
from .settings import (
    API_KEY,
    API_KEY_HEADER,
    BATCH_SIZE,
    DEFAULT_TIMEOUT_S,
    ENDPOINT,
    ENV_KEYS,
    LOCAL,
    MODEL,
    PROVIDER,
    TIMEOUT,
    RerankSettings,
)

__all__ = [
    "API_KEY",
    "API_KEY_HEADER",
    "BATCH_SIZE",
    "BREAKER_COOLDOWN",
    "BREAKER_FAILURES",
    "CHAIN_ENV_KEYS",
    "CHAIN_TIMEOUT",
    "DEFAULT_TIMEOUT_S",
    "ENDPOINT",
    "ENTRY_FIELDS",
    "ENV_KEYS",
    "FALLBACKS",
    "FALLBACK_API_KEY",
    "LOCAL",
    "MODEL",
    "PROVIDER",
    "TIMEOUT",
    "ChainSettings",
    "RerankSettings",
    "chain_values",
    "make_async_chain",
    "make_async_reranker",
    "make_chain",
    "make_reranker",
    "parse_fallbacks",
]
