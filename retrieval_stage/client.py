"""HTTP rerank clients: `RerankClient` (sync) and `AsyncRerankClient`.

Both map every result back to the caller's own item by the response's index (never by
position), validate every response, split batches above the server's cap, retry what is worth
retrying inside one deadline per call, and translate httpx errors into the `RerankError` tree
here and nowhere else. The policy lives in pure functions (`retry`, `providers`); this module
holds only the I/O loop, written once for each flavour of httpx client.
"""

from __future__ import annotations

import asyncio
import json
import math
import random as _random
import re
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import httpx
from opentelemetry import trace

from ._deadline_io import CALL_DEADLINE
from ._deadline_io import install as install_deadline
from ._log import get_logger
from .errors import RerankError, RerankProtocolError, RerankStatusError, RerankTransportError
from .models import RerankResponse, Usage
from .providers import (
    ParsedBatch,
    WireFormat,
    batch_size_refusal,
    build_request,
    check_required_fields,
    error_message,
    expected_results,
    get_format,
    parse_response,
)
from .retry import Deadline, is_retryable_error, is_retryable_status, retry_wait

__all__ = ["AsyncRerankClient", "RerankClient"]

T = TypeVar("T")
H = TypeVar("H", httpx.Client, httpx.AsyncClient)

log = get_logger("retrieval_stage.client")

_MISSING = object()


def default_text(item: object) -> str:
    """The text of an item: the item itself when it is a str, else its ``.text``."""
    if isinstance(item, str):
        return item
    value = getattr(item, "text", _MISSING)
    if value is _MISSING:
        raise TypeError(
            f"cannot take the text of a {type(item).__name__}: pass text=... to rerank()"
        )
    if not isinstance(value, str):
        raise TypeError(f"{type(item).__name__}.text must be a str, got {type(value).__name__}")
    return value


def check_top_k(top_k: int | None) -> int | None:
    """Normalise `top_k`: None or 0 mean every result, a positive value caps; else ValueError."""
    if top_k is None:
        return None
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise TypeError(f"top_k must be an int or None, got {type(top_k).__name__}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 means all), got {top_k}")
    return top_k or None


def snapshot(
    query: str, items: Sequence[T], text: Callable[[T], str] | None, top_k: int | None
) -> tuple[list[T], list[str], int | None]:
    """Validate arguments and copy items and texts before any I/O.

    The copies fix the indices a response refers to: a caller changing its list while an async
    call is in flight cannot shift them.
    """
    if not isinstance(query, str):
        raise TypeError(f"query must be a str, got {type(query).__name__}")
    cap = check_top_k(top_k)
    extract: Callable[[Any], str] = text if text is not None else default_text
    kept = list(items)
    texts: list[str] = []
    for i, item in enumerate(kept):
        value = extract(item)
        if not isinstance(value, str):
            raise TypeError(f"text of item {i} must be a str, got {type(value).__name__}")
        texts.append(value)
    return kept, texts, cap


def check_sendable(query: str, texts: Sequence[str]) -> None:
    """ValueError, before any I/O, for text that cannot be sent as UTF-8 JSON (a lone
    surrogate, say): httpx would fail mid-call with an error outside the `RerankError` tree."""
    for i, text in enumerate((query, *texts)):
        if text.isascii():
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            what = "the query" if i == 0 else f"the text of item {i - 1}"
            where = f"lone surrogate at {exc.start}"
            raise ValueError(f"{what} is not valid Unicode ({where})") from None


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""An HTTP header field name (RFC 9110 token)."""


def masked_url(url: object) -> object:
    """`url` with any ``user:password@`` part replaced, for reprs and messages."""
    if not isinstance(url, str) or "@" not in url:
        return url
    scheme, sep, rest = url.partition("://")
    host_part, slash, path = rest.partition("/")
    if "@" not in host_part:
        return url
    return f"{scheme}{sep}***@{host_part.rsplit('@', 1)[1]}{slash}{path}"


def rank(pairs: list[tuple[int, float]], top_k: int | None) -> list[tuple[int, float]]:
    """Best first; ties keep input order so equal scores never reorder the caller's items."""
    ordered = sorted(pairs, key=lambda p: (-p[1], p[0]))
    return ordered if top_k is None else ordered[:top_k]


def _transport_error(exc: httpx.HTTPError, redact: Callable[[str], str]) -> _Attempt:
    """The one place httpx's exceptions become ours, classified for retry.

    The message is redacted and the httpx error is not chained, so an API key that httpx or h11
    quoted (an illegal header value, say) reaches neither logs nor span stack traces.
    """
    detail = redact(str(exc)) or "no detail"
    return _Attempt(
        error=RerankTransportError(f"{type(exc).__name__}: {detail}"),
        retryable=is_retryable_error(exc),
        cause=type(exc).__name__,
    )


@dataclass
class _Reply:
    """A response read in full: what `_judge` needs from an httpx response."""

    status_code: int
    headers: httpx.Headers
    content: bytes

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300


@dataclass
class _Attempt:
    """What one HTTP attempt came to; exactly one of `parsed` or `error` is set."""

    parsed: ParsedBatch | None = None
    error: RerankError | None = None
    retryable: bool = False
    headers: httpx.Headers | None = None
    split_to: int | None = None
    cause: str = ""


def _spent(exc: RerankError, call: _Call) -> RerankError:
    """`exc` carrying what the failed call spent, for the stage's span and metrics."""
    exc.requests, exc.retries, exc.batches = call.requests, call.retries, call.batches
    return exc


@dataclass
class _Call:
    """Per-call bookkeeping: the deadline and what was spent."""

    deadline: Deadline
    requests: int = 0
    retries: int = 0
    batches: int = 0
    seen_424: int = 0
    usage: Usage = field(default_factory=Usage)
    model: str | None = None


class _ClientBase(Generic[H]):
    """Configuration and the pure parts of a call, shared by both clients."""

    _http: H

    def __init__(
        self,
        base_url: str,
        *,
        provider: str = "tei",
        model: str | None = None,
        api_key: str | None = None,
        api_key_header: str = "apikey",
        timeout: float = 30.0,
        max_retries: int = 2,
        batch_size: int | Literal["auto"] | None = None,
        http_client: H | None = None,
        max_concurrency: int = 8,
        random: Callable[[], float] = _random.random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {masked_url(base_url)!r}")
        try:
            if not httpx.URL(base_url).host:
                raise ValueError("no host")
        except (httpx.InvalidURL, ValueError) as exc:
            raise ValueError(
                f"base_url is not a valid URL ({exc}): {masked_url(base_url)!r}"
            ) from None
        if "?" in base_url or "#" in base_url:
            raise ValueError(
                "base_url must not have a query string or fragment (the provider's path is "
                f"appended to it; pass a key with api_key): {masked_url(base_url.split('?')[0])!r}"
            )
        if http_client is not None and not isinstance(http_client, self._http_type()):
            raise TypeError(
                f"{type(self).__name__} needs an {self._http_type().__name__} as http_client, "
                f"got {type(http_client).__name__}"
            )
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not (0 < timeout < math.inf)
        ):
            raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
        if not isinstance(api_key_header, str) or not _TOKEN.fullmatch(api_key_header):
            raise ValueError(
                f"api_key_header must be an HTTP header name (a token), got {api_key_header!r}"
            )
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if (
            batch_size is not None
            and batch_size != "auto"
            and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1)
        ):
            raise ValueError(
                f"batch_size must be a positive int, 'auto' or None, got {batch_size!r}"
            )
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if api_key and (
            not isinstance(api_key, str)
            or not (api_key.isascii() and api_key.isprintable())
            or api_key != api_key.strip()
        ):
            # Never echo the key: it would land in whatever logs the caller's traceback.
            raise ValueError(
                "api_key must be printable ASCII without surrounding whitespace "
                "(a trailing newline from a secrets file?)"
            )
        self._format: WireFormat = get_format(provider)
        check_required_fields(self._format, model=model)
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.max_concurrency = max_concurrency
        self._api_key = api_key
        self._api_key_header = api_key_header
        self._auto_batch = batch_size == "auto"
        self._batch_size: int = (
            batch_size if isinstance(batch_size, int) else self._format.batch_size
        )
        self._learned_cap: int | None = None
        self._server_model: str | None = None
        self._lock = threading.Lock()
        self._random = random
        self._clock = clock
        self._owns_http = http_client is None
        self._http = http_client if http_client is not None else self._new_http()

    def _new_http(self) -> H:
        """A fresh httpx client of the flavour this class drives (TLS verification on)."""
        raise NotImplementedError

    @classmethod
    def _http_type(cls) -> type[H]:
        raise NotImplementedError

    # -- public read-only facts -------------------------------------------------------------

    @property
    def provider(self) -> str:
        """The wire format's name (``tei``, ``cohere``, ...)."""
        return self._format.name

    @property
    def batch_size(self) -> int:
        """Texts per request now: the configured size, lowered by any cap the server taught."""
        if self._learned_cap is not None:
            return min(self._batch_size, self._learned_cap)
        return self._batch_size

    @property
    def model_name(self) -> str | None:
        """The model to record: the configured one, else what the server reported."""
        return self.model or self._server_model

    def __repr__(self) -> str:
        key = "<set>" if self._api_key else None
        return (
            f"{type(self).__name__}(base_url={masked_url(self.base_url)!r}, "
            f"provider={self.provider!r}, "
            f"model={self.model!r}, api_key={key}, timeout={self.timeout})"
        )

    # -- pure helpers -----------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        headers = {"accept": "application/json"}
        if self._api_key:
            if self._api_key_header.lower() == "authorization":
                headers["Authorization"] = f"Bearer {self._api_key}"
            else:
                headers[self._api_key_header] = self._api_key
        return headers

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text

    def _redact_bytes(self, content: bytes) -> bytes:
        """`content` without the API key, before anything cuts it (a cut key would survive)."""
        return content.replace(self._api_key.encode(), b"***") if self._api_key else content

    def _top_n(self, top_k: int | None, n: int) -> int | None:
        return None if top_k is None else min(top_k, n)

    def _chunks(self, start: int, stop: int, size: int) -> list[tuple[int, int]]:
        return [(i, min(i + size, stop)) for i in range(start, stop, size)]

    def _judge(
        self, call: _Call, response: httpx.Response | _Reply, n: int, expected: int
    ) -> _Attempt:
        """Turn a response into an attempt outcome; decodes the JSON body once.

        Every message built from the server's bytes is redacted: a server may echo the key.
        """
        if response.is_success:
            try:
                body = json.loads(response.content)
            except ValueError:
                kind = response.headers.get("content-type", "unknown content-type")
                snippet = self._redact_bytes(response.content)[:60]
                text = snippet.decode("utf-8", errors="replace")
                return _Attempt(
                    error=RerankProtocolError(
                        f"{self.provider}: response is not valid JSON ({kind}): {text!r}"
                    )
                )
            try:
                parsed = parse_response(
                    self._format, body, response.headers, n_texts=n, expected=expected
                )
            except RerankProtocolError as exc:
                return _Attempt(error=RerankProtocolError(self._redact(str(exc))))
            return _Attempt(parsed=parsed)
        status = response.status_code
        # Redact before cutting (a cut key survives) and after decoding (an escaped one does).
        message = self._redact(error_message(self._redact_bytes(response.content)))
        error = RerankStatusError(status, message, provider=self.provider)
        if status in (413, 422):
            cap = batch_size_refusal(message)
            if cap is not None and cap < n:
                return _Attempt(error=error, split_to=cap)
            if status == 413 and cap is None and n > 1:
                return _Attempt(error=error, split_to=(n + 1) // 2)
        retryable = is_retryable_status(status, previous_424s=call.seen_424)
        if status == 424:
            call.seen_424 += 1
        return _Attempt(error=error, retryable=retryable, headers=response.headers)

    def _learn_cap(self, attempt: _Attempt, n: int, offset: int) -> None:
        """Record a split on the span and the log; remember a cap the server stated."""
        cap = attempt.split_to
        assert cap is not None
        error = attempt.error
        fields: dict[str, Any] = {
            "batch_offset": offset,
            "refused": n,
            "split_to": cap,
            "caused_by": f"HTTP {error.status_code}"
            if isinstance(error, RerankStatusError)
            else "",
        }
        log.warning("rerank.batch_split", provider=self.provider, **fields)
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event("rerank.batch_split", fields)
        if (
            isinstance(attempt.error, RerankStatusError)
            and batch_size_refusal(attempt.error.server_message) is not None
        ):
            with self._lock:
                if self._learned_cap is None or cap < self._learned_cap:
                    self._learned_cap = cap
                    log.warning(
                        "rerank.batch_size_learned",
                        provider=self.provider,
                        batch_size=cap,
                        refused=n,
                    )

    def _wait_before_retry(
        self, call: _Call, attempt: _Attempt, retry_num: int, offset: int
    ) -> float | None:
        """Seconds to sleep before retrying, or None when the attempt's error is final."""
        if not attempt.retryable or retry_num >= self.max_retries:
            return None
        wait = retry_wait(
            retry_num,
            headers=attempt.headers,
            remaining=call.deadline.remaining(),
            random=self._random,
            now=time.time(),
        )
        if wait is None:
            return None
        error = attempt.error
        status = error.status_code if isinstance(error, RerankStatusError) else None
        caused_by = (attempt.cause or type(error).__name__) if status is None else f"HTTP {status}"
        fields: dict[str, Any] = {
            "retry_num": retry_num + 1,
            "wait_for": round(wait, 3),
            "caused_by": caused_by,
            "batch_offset": offset,
        }
        log.warning("rerank.retry_scheduled", provider=self.provider, **fields)
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event("rerank.retry_scheduled", fields)
        call.retries += 1
        return wait

    def _begin(
        self, query: str, items: Sequence[T], text: Callable[[T], str] | None, top_k: int | None
    ) -> tuple[list[T], list[str], int | None, _Call]:
        """Check and snapshot the arguments, then start the call's deadline (both clients)."""
        kept, texts, cap = snapshot(query, items, text, top_k)
        check_sendable(query, texts)
        return kept, texts, cap, _Call(Deadline(self.timeout, self._clock))

    def _deadline_error(self, call: _Call) -> RerankTransportError:
        return RerankTransportError(
            f"deadline of {self.timeout:g}s for the call ran out after {call.requests} request(s)"
        )

    def _finish(
        self, items: list[T], call: _Call, pairs: list[tuple[int, float]], top_k: int | None
    ) -> RerankResponse[T]:
        return RerankResponse(
            results=[(items[i], score) for i, score in rank(pairs, top_k)],
            usage=call.usage,
            model=call.model or self.model_name,
            requests=call.requests,
            retries=call.retries,
            batches=call.batches,
        )

    def _record(self, call: _Call, parsed: ParsedBatch, offset: int) -> list[tuple[int, float]]:
        call.batches += 1
        call.usage = call.usage + parsed.usage
        if parsed.model:
            call.model = parsed.model
        return [(offset + i, score) for i, score in parsed.pairs]

    def _apply_info(self, info: Any) -> None:
        if isinstance(info, dict):
            cap = info.get("max_client_batch_size")
            if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
                self._batch_size = cap
            model_id = info.get("model_id")
            if isinstance(model_id, str):
                self._server_model = model_id
        self._auto_batch = False


class RerankClient(_ClientBase[httpx.Client]):
    """Synchronous rerank client; sub-batches go one after another.

    ``with RerankClient("http://localhost:8080") as client:
    client.rerank("what is rust", ["rust is a language", "bananas"])``
    """

    def _new_http(self) -> httpx.Client:
        transport = httpx.HTTPTransport()
        install_deadline(transport)
        return httpx.Client(transport=transport)

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
        kept, texts, cap, call = self._begin(query, items, text, top_k)
        if not texts:
            return self._finish(kept, call, [], cap)
        if self._auto_batch:
            self._fetch_info(call)
        pairs: list[tuple[int, float]] = []
        try:
            for start, stop in self._chunks(0, len(texts), self.batch_size):
                pairs += self._score(call, query, texts, start, stop, cap)
        except RerankError as exc:
            raise _spent(exc, call) from None
        return self._finish(kept, call, pairs, cap)

    def _send(self, call: _Call, method: str, url: str, **kw: Any) -> _Reply:
        """One request, read in full within the call's deadline.

        httpx's timeout bounds each read, not the whole body, so a server trickling bytes could
        hold the call for ever: the deadline is checked after every chunk received.
        """
        remaining = call.deadline.remaining()
        token = CALL_DEADLINE.set(time.monotonic() + remaining)
        try:
            with self._http.stream(
                method, url, headers=self._headers(), timeout=remaining, **kw
            ) as response:
                parts: list[bytes] = []
                for chunk in response.iter_bytes():
                    parts.append(chunk)
                    if call.deadline.expired():
                        raise self._deadline_error(call)
                return _Reply(response.status_code, response.headers, b"".join(parts))
        finally:
            CALL_DEADLINE.reset(token)

    def _fetch_info(self, call: _Call) -> None:
        try:
            reply = self._send(call, "GET", self.base_url + "/info")
            if not reply.is_success:
                raise ValueError(f"HTTP {reply.status_code}")
            self._apply_info(json.loads(reply.content))
        except (httpx.HTTPError, ValueError, RerankTransportError) as exc:
            log.warning(
                "rerank.info_unavailable", provider=self.provider, caused_by=type(exc).__name__
            )
            self._auto_batch = False

    def _score(
        self, call: _Call, query: str, texts: list[str], start: int, stop: int, top_k: int | None
    ) -> list[tuple[int, float]]:
        if stop - start > self.batch_size:  # the server taught a smaller cap meanwhile
            pairs: list[tuple[int, float]] = []
            for a, b in self._chunks(start, stop, self.batch_size):
                pairs += self._score(call, query, texts, a, b, top_k)
            return pairs
        batch = texts[start:stop]
        top_n = self._top_n(top_k, len(batch))
        body = build_request(self._format, query, batch, model=self.model, top_n=top_n)
        expected = expected_results(self._format, len(batch), top_n)
        url = self.base_url + self._format.path
        retry_num = 0
        while True:
            if call.deadline.expired():
                raise self._deadline_error(call)
            call.requests += 1
            try:
                reply = self._send(call, "POST", url, json=body)
            except httpx.HTTPError as exc:
                attempt = _transport_error(exc, self._redact)
            else:
                attempt = self._judge(call, reply, len(batch), expected)
            if attempt.parsed is not None:
                return self._record(call, attempt.parsed, start)
            if attempt.split_to is not None:
                self._learn_cap(attempt, len(batch), start)
                pairs = []
                for a, b in self._chunks(start, stop, attempt.split_to):
                    pairs += self._score(call, query, texts, a, b, top_k)
                return pairs
            wait = self._wait_before_retry(call, attempt, retry_num, start)
            assert attempt.error is not None
            if wait is None:
                raise attempt.error
            time.sleep(wait)
            retry_num += 1


class AsyncRerankClient(_ClientBase[httpx.AsyncClient]):
    """Asynchronous rerank client; a call's sub-batches go concurrently.

    `max_concurrency` bounds the requests of one call; concurrent calls each get their own
    bound (a client-wide semaphore would tie the client to one event loop).
    """

    def _new_http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient()

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
        kept, texts, cap, call = self._begin(query, items, text, top_k)
        if not texts:
            return self._finish(kept, call, [], cap)
        if self._auto_batch:
            await self._fetch_info(call)
        gate = asyncio.Semaphore(self.max_concurrency)
        chunks = self._chunks(0, len(texts), self.batch_size)
        try:
            parts = await _all_or_nothing(
                [self._score(call, gate, query, texts, a, b, cap) for a, b in chunks]
            )
        except RerankError as exc:
            raise _spent(exc, call) from None
        return self._finish(kept, call, [p for part in parts for p in part], cap)

    async def _fetch_info(self, call: _Call) -> None:
        try:
            remaining = call.deadline.remaining()
            response = await asyncio.wait_for(
                self._http.get(self.base_url + "/info", headers=self._headers(), timeout=remaining),
                remaining,
            )
            response.raise_for_status()
            self._apply_info(response.json())
        except (httpx.HTTPError, ValueError, asyncio.TimeoutError) as exc:
            log.warning(
                "rerank.info_unavailable", provider=self.provider, caused_by=type(exc).__name__
            )
            self._auto_batch = False

    async def _score(
        self,
        call: _Call,
        gate: asyncio.Semaphore,
        query: str,
        texts: list[str],
        start: int,
        stop: int,
        top_k: int | None,
    ) -> list[tuple[int, float]]:
        if stop - start > self.batch_size:  # the server taught a smaller cap meanwhile
            return await self._split(call, gate, query, texts, start, stop, top_k, self.batch_size)
        batch = texts[start:stop]
        top_n = self._top_n(top_k, len(batch))
        body = build_request(self._format, query, batch, model=self.model, top_n=top_n)
        expected = expected_results(self._format, len(batch), top_n)
        url = self.base_url + self._format.path
        retry_num = 0
        while True:
            async with gate:
                remaining = call.deadline.remaining()
                if remaining <= 0:
                    raise self._deadline_error(call)
                call.requests += 1
                try:
                    response = await asyncio.wait_for(
                        self._http.post(url, json=body, headers=self._headers(), timeout=remaining),
                        remaining,
                    )
                except asyncio.TimeoutError:
                    raise self._deadline_error(call) from None
                except httpx.HTTPError as exc:
                    attempt = _transport_error(exc, self._redact)
                else:
                    attempt = self._judge(call, response, len(batch), expected)
            if attempt.parsed is not None:
                return self._record(call, attempt.parsed, start)
            if attempt.split_to is not None:
                self._learn_cap(attempt, len(batch), start)
                return await self._split(
                    call, gate, query, texts, start, stop, top_k, attempt.split_to
                )
            wait = self._wait_before_retry(call, attempt, retry_num, start)
            assert attempt.error is not None
            if wait is None:
                raise attempt.error
            await asyncio.sleep(wait)
            retry_num += 1

    async def _split(
        self,
        call: _Call,
        gate: asyncio.Semaphore,
        query: str,
        texts: list[str],
        start: int,
        stop: int,
        top_k: int | None,
        size: int,
    ) -> list[tuple[int, float]]:
        parts = await _all_or_nothing(
            [
                self._score(call, gate, query, texts, a, b, top_k)
                for a, b in self._chunks(start, stop, size)
            ]
        )
        return [p for part in parts for p in part]


async def _all_or_nothing(
    jobs: list[Awaitable[list[tuple[int, float]]]],
) -> list[list[tuple[int, float]]]:
    """Run jobs concurrently; on the first failure cancel the rest and raise it.

    A call whose sub-batch failed fails whole: no partial result can carry wrong labels.
    """
    if len(jobs) == 1:
        return [await jobs[0]]
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    # Retrieve every failure (asyncio logs those never retrieved), then raise the first.
    failures = [e for t in tasks if not t.cancelled() and (e := t.exception()) is not None]
    if failures:
        raise failures[0]
    return [task.result() for task in tasks]
