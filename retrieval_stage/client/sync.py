"""`RerankClient`: the synchronous driver of the rerank flow.

Sub-batches go one after another; every socket operation is capped at the call's deadline
(`deadline_io`), so a server trickling bytes cannot hold a call past it.
"""

from __future__ import annotations

import logging
import os
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

__all__ = ["RerankClient"]

T = TypeVar("T")

_HTTPX_LOG = logging.getLogger("httpx")


def _environment_proxies() -> bool:
    """Whether HTTP_PROXY, HTTPS_PROXY or ALL_PROXY (any case) configure a proxy."""
    return any(
        os.environ.get(name) or os.environ.get(name.lower())
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
    )


class RerankClient(ClientCore[httpx.Client]):
    """Synchronous rerank client; sub-batches go one after another.

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
