"""What went wrong with a rerank call, said for people, and how `demo --repeat` waits after one.

The words key on what the error IS (its type and attributes), never on its message text: a
`RerankStatusError` carries the status and the server's own message, a `RerankProtocolError`
says the answer broke the provider's contract, and a `RerankTransportError` is a timeout or a
connection that could not be made. "Is the service up?" is said only for the last case, the
only one where it is the likely cause.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .._redact import scrubbed_message, shown_url
from ..errors import RerankError, RerankProtocolError, RerankStatusError, RerankTransportError
from .hints import connect_hint

__all__ = [
    "MAX_BACKOFF_S",
    "Failure",
    "Witness",
    "backoff_s",
    "describe",
    "transport_kind",
]

MAX_BACKOFF_S = 30.0
"""The longest `demo --repeat` waits after consecutive failures."""

MIN_BACKOFF_S = 0.1
"""The first wait after a failure when --interval is 0: a failing service is not hammered."""

TransportKind = Literal["timeout", "connect", "other"]
"""How the CLI words a transport failure (the error's own ``kind`` folds deadline into
timeout)."""


@dataclass(frozen=True)
class Failure:
    """One failed rerank call for people: what happened, and a hint where one is likely."""

    message: str
    hint: str | None = None

    def __str__(self) -> str:
        return self.message if self.hint is None else f"{self.message}; {self.hint}"


class Witness:
    """Passes every call to `inner` and remembers the last `RerankError` it raised and how long
    that call took, so a command can say why the stage fell back (the stage only logs it).

    Every other attribute (``model_name``, ``provider``, ``base_url``...) is the inner
    reranker's, so spans and metrics name the real reranker.
    """

    def __init__(self, inner: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        self.last_error: RerankError | None = None
        self.last_elapsed: float | None = None
        self._clock = clock

    def _witnessed(self, call: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            self.last_error, self.last_elapsed = None, None
            started = self._clock()
            try:
                return call(*args, **kwargs)
            except RerankError as exc:
                self.last_error, self.last_elapsed = exc, self._clock() - started
                raise

        return run

    def rerank(self, *args: Any, **kwargs: Any) -> Any:
        return self._witnessed(self.inner.rerank)(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if name == "rerank_response" and callable(value):
            return self._witnessed(value)
        return value

    def __repr__(self) -> str:
        return repr(self.inner)


def transport_kind(exc: RerankTransportError) -> TransportKind:
    """Whether a transport error was the deadline (or a timeout), a connection never made, or
    something else: read from the error's ``kind``, which the client sets where it translates
    the httpx error, never guessed from the message or from how long the call took."""
    if exc.kind in ("timeout", "deadline"):
        return "timeout"
    if exc.kind == "connect":
        return "connect"
    return "other"


_STATUS_HINTS = {
    401: "check --api-key and --api-key-header",
    403: "check --api-key and --api-key-header",
    404: "check --endpoint and --provider (each provider has its own path)",
    405: "check --endpoint and --provider (each provider has its own path)",
    429: "the service is busy: try again later or lower the traffic",
    503: "the service is not ready (still loading its model?) or overloaded",
}


def _path_hint(requested: str, base_url: str) -> str:
    """For a 404/405: the provider's path is appended to --endpoint, so name it."""
    path = requested[len(base_url.rstrip("/")) :] if requested.startswith(base_url) else ""
    if path and base_url.rstrip("/").endswith(path):
        return (
            f"--endpoint already ends in {path}, which is appended to it: pass the base URL "
            f"(--endpoint {shown_url(base_url.rstrip('/')[: -len(path)] or base_url)})"
        )
    appended = f" ({path} is appended to it)" if path else ""
    return f"check --endpoint{appended} and --provider (each provider has its own path)"


def describe(
    exc: RerankError,
    *,
    base_url: str | None,
    provider: str | None = None,
    timeout: float | None = None,
    elapsed: float | None = None,
) -> Failure:
    """`exc` for people: "answered HTTP 500: <server message>", "answered something that is not
    a TEI response: <what>", "no answer within the 30 s deadline (--timeout)", "could not
    connect to URL" with "is the service up?". Credentials in `base_url` never appear."""
    if base_url is None:  # an in-process reranker
        return Failure(f"the reranker failed: {exc}")
    where = shown_url(base_url)
    if isinstance(exc, RerankStatusError):
        said = scrubbed_message(exc.server_message, base_url).strip()
        detail = f": {said}" if said else " with no message"
        if exc.url and exc.status_code in (404, 405):
            # Name the URL asked for: "/rerank/rerank" shows the path was given twice.
            return Failure(
                f"{shown_url(exc.url)} answered HTTP {exc.status_code}{detail}",
                _path_hint(exc.url, base_url),
            )
        return Failure(
            f"{where} answered HTTP {exc.status_code}{detail}", _STATUS_HINTS.get(exc.status_code)
        )
    if isinstance(exc, RerankProtocolError):
        name = "TEI" if provider in (None, "tei") else provider
        # The client's message already says "<provider> answered something that is not a
        # <provider> response: "; only what follows is news.
        said = str(exc)
        marker = "response: "
        if "answered something that is not a" in said and marker in said:
            said = said.split(marker, 1)[1]
        return Failure(
            f"{where} answered something that is not a {name} response: "
            f"{scrubbed_message(said, base_url)}"
        )
    if isinstance(exc, RerankTransportError):
        kind = transport_kind(exc)
        if kind == "timeout":
            seconds = f" {timeout:g} s" if timeout is not None else ""
            return Failure(f"{where}: no answer within the{seconds} deadline (--timeout)")
        if kind == "connect":
            return Failure(f"could not connect to {where}", connect_hint(base_url))
        return Failure(f"the connection to {where} failed: {scrubbed_message(str(exc), base_url)}")
    return Failure(f"{where}: {scrubbed_message(str(exc), base_url)}")


def backoff_s(failures: int, interval: float) -> float:
    """How long `demo --repeat` waits before the next run after `failures` failed in a row.

    The interval itself after a success; after failures it doubles per failure from
    ``max(interval, 0.1 s)``, capped at `MAX_BACKOFF_S`, so a service that is down is not
    hammered and a long run resumes soon after it is back.
    """
    if failures <= 0:
        return interval
    base = max(interval, MIN_BACKOFF_S)
    return float(min(base * 2 ** (failures - 1), max(MAX_BACKOFF_S, interval)))
