"""`RerankClient`: the synchronous driver of the rerank flow.

A call's sub-batches (a cap split it) go concurrently, on threads of the call's own, bounded by
`max_concurrency`, as the async client's go under one task group: a 50-document call against a
cap of 32 costs one round trip, not two. Every socket operation is capped at the call's
deadline (`deadline_io`), so a server trickling bytes cannot hold a call past it.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import httpx

from ..errors import RerankError, RerankProtocolError
from ..models import RerankResponse
from .body import BodyReader, already_read
from .core import ClientCore
from .deadline_io import CALL_DEADLINE, DeadlineTransport, http_proxies_only
from .flow import Call
from .framing import OverfullGuard
from .steps import EXPIRED, Finished, Flow, Pairs, Reply, Send, Sleep, advance

__all__ = ["MAX_CALL_THREADS", "RerankClient"]

T = TypeVar("T")

MAX_CALL_THREADS = 16
"""The most threads one call of `RerankClient` runs its sub-batches on (the caller's included),
whatever `max_concurrency` says and however small the cap a server imposes: a server that
answers "maximum allowed batch size 1" to 2,000 texts must not make a call start 2,000 threads
(each a stack and a start-up cost before any work) or open more connections than the pool's
100 (past that, threads queue for the pool inside the transport, where the call's deadline is
checked only between reads). 16 keeps every core of a large machine busy waiting on a server;
more threads cannot make one server answer faster."""

_THREAD_NUMBERS = itertools.count(1)

_Thread = threading.Thread
"""The thread class of a fork's workers (a test replaces it to interrupt a join)."""

_HTTPX_LOG = logging.getLogger("httpx")


def _environment_proxies() -> bool:
    """Whether HTTP_PROXY, HTTPS_PROXY or ALL_PROXY (any case) configure a proxy."""
    return any(
        os.environ.get(name) or os.environ.get(name.lower())
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
    )


class _Abandoned(Exception):
    """A sibling sub-batch failed: this one stops before its next request (internal)."""


class RerankClient(ClientCore[httpx.Client]):
    """Synchronous rerank client; a call's sub-batches go concurrently, on threads of the
    call's own, at most `max_concurrency` requests of one call at a time.

    ``with RerankClient("http://localhost:8080") as client:
    client.rerank("what is rust", ["rust is a language", "bananas"])``
    """

    _http: httpx.Client  # always an httpx client: the caller's, or ours
    _direct: tuple[httpx.Client, DeadlineTransport] | None = None
    """Our own client and its transport, which `_open` sends through directly."""

    def _new_http(self) -> httpx.Client:
        # Our transport caps every socket operation at the call's deadline and routes through
        # the http(s) proxy HTTP(S)_PROXY names. Only a SOCKS proxy keeps httpx's own transport
        # (the deadline is then checked between reads, as with a caller's own http_client)
        # rather than silently going around the proxy.
        if _environment_proxies() and not http_proxies_only():
            return httpx.Client()
        transport = DeadlineTransport()
        http = httpx.Client(transport=transport)
        self._direct = (http, transport)
        return http

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

    def _drive(
        self,
        call: Call,
        flow: Flow,
        limiter: threading.BoundedSemaphore | None = None,
        abort: threading.Event | None = None,
    ) -> Pairs:
        """Run `flow` to its end, doing each step it asks for in turn.

        `limiter` and `abort` are None until a `Fork` runs sub-flows side by side (a call's
        requests only overlap there, so a one-batch call starts no thread and takes no lock):
        then every request of the call holds the limiter, and `abort`, set when a sibling
        failed, stops a sub-flow before its next request or wakes it from a retry's wait.
        """
        answer: Any = None
        while not isinstance(step := advance(flow, answer), Finished):
            if isinstance(step, Send):
                if limiter is None or abort is None:
                    answer = self._send(call, step)
                else:
                    with limiter:
                        if abort.is_set():
                            raise _Abandoned
                        answer = self._send(call, step)
            elif isinstance(step, Sleep):
                if abort is None:
                    time.sleep(step.seconds)
                elif abort.wait(step.seconds):
                    raise _Abandoned
                answer = None
            else:
                answer = self._fork(call, step.flows, limiter, abort)
        return step.value

    def _fork(
        self,
        call: Call,
        flows: list[Flow],
        limiter: threading.BoundedSemaphore | None,
        abort: threading.Event | None,
    ) -> list[Pairs]:
        """Every sub-flow to its end, all or nothing, as the async client's task group: the
        first failure stops the rest (`abort`) and is raised once every thread has ended, so
        no partial result can carry wrong labels and no request of the call outlives it.

        The caller's thread runs sub-flows too, beside at most ``max_concurrency - 1`` threads
        of this fork (and never more than `MAX_CALL_THREADS` in all); each thread carries the
        caller's context (its span, for the events a sub-batch records, and its baggage). The
        call's one limiter and abort flag are made at its first fork and shared by the forks a
        split makes inside it. An interrupt (KeyboardInterrupt, SystemExit) anywhere here,
        waiting for the other threads included, sets the abort flag first: no thread of the
        call starts another request or waits out a retry's backoff after it.
        """
        if len(flows) == 1:
            return [self._drive(call, flows[0], limiter, abort)]
        if limiter is None or abort is None:
            limiter = threading.BoundedSemaphore(min(self.max_concurrency, MAX_CALL_THREADS))
            abort = threading.Event()
        results: list[Pairs] = [[] for _ in flows]
        failures: list[BaseException] = []
        pending = iter(list(enumerate(flows)))
        take = threading.Lock()

        def work() -> None:
            while not abort.is_set():
                with take:
                    job = next(pending, None)
                if job is None:
                    return
                i, flow = job
                try:
                    results[i] = self._drive(call, flow, limiter, abort)
                except _Abandoned:
                    return
                except BaseException as exc:  # raised in the caller's thread below
                    failures.append(exc)
                    abort.set()
                    return

        workers = min(len(flows), self.max_concurrency, MAX_CALL_THREADS) - 1
        threads: list[threading.Thread] = []
        try:
            for _ in range(workers):
                thread = _Thread(
                    target=contextvars.copy_context().run,
                    args=(work,),
                    name=f"retrieval-stage-batch-{next(_THREAD_NUMBERS)}",
                    daemon=True,
                )
                thread.start()
                threads.append(thread)
            work()
            for thread in threads:
                thread.join()
        except BaseException:
            # An interrupt while starting threads, working or waiting for them: the others
            # stop before their next request and wake from a retry's backoff (`_drive`); they
            # are not waited for, so a Ctrl-C is not held up by a request still in flight (it
            # ends by the call's deadline at the latest).
            abort.set()
            raise
        if failures:
            raise failures[0]
        if abort.is_set():  # an outer fork's sibling failed: not ours to report
            raise _Abandoned
        return results

    def _open(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        content: bytes | None,
        timeout: float,
    ) -> httpx.Response:
        """The response to one request, its body not yet read; never a redirect followed,
        whatever the client says (it would carry the key to the origin the server names: a
        30x is judged by the flow).

        Our own client's requests go straight to its `DeadlineTransport`, as
        ``httpx.Client.send`` hands them over, without the steps our client never uses
        (auth, redirects, event hooks): about a fifth of a call's CPU. Kept from it: the
        client's default headers under ours (``httpx.Headers`` merging, as ``Client`` does),
        the timeouts, the closed client refused, cookies sent and kept (looked at only when
        the jar holds one or the response sets one), httpx's INFO line for each request. A
        caller's own client gets ``send``.
        """
        http = self._http
        own = self._direct
        if own is None or own[0] is not http:
            request = http.build_request(
                method, url, headers=headers, content=content, timeout=timeout
            )
            return http.send(request, stream=True, follow_redirects=False)
        if http.is_closed:  # as Client.send says it, so `_send` reads it the same way
            raise RuntimeError("Cannot send a request, as the client has been closed.")
        merged = httpx.Headers(http.headers)
        merged.update(headers)
        request = httpx.Request(
            method,
            url,
            headers=merged,
            content=content,
            extensions={"timeout": httpx.Timeout(timeout).as_dict()},
        )
        cookies = http.cookies
        if cookies.jar:
            cookies.set_cookie_header(request)
        response = own[1].handle_request(request)
        response.request = request
        if "set-cookie" in response.headers or "set-cookie2" in response.headers:
            cookies.extract_cookies(response)
        if _HTTPX_LOG.isEnabledFor(logging.INFO):  # the line Client.send logs, as it logs it
            _HTTPX_LOG.info(
                'HTTP Request: %s %s "%s %d %s"',
                request.method,
                request.url,
                response.http_version,
                response.status_code,
                response.reason_phrase,
            )
        return response

    def _send(
        self, call: Call, step: Send
    ) -> Reply | httpx.HTTPError | RerankProtocolError | object:
        """One request, read in full within the call's deadline.

        httpx's timeout bounds each read, not the whole body, so a server trickling bytes could
        hold the call for ever: the deadline is checked after every chunk received, and
        `DeadlineTransport` caps every socket operation at the time left.
        """
        headers, content = step.encoded()
        remaining = call.deadline.remaining()
        token = CALL_DEADLINE.set(time.monotonic() + remaining)
        try:
            response = self._open(step.method, step.url, headers, content, remaining)
            try:
                # Raw bytes, inflated here within the limit (httpx would inflate each chunk
                # whole); leaving early closes the connection, never reused.
                limit = self._plan.max_response_bytes
                if response.is_stream_consumed:  # a transport that read it (a test's mock)
                    return Reply(response.status_code, response.headers,
                                 already_read(response.content, limit))  # fmt: skip
                reader = BodyReader(response.headers, limit)
                guard = OverfullGuard(response)  # bytes beyond the answer: never reused
                for chunk in response.iter_raw():
                    guard.feed(chunk)
                    reader.feed(chunk)
                    if call.deadline.expired():
                        return EXPIRED
                return Reply(response.status_code, response.headers, reader.finish())
            finally:
                response.close()
        except RerankProtocolError as exc:
            return exc
        except httpx.InvalidURL:  # a redirect whose Location httpx cannot even parse
            return RerankProtocolError(
                "the server answered a redirect to a Location that is not a URL (not followed)"
            )
        except httpx.HTTPError as exc:
            return exc
        except RuntimeError:
            if self._http.is_closed:  # closed by another thread mid-call
                raise self._closed_error() from None
            raise
        finally:
            CALL_DEADLINE.reset(token)
