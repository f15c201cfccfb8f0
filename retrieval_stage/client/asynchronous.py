"""`AsyncRerankClient`: the asynchronous driver of the rerank flow.

A call's sub-batches go concurrently under one task group, bounded by `max_concurrency`; one
cancel scope bounds the whole call at its deadline.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import anyio
import httpx

from ..errors import RerankClientClosedError, RerankError, RerankProtocolError
from ..models import RerankResponse
from .body import already_read, read_body
from .core import ClientCore
from .flow import Call
from .json_steps import async_reply
from .steps import Finished, Flow, Fork, Pairs, Reply, Send, Sleep, advance

__all__ = ["AsyncRerankClient"]

T = TypeVar("T")

_LOOP_CLOSED = (
    "this AsyncRerankClient was used in an event loop that has closed (a second asyncio.run?): "
    "create the client inside the running loop, e.g. with `async with AsyncRerankClient(...)` "
    "in the coroutine that asyncio.run runs"
)


class AsyncRerankClient(ClientCore[httpx.AsyncClient]):
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

    async def _send(self, call: Call, step: Send) -> Reply | httpx.HTTPError | RerankProtocolError:
        extra: dict[str, Any] = {}
        if not self._owns_http:  # the caller's client has its own timeouts; cap them
            extra["timeout"] = call.deadline.remaining()
        try:
            # Never a redirect (it would carry the key elsewhere); raw bytes, inflated within
            # max_response_bytes by `read_body` (leaving early closes the connection).
            async with self._http.stream(
                step.method,
                step.url,
                headers=step.headers,
                json=step.body,
                follow_redirects=False,
                **extra,
            ) as response:
                limit = self._plan.max_response_bytes
                if response.is_stream_consumed:  # a transport that read it (a test's mock)
                    content = already_read(response.content, limit)
                else:
                    content = await read_body(response.headers, response.aiter_raw(), limit)
                status, headers = response.status_code, response.headers
        except RerankProtocolError as exc:
            return exc
        except httpx.InvalidURL:  # a redirect whose Location httpx cannot even parse
            return RerankProtocolError(
                "the server answered a redirect to a Location that is not a URL (not followed)"
            )
        except httpx.HTTPError as exc:
            return exc
        except RuntimeError as exc:
            if self._http.is_closed:
                raise self._closed_error() from None
            if "loop" in str(exc).lower():
                raise RerankClientClosedError(_LOOP_CLOSED) from None
            raise
        return await async_reply(status, headers, content)
