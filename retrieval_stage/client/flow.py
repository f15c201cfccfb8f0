"""The rerank call as a sans-I/O flow, written once for the sync and the async client.

`Call.flow()` is a generator of `steps` (see there) that decides and never does I/O.
`RerankClient` drives it with blocking calls, the sub-batches of a `Fork` on threads of the
call's own; `AsyncRerankClient` with awaits, under one task group. Everything a call
decides lives here: the batch plan, retries and their waits (`retry`), the deadline,
Retry-After, splitting a refused batch, the cap a server states (kept in `plan.Learned` for later
calls), `/info`, the judgement of each response (`providers`) and the sanitising of server text
(`sanitize`). It reads its client only through the frozen `plan.Plan` and the shared
`plan.Learned`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from opentelemetry import trace

from .._deadline import Deadline
from .._log import get_logger
from .._redact import Hay, clean, haystack, masked_url, shown_url, without_secrets_bytes
from ..errors import (
    RerankError,
    RerankProtocolError,
    RerankRedirectError,
    RerankStatusError,
    RerankTransportError,
    TransportKind,
)
from ..models import Usage
from .error_bodies import batch_cap
from .plan import InfoQuestion, Learned, Plan
from .providers import ParsedBatch, build_request, expected_results, parse_response
from .retry import is_retryable_error, is_retryable_status, retry_wait
from .sanitize import server_text
from .steps import EXPIRED, Flow, Fork, Pairs, Reply, Send, Sleep, Step

__all__ = ["Call"]

log = get_logger("retrieval_stage.client")

MODEL_MAX_CHARS = 128
"""The longest model name taken from a server (its ``model`` field, TEI's ``model_id``): real
names are a few dozen characters; a longer one is cut, after it is cleaned of echoes."""


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


@dataclass
class Call:
    """One call: its arguments, its deadline, what it spent, and the flows that make it."""

    plan: Plan
    learned: Learned
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
    _hay: Hay | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    """Guards the counts and usage: the sync client runs a fork's sub-flows on threads."""

    def hay(self) -> Hay:
        """Everything this call sends, for the sanitiser: built once per call, and the whole
        call's texts, not one batch's (a server may echo a text of another sub-batch)."""
        if self._hay is None:
            self._hay = haystack([self.query, *self.texts])
        return self._hay

    # -- the flows --------------------------------------------------------------------------

    def flow(self) -> Flow:
        """The whole call: ``/info`` when this call is the one to ask it, then the batches."""
        if not self.texts:
            return []
        question = self.learned.take_info_question(
            len(self.texts), recording=trace.get_current_span().is_recording()
        )
        if question is not None:
            yield from self._info(question)
        return (yield from self._fork(0, len(self.texts), self.learned.batch_size))

    def _info(self, question: InfoQuestion) -> Generator[Step, Any, None]:
        """Ask TEI's ``/info`` for its batch cap and model (`plan.Learned` keeps what it
        says). A failure costs the call nothing but one event: ``rerank.info_unavailable``
        when the cap was wanted (a warning where ``batch_size="auto"`` asked for it), else
        ``rerank.model_unknown`` (spans then carry no model name)."""
        plan, learned = self.plan, self.learned
        cause: str
        missing: tuple[str | None, str | None]
        if plan.provider != "tei":
            missing = (f"{plan.provider} exposes no batch cap", None)
        else:
            outcome = yield Send("GET", plan.base_url + "/info", plan.headers())
            hay = self.hay()
            if isinstance(outcome, Reply) and outcome.is_success:
                try:
                    missing = learned.apply_info(outcome.json(), lambda m: self._model(m, hay))
                except (ValueError, RecursionError):
                    kind = outcome.headers.get("content-type", "unknown content-type")
                    cause = f"not JSON ({clean(kind, hay, plan.secrets, 80)})"
                    missing = (cause, cause)
            else:
                if isinstance(outcome, Reply):
                    cause = f"HTTP {outcome.status_code}"
                elif isinstance(outcome, RerankError):
                    cause = clean(str(outcome), hay, plan.secrets)
                else:
                    cause = type(outcome).__name__ if outcome is not EXPIRED else "deadline"
                missing = (cause, cause)
        no_cap, no_model = missing
        if question.cap and no_cap is not None:
            say = log.warning if question.loud else log.info
            say(
                "rerank.info_unavailable",
                provider=plan.provider,
                caused_by=no_cap,
                batch_size=learned.batch_size,
            )
            if no_model == no_cap:  # one failure, said once
                return
        if question.model and no_model is not None:
            log.info("rerank.model_unknown", provider=plan.provider, caused_by=no_model)

    def _fork(self, start: int, stop: int, size: int) -> Flow:
        # Loops, not comprehensions: a comprehension naming `self`, `stop` or `size` makes a
        # cell of each, kept while this generator waits for the whole call.
        flows = []
        for a in range(start, stop, size):
            flows.append(self._batch(a, min(a + size, stop)))
        parts = yield Fork(flows)
        return [pair for part in parts for pair in part]

    def _batch(self, start: int, stop: int) -> Flow:
        """One batch: send, judge, retry, or split and fork."""
        plan, size = self.plan, self.learned.batch_size
        if stop - start > size:  # the server taught a smaller cap meanwhile
            return (yield from self._fork(start, stop, size))
        batch = self.texts[start:stop]
        top_n = None if self.top_k is None else min(self.top_k, len(batch))
        body = build_request(plan.format, self.query, batch, model=plan.model, top_n=top_n)
        expected = expected_results(plan.format, len(batch), top_n)
        url = plan.base_url + plan.format.path
        retry_num = 0
        while True:
            if self.deadline.expired():
                raise self.deadline_error()
            with self._lock:
                self.requests += 1
            outcome = yield Send("POST", url, plan.headers(), body)
            if outcome is EXPIRED:
                raise self.deadline_error()
            if isinstance(outcome, RerankProtocolError):  # over a limit while reading
                attempt = _Attempt(error=outcome)
            elif isinstance(outcome, httpx.HTTPError):
                if self.deadline.expired():
                    raise self.deadline_error()
                attempt = self._transport_error(outcome)
            else:
                assert isinstance(outcome, Reply)
                try:
                    attempt = self._judge(outcome, batch, expected)
                except RerankError:
                    raise
                except Exception as exc:  # a parser or policy bug must still fall back
                    attempt = _Attempt(error=self._not_ours(f"unreadable ({type(exc).__name__})"))
            if attempt.parsed is not None:
                return self._record(attempt.parsed, start)
            if attempt.split_to is not None:
                self._split_event(attempt, len(batch), start)
                return (yield from self._fork(start, stop, attempt.split_to))
            try:
                wait = self._wait_before_retry(attempt, retry_num, start)
            except Exception:  # a policy bug on hostile headers: the error stands, not retried
                wait = None
            assert attempt.error is not None
            if wait is None:
                raise attempt.error
            yield Sleep(wait)
            retry_num += 1

    # -- decisions --------------------------------------------------------------------------

    def deadline_error(self) -> RerankTransportError:
        """The call ran out of time; says which setting bounds it."""
        within = f"the {self.plan.timeout:g} s deadline"
        if self.deadline.seconds < self.plan.timeout:  # cut short by a chain's deadline
            within = f"the {self.deadline.seconds:.3g} s a shared deadline left"
        return RerankTransportError(
            f"no answer within {within} (timeout={self.plan.timeout}) "
            f"after {self.requests} request(s)",
            kind="deadline",
        )

    def spent(self, exc: RerankError) -> RerankError:
        """`exc` carrying what the failed call spent, for the stage's span and metrics."""
        exc.requests, exc.retries, exc.batches = self.requests, self.retries, self.batches
        return exc

    def _transport_error(self, exc: httpx.HTTPError) -> _Attempt:
        """The one place httpx's exceptions become ours, classified for retry.

        The message is cleaned as server text (h11's "illegal status/header line" quotes the
        raw bytes, which may echo the key, the query or a document) and the httpx error is not
        chained, so none of it reaches logs or span stack traces.
        """
        plan = self.plan
        detail = clean(str(exc), self.hay(), plan.secrets) or "no detail"
        what = f"{type(exc).__name__}: {detail}"
        kind: TransportKind = "other"
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
            what = f"could not connect to {masked_url(plan.base_url)} ({what})"
            kind = "connect"
        elif isinstance(exc, httpx.TimeoutException):
            kind = "timeout"
        return _Attempt(
            error=RerankTransportError(what, kind=kind, cause=type(exc).__name__),
            retryable=is_retryable_error(exc),
            cause=type(exc).__name__,
        )

    def _not_ours(self, what: str) -> RerankProtocolError:
        provider = self.plan.provider
        return RerankProtocolError(
            f"{provider} answered something that is not a {provider} response: {what}"
        )

    def _judge(self, reply: Reply, batch: list[str], expected: int) -> _Attempt:
        """Turn a response into an attempt outcome; decodes the JSON body once.

        Every text quoted from the server's bytes goes through `_sanitize`: a server may echo
        the key, the query or the documents.
        """
        plan = self.plan
        n = len(batch)
        # The haystack (every text sent, in every escaped form) is built only when a server
        # text is to be cleaned: a good answer without a model string never needs it.
        if reply.is_success:
            try:
                body = reply.json()
            except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
                kind = reply.headers.get("content-type", "unknown content-type")
                kind = clean(kind, self.hay(), plan.secrets, 80)
                # The secrets whole, before the cut below could split one.
                content = without_secrets_bytes(reply.content[:4096], plan.secrets)
                head = content[:200].decode("utf-8", errors="replace")
                snippet = clean(head, self.hay(), plan.secrets, limit=60)
                return _Attempt(error=self._not_ours(f"not valid JSON ({kind}): {snippet!r}"))
            try:
                parsed = parse_response(
                    plan.format, body, reply.headers, n_texts=n, expected=expected
                )
            except RerankProtocolError as exc:
                # The detail may quote a value from the body: a document echoed as an index.
                said = str(exc).removeprefix(f"{plan.provider}: ")
                return _Attempt(error=self._not_ours(clean(said, self.hay(), plan.secrets)))
            if parsed.model is not None:
                parsed = ParsedBatch(
                    parsed.pairs, parsed.usage, self._model(parsed.model, self.hay())
                )
            return _Attempt(parsed=parsed)
        status = reply.status_code
        if 300 <= status < 400:
            location = clean(shown_url(reply.headers.get("location", "")), self.hay(), plan.secrets)
            return _Attempt(error=RerankRedirectError(status, location, provider=plan.provider))
        message = server_text(reply.content, self.hay(), plan.secrets)
        error = RerankStatusError(
            status,
            message,
            provider=plan.provider,
            url=shown_url(plan.base_url + plan.format.path),
        )
        if status in (413, 422):
            cap = batch_cap(reply.content, n)
            if cap is not None:
                return _Attempt(error=error, split_to=cap, learned=True)
            if status == 413 and n > 1:
                return _Attempt(error=error, split_to=(n + 1) // 2)
        retryable = is_retryable_status(status, previous_424s=self.seen_424)
        if status == 424:
            with self._lock:
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
        log.info("rerank.batch_split", provider=self.plan.provider, **fields)
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event("rerank.batch_split", fields)
        if attempt.learned:
            self.learned.remember_cap(cap, n, self.plan.provider)

    def _wait_before_retry(self, attempt: _Attempt, retry_num: int, offset: int) -> float | None:
        """Seconds to sleep before retrying, or None when the attempt's error is final."""
        if not attempt.retryable or retry_num >= self.plan.max_retries:
            return None
        wait = retry_wait(
            retry_num,
            headers=attempt.headers,
            remaining=self.deadline.remaining(),
            random=self.plan.random,
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
        log.info("rerank.retry_scheduled", provider=self.plan.provider, **fields)
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event("rerank.retry_scheduled", fields)
        with self._lock:
            self.retries += 1
        return wait

    def _model(self, name: str, hay: Hay) -> str | None:
        """A model name from the server, cleaned like any server text and capped."""
        return clean(name, hay, self.plan.secrets, MODEL_MAX_CHARS) or None

    def _record(self, parsed: ParsedBatch, offset: int) -> Pairs:
        with self._lock:
            self.batches += 1
            self.usage = self.usage + parsed.usage
            if parsed.model:
                self.model = parsed.model
        if not offset:  # the call's only batch, or its first: indices are the call's already
            return parsed.pairs
        return [(offset + i, score) for i, score in parsed.pairs]
