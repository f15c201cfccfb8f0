"""The rerank call as a sans-I/O flow, written once for the sync and the async client.

As httpx's ``Auth.auth_flow``, a flow is a generator that decides and never does I/O: it yields
`Send` (make this request, send me back a `Reply`, an `httpx.HTTPError` or `EXPIRED`), `Sleep`
(wait this long before a retry) and `Fork` (run these sub-flows, send me back their results in
order), and returns the call's (index, score) pairs or raises a `RerankError`. `RerankClient`
drives it with blocking calls, one sub-batch after another; `AsyncRerankClient` with awaits,
the sub-batches of a `Fork` concurrently under one task group. Everything a call decides lives
here: the batch plan, retries and their waits (`retry`), the deadline, Retry-After, splitting a
refused batch, the cap a server states (remembered for later calls), `/info`, the judgement of
each response (`providers`) and the sanitising of server text (`_sanitize`).
"""

from __future__ import annotations

import json
import random as _random
import threading
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeAlias, TypeVar

import httpx
from opentelemetry import propagate, trace

from . import validate
from ._args import check_sendable, masked_url, snapshot
from ._log import get_logger
from ._sanitize import scrub, server_text
from .errors import (
    RerankError,
    RerankProtocolError,
    RerankStatusError,
    RerankTransportError,
    TransportKind,
)
from .models import Usage
from .providers import (
    ParsedBatch,
    WireFormat,
    batch_cap,
    build_request,
    check_required_fields,
    expected_results,
    get_format,
    parse_response,
)
from .retry import Deadline, is_retryable_error, is_retryable_status, retry_wait

__all__ = ["EXPIRED", "Call", "ClientCore", "Finished", "Fork", "Reply", "Send", "Sleep", "advance"]

log = get_logger("retrieval_stage.client")

Pairs: TypeAlias = list[tuple[int, float]]
H = TypeVar("H", httpx.Client, httpx.AsyncClient)


@dataclass(frozen=True, slots=True)
class Reply:
    """A response read in full."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300


class _Expired:
    """The driver's answer to a `Send` when the call's deadline ran out during it."""

    def __repr__(self) -> str:
        return "EXPIRED"


EXPIRED = _Expired()

Outcome: TypeAlias = "Reply | httpx.HTTPError | _Expired"


@dataclass(frozen=True, slots=True)
class Send:
    """Make this request; answer with an `Outcome`."""

    method: Literal["GET", "POST"]
    url: str
    headers: dict[str, str]
    body: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait `seconds` before the next attempt; answer with None."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Fork:
    """Run every flow to its end (concurrently where the driver can); answer with their
    results in order. If one raises, the others are abandoned and the call fails whole."""

    flows: list[Flow]


Step: TypeAlias = "Send | Sleep | Fork"
Flow: TypeAlias = "Generator[Step, Any, Pairs]"


@dataclass(frozen=True, slots=True)
class Finished:
    """The flow ended with `value`."""

    value: Pairs


def advance(flow: Flow, answer: Any) -> Step | Finished:
    """Give `flow` the answer to its last step; its next step, or `Finished`. What the flow
    raises (a `RerankError`) goes to the driver's caller."""
    try:
        return flow.send(answer)
    except StopIteration as done:
        return Finished(done.value)


@dataclass
class _Attempt:
    """What one HTTP attempt came to; exactly one of `parsed` or `error` is set."""

    parsed: ParsedBatch | None = None
    error: RerankError | None = None
    retryable: bool = False
    headers: Mapping[str, str] | None = None
    split_to: int | None = None
    learned: bool = False
    cause: str = ""


class ClientCore(Generic[H]):
    """Configuration, the httpx client and what the server taught: everything of a client
    that is neither sync nor async (as httpx's ``BaseClient``)."""

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
        # One rule per value, shared with RerankSettings and the CLI (validate.py); each
        # refusal is a ValueError whose ``field`` names the argument.
        base_url = validate.endpoint(base_url, "base_url")
        if http_client is not None and not isinstance(http_client, self._http_type()):
            raise TypeError(
                f"{type(self).__name__} needs an {self._http_type().__name__} as http_client, "
                f"got {type(http_client).__name__}"
            )
        timeout = validate.timeout(timeout)
        api_key_header = validate.header_name(api_key_header)
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise validate.InvalidSetting(
                "max_retries", f"must be an int >= 0, got {max_retries!r}"
            )
        batch_size = validate.batch_size(batch_size)
        if (
            isinstance(max_concurrency, bool)
            or not isinstance(max_concurrency, int)
            or max_concurrency < 1
        ):
            raise validate.InvalidSetting(
                "max_concurrency", f"must be an int >= 1, got {max_concurrency!r}"
            )
        # Never echo the key: it would land in whatever logs the caller's traceback.
        api_key = validate.api_key(api_key)
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
        """A fresh httpx client of the flavour the subclass drives (TLS verification on)."""
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

    # -- what both drivers share ------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        """Request headers: accept, the key, and W3C trace context from the global propagator
        (``traceparent``, ``tracestate``, ``baggage``), so a traced server joins our trace."""
        headers = {"accept": "application/json"}
        if self._api_key:
            if self._api_key_header.lower() == "authorization":
                headers["Authorization"] = f"Bearer {self._api_key}"
            else:
                headers[self._api_key_header] = self._api_key
        propagate.inject(headers)
        return headers

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text

    def _start(
        self,
        query: str,
        items: Sequence[Any],
        text: Callable[[Any], str] | None,
        top_k: int | None,
        now: Callable[[], float],
    ) -> tuple[list[Any], Call]:
        """Check and snapshot the arguments, then start the call's deadline (both clients)."""
        kept, texts, cap = snapshot(query, items, text, top_k)
        check_sendable(query, texts)
        return kept, Call(self, query, texts, cap, Deadline(self.timeout, self._clock), now)

    def _apply_info(self, info: Any) -> str | None:
        """Take the batch cap and model from TEI's ``/info``; what was missing, else None."""
        if not isinstance(info, dict):
            return "not a JSON object"
        model_id = info.get("model_id")
        if isinstance(model_id, str) and model_id:
            self._server_model = model_id
        cap = info.get("max_client_batch_size")
        if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
            self._batch_size = cap
            return None
        return "no max_client_batch_size"

    def _remember_cap(self, cap: int, refused: int) -> None:
        with self._lock:
            if self._learned_cap is None or cap < self._learned_cap:
                self._learned_cap = cap
                log.warning(
                    "rerank.batch_size_learned", provider=self.provider, batch_size=cap,
                    refused=refused,
                )  # fmt: skip


@dataclass
class Call:
    """One call: its arguments, its deadline, what it spent, and the flows that make it."""

    core: ClientCore[Any]
    query: str
    texts: list[str]
    top_k: int | None
    deadline: Deadline
    now: Callable[[], float] = time.time
    requests: int = 0
    retries: int = 0
    batches: int = 0
    seen_424: int = 0
    usage: Usage = field(default_factory=Usage)
    model: str | None = None

    # -- the flows --------------------------------------------------------------------------

    def flow(self) -> Flow:
        """The whole call: ``/info`` when asked for, then the batches."""
        core = self.core
        if not self.texts:
            return []
        if core._auto_batch:
            yield from self._info()
        return (yield from self._fork(0, len(self.texts), core.batch_size))

    def _info(self) -> Generator[Step, Any, None]:
        """Learn the batch cap (and model) the provider exposes; one log event when we can't."""
        core = self.core
        cause: str | None
        if core.provider != "tei":
            cause = f"{core.provider} exposes no batch cap"
        else:
            outcome = yield Send("GET", core.base_url + "/info", core._headers())
            if isinstance(outcome, Reply) and outcome.is_success:
                try:
                    cause = core._apply_info(json.loads(outcome.content))
                except (ValueError, RecursionError):
                    kind = outcome.headers.get("content-type", "unknown content-type")
                    cause = f"not JSON ({kind})"
            elif isinstance(outcome, Reply):
                cause = f"HTTP {outcome.status_code}"
            else:
                cause = type(outcome).__name__ if outcome is not EXPIRED else "deadline"
        core._auto_batch = False
        if cause is not None:
            log.warning(
                "rerank.info_unavailable",
                provider=core.provider,
                caused_by=cause,
                batch_size=core.batch_size,
            )

    def _fork(self, start: int, stop: int, size: int) -> Flow:
        chunks = [(a, min(a + size, stop)) for a in range(start, stop, size)]
        parts = yield Fork([self._batch(a, b) for a, b in chunks])
        return [pair for part in parts for pair in part]

    def _batch(self, start: int, stop: int) -> Flow:
        """One batch: send, judge, retry, or split and fork."""
        core = self.core
        if stop - start > core.batch_size:  # the server taught a smaller cap meanwhile
            return (yield from self._fork(start, stop, core.batch_size))
        batch = self.texts[start:stop]
        top_n = None if self.top_k is None else min(self.top_k, len(batch))
        body = build_request(core._format, self.query, batch, model=core.model, top_n=top_n)
        expected = expected_results(core._format, len(batch), top_n)
        url = core.base_url + core._format.path
        retry_num = 0
        while True:
            if self.deadline.expired():
                raise self.deadline_error()
            self.requests += 1
            outcome = yield Send("POST", url, core._headers(), body)
            if outcome is EXPIRED:
                raise self.deadline_error()
            if isinstance(outcome, httpx.HTTPError):
                if self.deadline.expired():
                    raise self.deadline_error()
                attempt = self._transport_error(outcome)
            else:
                assert isinstance(outcome, Reply)
                attempt = self._judge(outcome, batch, expected)
            if attempt.parsed is not None:
                return self._record(attempt.parsed, start)
            if attempt.split_to is not None:
                self._split_event(attempt, len(batch), start)
                return (yield from self._fork(start, stop, attempt.split_to))
            wait = self._wait_before_retry(attempt, retry_num, start)
            assert attempt.error is not None
            if wait is None:
                raise attempt.error
            yield Sleep(wait)
            retry_num += 1

    # -- decisions --------------------------------------------------------------------------

    def deadline_error(self) -> RerankTransportError:
        """The call ran out of time; says which setting bounds it."""
        return RerankTransportError(
            f"no answer within the {self.core.timeout:g} s deadline "
            f"(timeout={self.core.timeout}) after {self.requests} request(s)",
            kind="deadline",
        )

    def spent(self, exc: RerankError) -> RerankError:
        """`exc` carrying what the failed call spent, for the stage's span and metrics."""
        exc.requests, exc.retries, exc.batches = self.requests, self.retries, self.batches
        return exc

    def _transport_error(self, exc: httpx.HTTPError) -> _Attempt:
        """The one place httpx's exceptions become ours, classified for retry.

        The message is redacted and the httpx error is not chained, so an API key that httpx or
        h11 quoted (an illegal header value, say) reaches neither logs nor span stack traces.
        """
        core = self.core
        detail = core._redact(str(exc)) or "no detail"
        what = f"{type(exc).__name__}: {detail}"
        kind: TransportKind = "other"
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
            what = f"could not connect to {masked_url(core.base_url)} ({what})"
            kind = "connect"
        elif isinstance(exc, httpx.TimeoutException):
            kind = "timeout"
        return _Attempt(
            error=RerankTransportError(what, kind=kind, cause=type(exc).__name__),
            retryable=is_retryable_error(exc),
            cause=type(exc).__name__,
        )

    def _not_ours(self, what: str) -> RerankProtocolError:
        provider = self.core.provider
        return RerankProtocolError(
            f"{provider} answered something that is not a {provider} response: {what}"
        )

    def _judge(self, reply: Reply, batch: list[str], expected: int) -> _Attempt:
        """Turn a response into an attempt outcome; decodes the JSON body once.

        Every text quoted from the server's bytes goes through `_sanitize`: a server may echo
        the key, the query or the documents.
        """
        core = self.core
        n = len(batch)
        if reply.is_success:
            try:
                body = json.loads(reply.content)
            except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
                kind = reply.headers.get("content-type", "unknown content-type")
                content = reply.content
                if core._api_key:  # whole, before the cut below could split it
                    content = content.replace(core._api_key.encode(), b"***")
                head = content[:200].decode("utf-8", errors="replace")
                snippet = scrub(head, [self.query, *batch], core._api_key, limit=60)
                return _Attempt(error=self._not_ours(f"not valid JSON ({kind}): {snippet!r}"))
            try:
                parsed = parse_response(
                    core._format, body, reply.headers, n_texts=n, expected=expected
                )
            except RerankProtocolError as exc:
                # The detail may quote a value from the body: a document echoed as an index.
                said = str(exc).removeprefix(f"{core.provider}: ")
                detail = scrub(said, [self.query, *batch], core._api_key)
                return _Attempt(error=self._not_ours(detail))
            return _Attempt(parsed=parsed)
        status = reply.status_code
        message = server_text(reply.content, [self.query, *batch], core._api_key)
        error = RerankStatusError(status, message, provider=core.provider)
        if status in (413, 422):
            cap = batch_cap(reply.content, n)
            if cap is not None:
                return _Attempt(error=error, split_to=cap, learned=True)
            if status == 413 and n > 1:
                return _Attempt(error=error, split_to=(n + 1) // 2)
        retryable = is_retryable_status(status, previous_424s=self.seen_424)
        if status == 424:
            self.seen_424 += 1
        return _Attempt(error=error, retryable=retryable, headers=reply.headers)

    def _split_event(self, attempt: _Attempt, n: int, offset: int) -> None:
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
        log.warning("rerank.batch_split", provider=self.core.provider, **fields)
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event("rerank.batch_split", fields)
        if attempt.learned:
            self.core._remember_cap(cap, n)

    def _wait_before_retry(self, attempt: _Attempt, retry_num: int, offset: int) -> float | None:
        """Seconds to sleep before retrying, or None when the attempt's error is final."""
        if not attempt.retryable or retry_num >= self.core.max_retries:
            return None
        wait = retry_wait(
            retry_num,
            headers=attempt.headers,
            remaining=self.deadline.remaining(),
            random=self.core._random,
            now=self.now(),
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
        log.warning("rerank.retry_scheduled", provider=self.core.provider, **fields)
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event("rerank.retry_scheduled", fields)
        self.retries += 1
        return wait

    def _record(self, parsed: ParsedBatch, offset: int) -> Pairs:
        self.batches += 1
        self.usage = self.usage + parsed.usage
        if parsed.model:
            self.model = parsed.model
        return [(offset + i, score) for i, score in parsed.pairs]
