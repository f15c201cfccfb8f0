"""`AsyncRerankClient`: the asynchronous driver of the rerank flow.

A call's sub-batches go concurrently under one task group, bounded by `max_concurrency`; one
cancel scope bounds the whole call at its deadline. Requests go through aiohttp
(`aiohttp_io`), or through the caller's own ``httpx.AsyncClient`` when one is given; either
way every body is read under `max_response_bytes` and errors reach the flow as httpx's.
"""

from __future__ import annotations

import asyncio
import contextvars
import weakref
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import httpx

from ..errors import RerankClientClosedError, RerankError, RerankProtocolError
from ..models import RerankResponse
from .body import already_read, read_body
from .core import ClientCore
from .flow import Call
from .framing import OverfullGuard
from .json_steps import async_reply
from .steps import Finished, Flow, Fork, Pairs, Reply, Send, Sleep, advance

if TYPE_CHECKING:
    from .aiohttp_io import AiohttpIO

__all__ = ["AsyncRerankClient"]

T = TypeVar("T")

# asyncio's own deadline (Python 3.11+), for the aiohttp path; None before 3.11 (anyio's
# cancel scope then bounds every call).
_timeout_at = getattr(asyncio, "timeout_at", None)

_LOOP_CLOSED = (
    "this AsyncRerankClient was used in an event loop that has closed (a second asyncio.run?): "
    "create the client inside the running loop, e.g. with `async with AsyncRerankClient(...)` "
    "in the coroutine that asyncio.run runs"
)


class AsyncRerankClient(ClientCore[httpx.AsyncClient]):
    """Asynchronous rerank client; a call's sub-batches go concurrently.

    `max_concurrency` bounds the requests of one call; concurrent calls each get their own
    bound (a client-wide limiter would tie the client to one event loop). One cancel scope
    bounds the whole call at its deadline. Without an `http_client` the client sends through
    one aiohttp session of its own, opened on the first call inside the running loop.
    """

    _loop: weakref.ref[asyncio.AbstractEventLoop] | None = None
    _aio: AiohttpIO | None = None

    def _new_http(self) -> None:
        # Our own I/O is aiohttp's: httpx's async pool scans every pooled connection per
        # request, which at high concurrency costs more CPU than the rest of the call.
        # Imported here: a sync-only program never loads aiohttp.
        from .aiohttp_io import AiohttpIO

        self._aio = AiohttpIO(
            self._plan.base_url,
            timeout=self.timeout,
            max_response_bytes=self.max_response_bytes,
            phase_timeouts=_timeout_at is None,
        )

    @classmethod
    def _http_type(cls) -> type[httpx.AsyncClient]:
        return httpx.AsyncClient

    def _is_closed(self) -> bool:
        if self._aio is not None:
            return self._aio.is_closed
        return super()._is_closed()

    async def __aenter__(self) -> AsyncRerankClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP session if this client made it (never a caller's http_client)."""
        if self._aio is not None:
            await self._aio.aclose()
        elif self._owns_http and self._http is not None:
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
        loop = self._check_loop()
        try:
            if self._aio is not None and _timeout_at is not None:
                pairs = await self._drive_until(call, loop.time() + call.deadline.remaining())
            else:
                with anyio.CancelScope(
                    deadline=anyio.current_time() + call.deadline.remaining()
                ) as scope:
                    pairs = await self._drive(call, call.flow(), None)
                if scope.cancelled_caught:
                    raise call.deadline_error()
        except RerankError as exc:
            raise call.spent(exc) from None
        return self._finish(kept, call, pairs)

    async def _drive_until(self, call: Call, when: float) -> Pairs:
        """The whole call under asyncio's own timeout, ending at `when` (the loop's clock).

        For aiohttp, which runs on asyncio only: ``asyncio.timeout_at`` (Python 3.11+) bounds
        the call as anyio's cancel scope does elsewhere, at a fifth of its CPU (anyio looks its
        backend up twice per scope; that was 5% of a call's CPU at 64 concurrent callers). The
        timeout cancels the call's task once; a call's sub-batches run in an anyio task group,
        which passes that cancellation to each of them.
        """
        assert _timeout_at is not None
        try:
            async with _timeout_at(None) as timeout:
                # The timer is armed in a context of its own, not the caller's: cancelled when
                # the call ends, it stays in the loop's queue until its time (asyncio drops
                # cancelled timers lazily), and so would the context it captured, with the
                # caller's span (a traced stage's RERANKER span and everything it holds) for
                # the length of the timeout, to die in bulk with many others.
                contextvars.Context().run(timeout.reschedule, when)
                return await self._drive(call, call.flow(), None)
        except TimeoutError:
            if not timeout.expired():  # not our deadline's: not ours to explain
                raise
            raise call.deadline_error() from None

    def _check_loop(self) -> asyncio.AbstractEventLoop:
        """The running loop; refuses, with what to do, a client whose connections belong to a
        closed loop."""
        loop = asyncio.get_running_loop()
        previous = self._loop() if self._loop is not None else None
        if previous is not None and previous is not loop and previous.is_closed():
            raise RerankClientClosedError(_LOOP_CLOSED)
        if previous is not loop:
            self._loop = weakref.ref(loop)
        return loop

    async def _drive(self, call: Call, flow: Flow, limiter: anyio.CapacityLimiter | None) -> Pairs:
        """Run `flow` to its end, awaiting each step it asks for.

        `limiter` is None until a `Fork` runs sub-flows side by side: a call's requests can
        only overlap there, so a one-batch call never pays for a limiter.
        """
        answer: Any = None
        while not isinstance(step := advance(flow, answer), Finished):
            if isinstance(step, Send):
                if limiter is None:
                    answer = await self._send(call, step)
                else:
                    async with limiter:
                        answer = await self._send(call, step)
            elif isinstance(step, Sleep):
                await anyio.sleep(step.seconds)
                answer = None
            else:
                answer = await self._fork(call, step, limiter)
        return step.value

    async def _fork(
        self, call: Call, fork: Fork, limiter: anyio.CapacityLimiter | None
    ) -> list[Pairs]:
        """Every sub-flow under one task group, all or nothing: the first `RerankError`
        cancels the rest and is raised, so no partial result can carry wrong labels. The
        call's one limiter is made here, at its first fork, and shared by every sub-flow."""
        if len(fork.flows) == 1:
            return [await self._drive(call, fork.flows[0], limiter)]
        return await self._fork_many(call, fork, limiter)

    async def _fork_many(
        self, call: Call, fork: Fork, limiter: anyio.CapacityLimiter | None
    ) -> list[Pairs]:
        """`_fork` of several sub-flows. Apart because its task's closure makes a cell of each
        variable it shares, at the frame's start: in `_fork` they would live through every
        call's request, one-batch calls included, and every garbage collection would walk them
        (at 64 calls in flight, 6 more objects each)."""
        if limiter is None:
            limiter = anyio.CapacityLimiter(self.max_concurrency)
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
        """One request, its body read within `max_response_bytes` (`body.read_body`), never a
        redirect followed (it would carry the key elsewhere); a body refused by size or
        encoding is the step's outcome, a `RerankProtocolError` the flow judges."""
        headers: Mapping[str, str]
        try:
            if self._aio is None:
                status, headers, content = await self._send_httpx(call, step)
            else:
                status, headers, content = await self._aio.request(
                    step.method, step.url, step.headers, step.body
                )
        except RerankProtocolError as exc:
            return exc
        except httpx.InvalidURL:  # a redirect whose Location httpx cannot even parse
            return RerankProtocolError(
                "the server answered a redirect to a Location that is not a URL (not followed)"
            )
        except httpx.HTTPError as exc:
            return exc
        except RuntimeError as exc:
            if self._is_closed():
                raise self._closed_error() from None
            if "loop" in str(exc).lower():
                raise RerankClientClosedError(_LOOP_CLOSED) from None
            raise
        return await async_reply(status, headers, content)

    async def _send_httpx(self, call: Call, step: Send) -> tuple[int, httpx.Headers, bytes]:
        """One request through the caller's httpx client, its timeouts capped at the time
        left; raw bytes, inflated within the limit (leaving early closes the connection)."""
        http = self._http
        assert http is not None
        headers, content = step.encoded()
        async with http.stream(
            step.method,
            step.url,
            headers=headers,
            content=content,
            follow_redirects=False,
            timeout=call.deadline.remaining(),
        ) as response:
            limit = self._plan.max_response_bytes
            if response.is_stream_consumed:  # a transport that read it (a test's mock)
                content = already_read(response.content, limit)
            else:
                content = await read_body(response.headers, _guarded(response), limit)
            return response.status_code, response.headers, content


async def _guarded(response: httpx.Response) -> AsyncIterator[bytes]:
    """The raw body, watched by `OverfullGuard`: a connection that brought bytes beyond the
    answer is closed, never handed to the next request."""
    guard = OverfullGuard(response)
    async for chunk in response.aiter_raw():
        guard.feed(chunk)
        yield chunk
