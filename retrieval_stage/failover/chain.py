"""`RerankerChain` / `AsyncRerankerChain`: failover across rerankers, each behind a breaker.

A chain holds tiers (a primary, then fallbacks: any of our rerankers or a user's) and tries
them in order until one answers: a tier that raises (any exception but a cancellation:
`asyncio.CancelledError`, `KeyboardInterrupt`, `SystemExit`), or whose answer breaks the
contract (an item it was not given, a duplicate, a non-finite score), hands the call to the
next; an answer longer than the call's `top_k` is cut to it. In `AsyncRerankerChain` each
sync tier runs on a thread pool of its own (`SYNC_TIER_THREADS` threads), so a tier that hangs
fills only its own pool and never takes the threads the others need. Each tier has its own
`CircuitBreaker`: after `failure_threshold` consecutive failures it is skipped with no request
at all, and after `cooldown` seconds one call probes it again. All
tiers share one `timeout`: each of our clients takes the smaller of its own timeout and what
the chain's deadline has left (`_deadline.sharing`), so a hanging primary bounded by its own
shorter timeout leaves the rest to the next tier. Only when every tier failed or was skipped
does the chain raise `RerankChainError`, and `RerankStage` falls back to recall order.

The current span (the stage's RERANKER span) records which tier answered
(``retrieval_stage.tier``, its ``retrieval_stage.provider`` and ``reranker.model_name``) and
gets one event per tier that failed (``rerank.tier_failed``: its cause's type and a sanitised
message) or was skipped (``rerank.tier_skipped``). Breaker changes are log events
(``rerank.breaker_opened``, ``rerank.breaker_half_open``, ``rerank.breaker_closed``); metrics
count each tier's calls and each opening (`metrics.ChainMetrics`). The sync and async chains
share everything here but the few lines that call a tier.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

import anyio
from openinference.semconv.trace import RerankerAttributes
from opentelemetry import trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.util.types import AttributeValue

from .. import _deadline, validate
from .._args import snapshot
from .._deadline import Deadline
from .._log import get_logger
from .._redact import LIMIT, Hay, clean, scrubbed_message, shown_url
from ..errors import (
    RerankChainError,
    RerankError,
    RerankProtocolError,
    RerankTransportError,
    TierFailure,
)
from ..metrics import ChainMetrics
from ..models import RerankResponse, trusted_indices
from ..protocols import acall_reranker, call_reranker, checked_answer, str_attr
from ..spans.keys import ATTR_PROVIDER, ATTR_TIER
from .breaker import (
    DEFAULT_COOLDOWN_S,
    DEFAULT_FAILURE_THRESHOLD,
    BreakerState,
    CircuitBreaker,
    Permit,
    Transition,
)

__all__ = ["DEFAULT_CHAIN_TIMEOUT_S", "SYNC_TIER_THREADS", "AsyncRerankerChain", "RerankerChain"]

log = get_logger("retrieval_stage.chain")

T = TypeVar("T")

DEFAULT_CHAIN_TIMEOUT_S = 30.0
"""The chain's overall deadline by default: the clients' own default timeout."""

BACKSTOP_GRACE_S = 0.1
"""Seconds past the chain's deadline after which an async tier still running is cancelled."""

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
"""A URL quoted in free text: shown without userinfo, query or fragment (`shown_url`)."""

SYNC_TIER_THREADS = 8
"""Threads of each sync tier's own pool in `AsyncRerankerChain`: calls to that tier beyond
these wait for one of them (within the chain's deadline), never for another tier's."""

SKIPPED_OPEN = "circuit_open"
SKIPPED_DEADLINE = "deadline"


class _Tier:
    """One tier: the reranker, its breaker, and the names it is known by."""

    __slots__ = ("breaker", "index", "is_async", "metric_model", "provider", "reranker")

    def __init__(self, index: int, reranker: Any, breaker: CircuitBreaker) -> None:
        self.index = index
        self.reranker = reranker
        self.breaker = breaker
        self.provider = str_attr(reranker, "provider")
        # The metric label: configured, never a server's string (see RerankStage._metric_model).
        configured = "configured_model" if hasattr(reranker, "configured_model") else "model_name"
        self.metric_model = str_attr(reranker, configured)
        self.is_async = inspect.iscoroutinefunction(reranker.rerank)

    @property
    def model_name(self) -> str | None:
        """The model to record now (a TEI client learns it from the server's ``/info``)."""
        return str_attr(self.reranker, "model_name")

    def fields(self) -> dict[str, Any]:
        """The tier's identity for log lines and span events."""
        fields: dict[str, Any] = {"tier": self.index}
        if self.provider is not None:
            fields["provider"] = self.provider
        if self.metric_model is not None:
            fields["model"] = self.metric_model
        return fields


class _Call(Generic[T]):
    """One chain call: its arguments, its deadline, what the failed tiers spent and why."""

    def __init__(
        self,
        query: str,
        items: list[T],
        texts: list[str],
        text: Callable[[T], str] | None,
        top_k: int | None,
        deadline: Deadline | None,
    ) -> None:
        self.query = query
        self.items = items
        self.texts = texts
        self.text = text
        self.top_k = top_k
        self.deadline = deadline
        self.failures: list[TierFailure] = []
        self.requests = self.retries = self.batches = 0
        self._hay: Hay | None = None

    def spend(self, requests: int, retries: int, batches: int) -> None:
        self.requests += requests
        self.retries += retries
        self.batches += batches

    def hay(self) -> Hay:
        """What was sent, to remove any echo of it from a tier's message (built once)."""
        if self._hay is None:
            self._hay = Hay([self.query, *self.texts])
        return self._hay

    def sharing(self) -> contextlib.AbstractContextManager[None]:
        """The block in which our clients take at most what the chain's deadline has left."""
        if self.deadline is None:
            return contextlib.nullcontext()
        return _deadline.sharing(self.deadline.remaining)


class _ChainCore:
    """Everything of a chain that is neither sync nor async: tiers, breakers, bookkeeping."""

    provider = "chain"
    """What the stage records before a tier answers; the answering tier's replaces it."""
    model_name: str | None = None
    configured_model: str | None = None

    def __init__(
        self,
        tiers: Iterable[Any],
        *,
        timeout: float | None = DEFAULT_CHAIN_TIMEOUT_S,
        failure_threshold: int = DEFAULT_FAILURE_THRESHOLD,
        cooldown: float = DEFAULT_COOLDOWN_S,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        if isinstance(tiers, (str, bytes)) or not isinstance(tiers, Iterable):
            raise TypeError(f"tiers must be a list of rerankers, got {type(tiers).__name__}")
        rerankers = list(tiers)
        if not rerankers:
            raise ValueError(f"a {type(self).__name__} needs at least one tier")
        for i, reranker in enumerate(rerankers):
            if not callable(getattr(reranker, "rerank", None)):
                raise TypeError(
                    f"tier {i} must have a rerank() method, got {type(reranker).__name__}"
                )
            self._check_tier(i, reranker)
        self.timeout = None if timeout is None else validate.timeout(timeout)
        # The deadline's and the breakers' clock: not a setting, so not in the signature (as
        # the clients' clock); tests replace it (tests/hooks.py `hooked_chain`).
        self._clock: Callable[[], float] = time.monotonic
        self._tiers = tuple(
            _Tier(i, r, CircuitBreaker(failure_threshold, cooldown, clock=time.monotonic))
            for i, r in enumerate(rerankers)
        )
        self.failure_threshold = self._tiers[0].breaker.failure_threshold
        self.cooldown = self._tiers[0].breaker.cooldown
        self._metrics = ChainMetrics(meter_provider)

    def _check_tier(self, index: int, reranker: Any) -> None:
        """Refuse a tier this flavour cannot drive."""

    def __repr__(self) -> str:
        tiers = ", ".join(repr(t.reranker) for t in self._tiers)
        return (
            f"{type(self).__name__}([{tiers}], timeout={self.timeout}, "
            f"failure_threshold={self.failure_threshold}, cooldown={self.cooldown:g})"
        )

    @property
    def tiers(self) -> tuple[Any, ...]:
        """The rerankers, primary first."""
        return tuple(t.reranker for t in self._tiers)

    @property
    def breakers(self) -> tuple[CircuitBreaker, ...]:
        """Each tier's circuit breaker, in tier order (to read their states)."""
        return tuple(t.breaker for t in self._tiers)

    # -- one call's bookkeeping, the same for both drivers -----------------------------------

    def _begin(
        self, query: str, items: Sequence[T], text: Callable[[T], str] | None, top_k: int | None
    ) -> _Call[T]:
        kept, texts, cap = snapshot(query, items, text, top_k)
        deadline = None if self.timeout is None else Deadline(self.timeout, self._clock)
        return _Call(query, kept, texts, text, cap or None, deadline)

    def _admit(self, call: _Call[Any], tier: _Tier) -> Permit | None:
        """Leave to call `tier`, or None (recorded as a skip) when the chain's deadline has
        run out or the tier's circuit is open: a skipped tier costs no request."""
        if call.deadline is not None and call.deadline.expired():
            self._skipped(call, tier, SKIPPED_DEADLINE)
            return None
        permit, change = tier.breaker.acquire()
        if change is not None:
            self._changed(tier, change, None)
        if permit is None:
            self._skipped(call, tier, SKIPPED_OPEN)
        return permit

    def _skipped(self, call: _Call[Any], tier: _Tier, reason: str) -> None:
        what = "its circuit is open" if reason == SKIPPED_OPEN else "no time was left"
        call.failures.append(TierFailure(tier.index, tier.provider, reason, f"skipped: {what}"))
        fields = {**tier.fields(), "reason": reason}
        log.debug("rerank.tier_skipped", **fields)
        _event("rerank.tier_skipped", fields)
        self._metrics.tier_call(
            tier.index, f"skipped_{reason}", provider=tier.provider, model=tier.metric_model
        )

    def _failed(self, call: _Call[Any], tier: _Tier, permit: Permit, exc: Exception) -> None:
        """`exc` (ours or any other exception a tier raised) counted as the tier's failure."""
        change = tier.breaker.failure(permit)
        requests = getattr(exc, "requests", 0) if isinstance(exc, RerankError) else 0
        if isinstance(exc, RerankError):
            call.spend(exc.requests, exc.retries, exc.batches)
        cause = type(exc).__name__
        message = self._sanitised(call, tier, exc)
        call.failures.append(TierFailure(tier.index, tier.provider, cause, f"{cause}: {message}"))
        fields = {**tier.fields(), "caused_by": cause, "error": message, "requests": requests}
        log.info("rerank.tier_failed", **fields)
        _event("rerank.tier_failed", fields)
        self._metrics.tier_call(
            tier.index, "error", provider=tier.provider, model=tier.metric_model
        )
        if change is not None:
            self._changed(tier, change, cause)

    def _answered(
        self, call: _Call[T], tier: _Tier, permit: Permit, response: RerankResponse[T]
    ) -> RerankResponse[T] | None:
        """The tier's answer as the chain's, or None (counted as its failure) when it breaks
        the contract: only the caller's own items, each once, with finite scores."""
        try:
            # Checks identity and scores only, for any item type (Candidate is the usual).
            checked_answer(call.items, response.results, call.top_k, who=f"tier {tier.index}")
        except RerankProtocolError as exc:
            exc.requests = getattr(response, "requests", 0)
            exc.retries = getattr(response, "retries", 0)
            exc.batches = getattr(response, "batches", 0)
            self._failed(call, tier, permit, exc)
            return None
        change = tier.breaker.success(permit)
        if change is not None:
            self._changed(tier, change, None)
        self._metrics.tier_call(tier.index, "ok", provider=tier.provider, model=tier.metric_model)
        model = response.model or tier.model_name
        span = trace.get_current_span()
        if span.is_recording():
            answered: dict[str, AttributeValue] = {ATTR_TIER: tier.index}
            if tier.provider is not None:
                answered[ATTR_PROVIDER] = tier.provider
            if model is not None:
                answered[RerankerAttributes.RERANKER_MODEL_NAME] = model
            span.set_attributes(answered)
        results, indices = response.results, trusted_indices(call.items, response)
        if call.top_k is not None and len(results) > call.top_k:
            # A tier that ignored top_k: the chain answers what was asked for, no more.
            results = results[: call.top_k]
            indices = indices[: call.top_k] if indices is not None else None
        return RerankResponse(
            results=results,
            usage=response.usage,
            model=model,
            requests=call.requests + response.requests,
            retries=call.retries + response.retries,
            batches=call.batches + response.batches,
            # Positions in call.items (the caller's own order): passed on only when provably
            # so (our own clients' checked indices, naming call.items' own objects).
            indices=indices,
        )

    def _exhausted(self, call: _Call[Any]) -> RerankChainError:
        error = RerankChainError(tuple(call.failures))
        error.requests, error.retries, error.batches = call.requests, call.retries, call.batches
        return error

    def _sanitised(self, call: _Call[Any], tier: _Tier, exc: BaseException) -> str:
        """`exc`'s message fit for a span, a log line and an error: a user's reranker may
        quote its URL's credentials, the query or a document; ours already quote none."""
        message = str(exc)
        base_url = getattr(tier.reranker, "base_url", None)
        if isinstance(base_url, str):
            message = scrubbed_message(message, base_url)
        message = _URL.sub(lambda m: shown_url(m.group(0)), message)
        return clean(message, call.hay(), limit=LIMIT)

    def _changed(self, tier: _Tier, change: Transition, caused_by: str | None) -> None:
        fields = tier.fields()
        if change.after is BreakerState.open:
            self._metrics.breaker_opened(
                tier.index, provider=tier.provider, model=tier.metric_model
            )
            log.warning(
                "rerank.breaker_opened",
                **fields,
                failures=change.failures,
                cooldown_s=tier.breaker.cooldown,
                previous=change.before.value,
                caused_by=caused_by,
            )
        elif change.after is BreakerState.half_open:
            log.info("rerank.breaker_half_open", **fields, cooldown_s=tier.breaker.cooldown)
        else:
            log.info("rerank.breaker_closed", **fields, previous=change.before.value)


def _event(name: str, fields: dict[str, Any]) -> None:
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(name, {k: v for k, v in fields.items() if v is not None})


def _call_sync(reranker: Any, call: _Call[T]) -> RerankResponse[T]:
    return call_reranker(reranker, call.query, call.items, text=call.text, top_k=call.top_k)


async def _call_async(reranker: Any, call: _Call[T]) -> RerankResponse[T]:
    return await acall_reranker(reranker, call.query, call.items, text=call.text, top_k=call.top_k)


class RerankerChain(_ChainCore):
    """Try sync rerankers in order on a `RerankError`, each behind its own circuit breaker.

    ``RerankerChain([primary, secondary], timeout=10.0, failure_threshold=3, cooldown=30.0)``
    satisfies `Reranker` and drives a `RerankStage` like any reranker. `timeout` is the
    deadline shared by all tiers (None: none beyond each tier's own); give each client a
    shorter `timeout` of its own so that a hanging tier leaves time for the next. A user's sync
    reranker cannot be interrupted: the chain only skips the tiers after it once the deadline
    has passed. `meter_provider` receives the chain's metrics (default: the global one).
    Thread-safe: one chain may serve many threads at once.
    """

    def _check_tier(self, index: int, reranker: Any) -> None:
        if inspect.iscoroutinefunction(reranker.rerank):
            raise TypeError(
                f"tier {index} ({type(reranker).__name__}) is async: use AsyncRerankerChain"
            )

    def __enter__(self) -> RerankerChain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every tier that can be closed."""
        for tier in self._tiers:
            close = getattr(tier.reranker, "close", None)
            if callable(close):
                close()

    def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        """The first answering tier's results: the caller's items, best first."""
        return self.rerank_response(query, items, text=text, top_k=top_k).results

    def rerank_response(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> RerankResponse[T]:
        """Like `rerank`, with the answering tier's usage and model and what every tier tried
        spent; `RerankChainError` when every tier failed or was skipped."""
        call = self._begin(query, items, text, top_k)
        if not call.items:
            return RerankResponse(results=[])
        with call.sharing():
            for tier in self._tiers:
                answer = self._try(call, tier)
                if answer is not None:
                    return answer
        raise self._exhausted(call)

    def _try(self, call: _Call[T], tier: _Tier) -> RerankResponse[T] | None:
        permit = self._admit(call, tier)
        if permit is None:
            return None
        try:
            response = _call_sync(tier.reranker, call)
        except Exception as exc:  # any tier error is its failure; cancellation is not
            self._failed(call, tier, permit, exc)
            return None
        except BaseException:
            tier.breaker.release(permit)
            raise
        return self._answered(call, tier, permit, response)


class AsyncRerankerChain(_ChainCore):
    """The awaitable twin of `RerankerChain`: tiers may be async or sync rerankers (a sync
    one runs in a worker thread). An async tier is cancelled when the chain's deadline runs
    out; safe under any number of concurrent tasks. Each sync tier runs on a pool of its own
    (`SYNC_TIER_THREADS`), so one that hangs cannot take the threads of the others."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pools: dict[int, ThreadPoolExecutor] = {}
        self._pools_lock = threading.Lock()

    async def __aenter__(self) -> AsyncRerankerChain:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every tier that can be closed (``aclose``, else ``close``), and stop the sync
        tiers' pools (a call still running in one finishes; none queued starts)."""
        with self._pools_lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.shutdown(wait=False, cancel_futures=True)
        for tier in self._tiers:
            aclose = getattr(tier.reranker, "aclose", None)
            close = getattr(tier.reranker, "close", None)
            if callable(aclose):
                await aclose()
            elif callable(close):
                close()

    async def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        """The first answering tier's results: the caller's items, best first."""
        return (await self.rerank_response(query, items, text=text, top_k=top_k)).results

    async def rerank_response(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> RerankResponse[T]:
        """Like `rerank`, with usage, model and what every tier tried spent."""
        call = self._begin(query, items, text, top_k)
        if not call.items:
            return RerankResponse(results=[])
        with call.sharing():
            for tier in self._tiers:
                answer = await self._try(call, tier)
                if answer is not None:
                    return answer
        raise self._exhausted(call)

    async def _try(self, call: _Call[T], tier: _Tier) -> RerankResponse[T] | None:
        permit = self._admit(call, tier)
        if permit is None:
            return None
        try:
            response = await self._bounded(call, tier)
        except Exception as exc:  # any tier error is its failure; cancellation is not
            self._failed(call, tier, permit, exc)
            return None
        except BaseException:
            tier.breaker.release(permit)
            raise
        return self._answered(call, tier, permit, response)

    async def _bounded(self, call: _Call[T], tier: _Tier) -> RerankResponse[T]:
        """The tier's answer, within what the chain's deadline has left."""
        if call.deadline is None:
            return await self._call(call, tier)
        left = call.deadline.remaining()
        # A backstop just after the deadline: our clients stop at it themselves (their error
        # counts the requests they made); a user's async reranker is cancelled here.
        with anyio.move_on_after(left + BACKSTOP_GRACE_S):
            return await self._call(call, tier)
        raise RerankTransportError(
            f"no answer within the {left:.3g} s the chain's deadline left", kind="deadline"
        )

    async def _call(self, call: _Call[T], tier: _Tier) -> RerankResponse[T]:
        if tier.is_async:
            return await _call_async(tier.reranker, call)
        # The caller's context (its span, the shared deadline) goes with the call, as
        # asyncio.to_thread would carry it, but onto this tier's own pool.
        context = contextvars.copy_context()
        run = functools.partial(context.run, _call_sync, tier.reranker, call)
        return await asyncio.get_running_loop().run_in_executor(self._pool(tier), run)

    def _pool(self, tier: _Tier) -> ThreadPoolExecutor:
        with self._pools_lock:
            pool = self._pools.get(tier.index)
            if pool is None:
                pool = ThreadPoolExecutor(
                    SYNC_TIER_THREADS, thread_name_prefix=f"rerank-tier-{tier.index}"
                )
                self._pools[tier.index] = pool
            return pool
