"""The library's one error tree.

Every failure of a rerank call surfaces as a `RerankError`, so a caller (and the stage's
fallback) can catch one type. Lower-level httpx errors are translated in exactly one place,
`client.flow.Call._transport_error`, deliberately *not* chained: an httpx exception's context
(request, headers) could carry the API key into a recorded stack trace. No message here ever carries
request headers, and server text has the key replaced before it is quoted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "RerankChainError",
    "RerankClientClosedError",
    "RerankError",
    "RerankProtocolError",
    "RerankRedirectError",
    "RerankStatusError",
    "RerankTransportError",
]


class RerankError(Exception):
    """Base class: the rerank call failed and no result was returned.

    `requests`, `retries` and `batches` say what the failed call spent before it gave up
    (filled in by the clients, zero otherwise), so traces and metrics count failing calls too.
    """

    requests: int = 0
    retries: int = 0
    batches: int = 0


TransportKind = Literal["connect", "timeout", "deadline", "other"]


class RerankTransportError(RerankError):
    """The request did not complete: connect error, timeout, reset, or the deadline ran out.

    `kind` says which, for callers that word a message or a hint from it: ``"connect"`` (no
    connection could be made: is the service up?), ``"timeout"`` (a read or write timed out),
    ``"deadline"`` (the call's whole `timeout` ran out) or ``"other"`` (a reset, a broken
    response...). `cause` names the underlying httpx error type, where there was one.
    """

    def __init__(
        self, message: str, *, kind: TransportKind = "other", cause: str | None = None
    ) -> None:
        super().__init__(message)
        self.kind: TransportKind = kind
        self.cause = cause

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self),), {"kind": self.kind, "cause": self.cause})


URL_STATUSES = frozenset({404, 405})
"""Statuses whose message names the URL requested: the path is the likely mistake."""


class RerankStatusError(RerankError):
    """The server answered with a non-2xx status.

    `status_code` is the HTTP status, `server_message` the error text the server gave
    (parsed from the provider's error body when it has one), possibly empty. `url` is the URL
    requested, credentials masked (None where unknown); a 404 or 405 names it in the message.
    """

    def __init__(
        self, status_code: int, server_message: str, *, provider: str = "", url: str | None = None
    ) -> None:
        self.status_code = status_code
        self.server_message = server_message
        self.provider = provider
        self.url = url
        who = provider or "the rerank service"
        detail = f": {server_message}" if server_message else ""
        # "Not found" is about the URL: say which one was asked for (credentials masked).
        where = f" for {url}" if url and status_code in URL_STATUSES else ""
        super().__init__(f"{who} answered HTTP {status_code}{where}{detail}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Picklable (process pools, queue log handlers) with its attributes.
        return (_status_error, (self.status_code, self.server_message, self.provider, self.url))


class RerankRedirectError(RerankStatusError):
    """The server answered a redirect (30x), which is never followed: it would carry the key to
    whatever origin the server names. `location` is where it pointed, without userinfo, query
    or fragment (and cleaned of echoes); fix the endpoint instead."""

    def __init__(self, status_code: int, location: str, *, provider: str = "") -> None:
        self.location = location
        where = f"redirect to {location}" if location else "redirect without a Location"
        super().__init__(
            status_code, f"{where} (not followed: point base_url there)", provider=provider
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_redirect_error, (self.status_code, self.location, self.provider))


class RerankProtocolError(RerankError):
    """The server answered 2xx, but the body breaks the provider's contract, or any answer
    broke a limit (`max_response_bytes`, an encoding not asked for).

    Raised instead of ever returning a result that might be attached to the wrong item.
    """


class RerankClientClosedError(RerankError):
    """The client can no longer send: it was closed, or (async) the event loop it was used in
    has closed. The message says what to do; the stage falls back as for any rerank failure."""


@dataclass(frozen=True, slots=True)
class TierFailure:
    """Why one tier of a `RerankerChain` gave no answer: `cause` is the exception's type name,
    or ``circuit_open`` / ``deadline`` for a tier skipped without a request; `message` is
    sanitised (no key, no echo of the query or documents)."""

    tier: int
    provider: str | None
    cause: str
    message: str


class RerankChainError(RerankError):
    """Every tier of a `RerankerChain` failed or was skipped: `failures` says why, tier by
    tier; `requests`, `retries` and `batches` add up what the tiers spent. The stage then
    falls back to recall order, as for any `RerankError`."""

    def __init__(self, failures: tuple[TierFailure, ...]) -> None:
        self.failures = failures
        parts = [
            f"tier {f.tier}" + (f" ({f.provider})" if f.provider else "") + f": {f.message}"
            for f in failures
        ]
        super().__init__("every tier of the reranker chain failed: " + "; ".join(parts))

    def __reduce__(self) -> tuple[Any, ...]:
        state = {"requests": self.requests, "retries": self.retries, "batches": self.batches}
        return (type(self), (self.failures,), state)


def _status_error(
    status_code: int, server_message: str, provider: str, url: str | None = None
) -> RerankStatusError:
    """Rebuilds a pickled `RerankStatusError`."""
    return RerankStatusError(status_code, server_message, provider=provider, url=url)


def _redirect_error(status_code: int, location: str, provider: str) -> RerankRedirectError:
    """Rebuilds a pickled `RerankRedirectError`."""
    return RerankRedirectError(status_code, location, provider=provider)
