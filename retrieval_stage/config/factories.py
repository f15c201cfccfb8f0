"""The factories: a reranker, or a chain of them, from `RerankSettings` or the environment.

`make_reranker` / `make_async_reranker` turn one tier's settings into a client, the in-process
cross-encoder or the null reranker; `make_chain` / `make_async_chain` turn `ChainSettings`
into a chain over such tiers. Both kinds read ``RERANK_*`` when given no settings, and the
first two build a chain themselves when ``RERANK_FALLBACKS`` is set. They sit above
`settings` and `fallbacks`, which never import them: the wing has no import cycle.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from .._log import get_logger
from ..client import AsyncRerankClient, RerankClient
from ..failover import AsyncRerankerChain, RerankerChain
from ..null import AsyncNullReranker, NullReranker
from ..validate import InvalidSetting
from .fallbacks import FALLBACKS, ChainSettings
from .settings import LOCAL, PROVIDER, RerankSettings

__all__ = ["make_async_chain", "make_async_reranker", "make_chain", "make_reranker"]

log = get_logger("retrieval_stage.config")

_L = TypeVar("_L")

if TYPE_CHECKING:
    from ..local import AsyncCrossEncoderReranker, CrossEncoderReranker


def make_reranker(
    settings: RerankSettings | None = None, *, strict: bool = False
) -> RerankClient | NullReranker | CrossEncoderReranker | RerankerChain:
    """A `RerankClient` for `settings` (default: `RerankSettings.from_env`), else `NullReranker`.

    ``RERANK_PROVIDER=local`` (no endpoint) gives the in-process `CrossEncoderReranker` with
    ``RERANK_MODEL`` (default ``cross-encoder/ms-marco-MiniLM-L-6-v2``); without the [local]
    extra that fails open to `NullReranker` like any unreadable configuration.

    Read from the environment with ``RERANK_FALLBACKS`` set, the result is a `RerankerChain`
    over the primary and the fallbacks (`make_chain`).

    `strict` applies when reading the environment: see `RerankSettings.from_env`. Close the
    result when done (``with make_reranker() as reranker: ...`` works for both kinds).
    """
    if settings is None and os.environ.get(FALLBACKS, "").strip():
        return make_chain(strict=strict)
    if settings is None:
        settings = RerankSettings.from_env(strict=strict)
    if not settings.enabled:
        return NullReranker()
    if settings.provider == LOCAL:
        from ..local import CrossEncoderReranker

        return _local(CrossEncoderReranker, settings, strict) or NullReranker()
    return RerankClient(settings.endpoint, **settings.client_kwargs())


def make_async_reranker(
    settings: RerankSettings | None = None, *, strict: bool = False
) -> AsyncRerankClient | AsyncNullReranker | AsyncCrossEncoderReranker | AsyncRerankerChain:
    """The awaitable twin of `make_reranker`: `AsyncRerankClient`, else `AsyncNullReranker`.

    The null choice is awaitable too, so ``await reranker.rerank(...)`` works whichever is
    configured (``async with make_async_reranker() as reranker: ...`` as well).
    """
    if settings is None and os.environ.get(FALLBACKS, "").strip():
        return make_async_chain(strict=strict)
    if settings is None:
        settings = RerankSettings.from_env(strict=strict)
    if not settings.enabled:
        return AsyncNullReranker()
    if settings.provider == LOCAL:
        from ..local import AsyncCrossEncoderReranker

        return _local(AsyncCrossEncoderReranker, settings, strict) or AsyncNullReranker()
    return AsyncRerankClient(settings.endpoint, **settings.client_kwargs())


def _local(factory: Callable[..., _L], settings: RerankSettings, strict: bool) -> _L | None:
    """The in-process cross-encoder (loaded lazily), or None when its extra is missing."""
    from ..local import DEFAULT_LOCAL_MODEL, TORCH_INSTALL_HINT

    try:
        return factory(settings.model or DEFAULT_LOCAL_MODEL)
    except ImportError:
        reason = f"needs sentence-transformers (the [torch] extra): {TORCH_INSTALL_HINT}"
        if strict:
            raise InvalidSetting("provider", reason, f"{PROVIDER}=local") from None
        log.warning(
            "rerank.config_invalid",
            key=PROVIDER,
            value=LOCAL,
            reason=reason,
            fallback="NullReranker",
        )
        return None


def make_chain(
    settings: ChainSettings | None = None, *, strict: bool = False
) -> RerankerChain | NullReranker:
    """A `RerankerChain` over every configured tier (default: `ChainSettings.from_env`), or
    `NullReranker` when no tier is configured. Close it when done (it closes its tiers)."""
    if settings is None:
        settings = ChainSettings.from_env(strict=strict)
    if not settings.tiers:
        return NullReranker()
    tiers = [make_reranker(tier, strict=strict) for tier in settings.tiers]
    return RerankerChain(tiers, **settings.chain_kwargs())


def make_async_chain(
    settings: ChainSettings | None = None, *, strict: bool = False
) -> AsyncRerankerChain | AsyncNullReranker:
    """The awaitable twin of `make_chain`."""
    if settings is None:
        settings = ChainSettings.from_env(strict=strict)
    if not settings.tiers:
        return AsyncNullReranker()
    tiers = [make_async_reranker(tier, strict=strict) for tier in settings.tiers]
    return AsyncRerankerChain(tiers, **settings.chain_kwargs())
