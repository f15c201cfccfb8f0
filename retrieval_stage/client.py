"""HTTP rerank clients: `RerankClient` (sync) and `AsyncRerankClient`.

Both map every result back to the caller's own item by the response's index (never by
position), validate every response, split batches above the server's cap, retry what is worth
retrying inside one deadline per call, and translate httpx errors into the `RerankError` tree.
All of that is decided once, in the sans-I/O flow of `_flow`; this module holds the two thin
drivers that do its I/O: blocking calls here, awaits with concurrent sub-batches there.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import anyio
import httpx

# The argument helpers live in `_args`; re-exported for callers that imported them from here.
from ._args import check_sendable as check_sendable
from ._args import check_top_k as check_top_k
from ._args import default_text as default_text
from ._args import masked_url as masked_url
from ._args import rank
from ._args import snapshot as snapshot
from ._deadline_io import CALL_DEADLINE, DeadlineTransport
from ._flow import (
    EXPIRED,
    Call,
    ClientCore,
    Finished,
    Flow,
    Fork,
    Pairs,
    Reply,
    Send,
    Sleep,
    advance,
)
from .errors import RerankClientClosedError, RerankError
from .models import RerankResponse

__all__ = ["AsyncRerankClient", "RerankClient"]

T = TypeVar("T")
H = TypeVar("H", httpx.Client, httpx.AsyncClient)

_CLOSED = (
    "this {cls} has been closed: create a new client (or keep this one open) "
    "instead of reusing a closed one"
)


class _ClientBase(ClientCore[H]):
    """The parts of a call both drivers share around the flow."""

    def _begin(
        self, query: str, items: Sequence[T], text: Callable[[T], str] | None, top_k: int | None
    ) -> tuple[list[T], Call]:
        if self._http.is_closed:
            raise RerankClientClosedError(_CLOSED.format(cls=type(self).__name__))
        # `time.time` is looked up per call, so a test's fake clock reaches Retry-After dates.
        return self._start(query, items, text, top_k, time.time)

    def _finish(self, items: list[T], call: Call, pairs: Pairs) -> RerankResponse[T]:
        return RerankResponse(
            results=[(items[i], score) for i, score in rank(pairs, call.top_k)],
            usage=call.usage,
            model=call.model or self.model_name,
            requests=call.requests,
            retries=call.retries,
            batches=call.batches,
        )


def _environment_proxies() -> bool:
    """Whether HTTP_PROXY, HTTPS_PROXY or ALL_PROXY (any case) configure a proxy."""
    import os

    return any(
        os.environ.get(name) or os.environ.get(name.lower())
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
    )


class RerankClient(_ClientBase[httpx.Client]):
    """Synchronous rerank client; sub-batches go one after another.

    ``with RerankClient("http://localhost:8080") as client:
    client.rerank("what is rust", ["rust is a language", "bananas"])``
    """

    def _new_http(self) -> httpx.Client:
        # Our transport caps every socket read at the call's deadline. httpx builds proxy
        # routes from HTTP(S)_PROXY only for its own transport, so where a proxy is configured
        # the client keeps httpx's (the deadline is then checked between reads, as with a
        # caller's own http_client) rather than silently going around the proxy.
        if _environment_proxies():
            return httpx.Client()
        return httpx.Client(transport=DeadlineTransport())

    @classmethod
    def _http_type(cls) -> type[httpx.Client]:
        return httpx.Client

    def __enter__(self) -> RerankClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the httpx client if this client created it."""
        if self._owns_http:
            self._http.close()

    def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        """The caller's items with their scores, best first, cut to `top_k` when given."""
        return self.rerank_response(query, items, text=text, top_k=top_k).results

    def rerank_response(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> RerankResponse[T]:
        """Like `rerank`, with usage, model and request counts."""
        kept, call = self._begin(query, items, text, top_k)
        try:
            pairs = self._drive(call, call.flow())
        except RerankError as exc:
            raise call.spent(exc) from None
        return self._finish(kept, call, pairs)

    def _drive(self, call: Call, flow: Flow) -> Pairs:
        """Run `flow` to its end, doing each step it asks for in turn."""
        answer: Any = None
        while not isinstance(step := advance(flow, answer), Finished):
            if isinstance(step, Send):
                answer = self._send(call, step)
            elif isinstance(step, Sleep):
                time.sleep(step.seconds)
                answer = None
            else:
                answer = [self._drive(call, sub) for sub in step.flows]
        return step.value

    def _send(self, call: Call, step: Send) -> Reply | httpx.HTTPError | object:
        """One request, read in full within the call's deadline.

        httpx's timeout bounds each read, not the whole body, so a server trickling bytes could
        hold the call for ever: the deadline is checked after every chunk received, and
        `DeadlineTransport` caps every socket operation at the time left.
        """
        remaining = call.deadline.remaining()
        token = CALL_DEADLINE.set(time.monotonic() + remaining)
        try:
            with self._http.stream(
                step.method, step.url, headers=step.headers, json=step.body, timeout=remaining
            ) as response:
                parts: list[bytes] = []
                for chunk in response.iter_bytes():
                    parts.append(chunk)
                    if call.deadline.expired():
                        return EXPIRED
                return Reply(response.status_code, response.headers, b"".join(parts))
        except httpx.HTTPError as exc:
            return exc
        except RuntimeError:
            if self._http.is_closed:  # closed by another thread mid-call
                raise RerankClientClosedError(_CLOSED.format(cls=type(self).__name__)) from None
            raise
        finally:
            CALL_DEADLINE.reset(token)


_LOOP_CLOSED = (
    "this AsyncRerankClient was used in an event loop that has closed (a second asyncio.run?): "
    "create the client inside the running loop, e.g. with `async with AsyncRerankClient(...)` "
    "in the coroutine that asyncio.run runs"
)


class AsyncRerankClient(_ClientBase[httpx.AsyncClient]):
    """Asynchronous rerank client; a call's sub-batches go concurrently.

    `max_concurrency` bounds the requests of one call; concurrent calls each get their own
    bound (a client-wide limiter would tie the client to one event loop). One cancel scope
    bounds the whole call at its deadline.
    """

    _loop: weakref.ref[asyncio.AbstractEventLoop] | None = None

    def _new_http(self) -> httpx.AsyncClient:
        # The call's cancel scope enforces the deadline; the per-phase timeouts only back it up.
        return httpx.AsyncClient(timeout=httpx.Timeout(self.timeout))

    @classmethod
    def _http_type(cls) -> type[httpx.AsyncClient]:
        return httpx.AsyncClient

    async def __aenter__(self) -> AsyncRerankClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the httpx client if this client created it."""
        if self._owns_http:
            await self._http.aclose()

    async def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, float]]:
        """The caller's items with their scores, best first, cut to `top_k` when given."""
        return (await self.rerank_response(query, items, text=text, top_k=top_k)).results

    async def rerank_response(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> RerankResponse[T]:
        """Like `rerank`, with usage, model and request counts."""
        kept, call = self._begin(query, items, text, top_k)
        if not call.texts:  # nothing to send: no loop to check, no deadline to arm
            return self._finish(kept, call, [])
        self._check_loop()
        limiter = anyio.CapacityLimiter(self.max_concurrency)
        try:
            with anyio.CancelScope(
                deadline=anyio.current_time() + call.deadline.remaining()
            ) as scope:
                pairs = await self._drive(call, call.flow(), limiter)
            if scope.cancelled_caught:
                raise call.deadline_error()
        except RerankError as exc:
            raise call.spent(exc) from None
        return self._finish(kept, call, pairs)

    def _check_loop(self) -> None:
        """Refuse, with what to do, a client whose connections belong to a closed loop."""
        loop = asyncio.get_running_loop()
        previous = self._loop() if self._loop is not None else None
        if previous is not None and previous is not loop and previous.is_closed():
            raise RerankClientClosedError(_LOOP_CLOSED)
        self._loop = weakref.ref(loop)

    async def _drive(self, call: Call, flow: Flow, limiter: anyio.CapacityLimiter) -> Pairs:
        """Run `flow` to its end, awaiting each step it asks for."""
        answer: Any = None
        while not isinstance(step := advance(flow, answer), Finished):
            if isinstance(step, Send):
                async with limiter:
                    answer = await self._send(call, step)
            elif isinstance(step, Sleep):
                await anyio.sleep(step.seconds)
                answer = None
            else:
                answer = await self._fork(call, step, limiter)
        return step.value

    async def _fork(self, call: Call, fork: Fork, limiter: anyio.CapacityLimiter) -> list[Pairs]:
        """Every sub-flow under one task group, all or nothing: the first `RerankError`
        cancels the rest and is raised, so no partial result can carry wrong labels."""
        if len(fork.flows) == 1:
            return [await self._drive(call, fork.flows[0], limiter)]
        results: list[Pairs | None] = [None] * len(fork.flows)
        failures: list[Exception] = []

        async def run(i: int, flow: Flow) -> None:
            try:
                results[i] = await self._drive(call, flow, limiter)
            except Exception as exc:  # any failure, raised bare as the sync client does
                failures.append(exc)
                tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            for i, flow in enumerate(fork.flows):
                tg.start_soon(run, i, flow)
        if failures:
            raise failures[0]
        return [r for r in results if r is not None]

    async def _send(self, call: Call, step: Send) -> Reply | httpx.HTTPError:
        extra: dict[str, Any] = {}
        if not self._owns_http:  # the caller's client has its own timeouts; cap them
            extra["timeout"] = call.deadline.remaining()
        try:
            response = await self._http.request(
                step.method, step.url, headers=step.headers, json=step.body, **extra
            )
        except httpx.HTTPError as exc:
            return exc
        except RuntimeError as exc:
            if self._http.is_closed:
                raise RerankClientClosedError(_CLOSED.format(cls=type(self).__name__)) from None
            if "loop" in str(exc).lower():
                raise RerankClientClosedError(_LOOP_CLOSED) from None
            raise
        return Reply(response.status_code, response.headers, response.content)
