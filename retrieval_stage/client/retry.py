"""Retry policy as pure functions: what to retry and how long to wait.

Kept free of I/O so every rule is unit-tested with an injected clock and randomness.

Policy (documented in docs/reliability.md):

- retried: 408, 429, 500, 502, 503, 504, transport failures (connect errors, connect/read/
  write/pool timeouts, connection resets, the server breaking HTTP); TEI's 424 (backend error)
  at most once per call;
- never retried: every other 4xx (400, 401, 403, 404, 413, 422, ...), a 2xx whose body breaks
  the contract, and errors in our own request (an illegal header value, say), which would
  only repeat;
- wait before retry ``n`` (0-based): ``min(0.5 * 2**n, 8) * (1 - 0.25 * random())`` seconds,
  unless the server sent ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date), which
  wins (a negative hint counts as zero);
- never wait past the call's deadline: a retry whose wait would end after it is not made.
"""

from __future__ import annotations

import email.utils
import math
from collections.abc import Callable, Mapping

import httpx

__all__ = [
    "BACKOFF_BASE_S",
    "BACKOFF_MAX_S",
    "RETRYABLE_STATUSES",
    "backoff_delay",
    "is_retryable_error",
    "is_retryable_status",
    "parse_retry_after",
    "retry_wait",
]

RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
"""Statuses retried up to ``max_retries`` times."""

ONCE_STATUSES = frozenset({424})
"""TEI's backend error: the model failed on this input; a second try may succeed, a third won't."""

BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 8.0


def is_retryable_status(status: int, *, previous_424s: int = 0) -> bool:
    """Whether a response with `status` may be retried (`previous_424s` counts 424s seen)."""
    if status in RETRYABLE_STATUSES:
        return True
    if status in ONCE_STATUSES:
        return previous_424s == 0
    return False


_RETRYABLE_ERRORS: tuple[type[httpx.HTTPError], ...] = (
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
    httpx.ProxyError,
)


def is_retryable_error(exc: BaseException) -> bool:
    """Whether an httpx error is worth another attempt.

    Timeouts (connect, read, write, pool), network errors (refused, reset) and a server that
    broke HTTP (empty reply, malformed chunk, garbage) may be transient. Errors in our own
    request (`httpx.LocalProtocolError`, an unsupported scheme) or in decoding the body would
    happen again.
    """
    return isinstance(exc, _RETRYABLE_ERRORS)


def backoff_delay(retry_num: int, random: Callable[[], float]) -> float:
    """Exponential backoff with jitter for the retry numbered `retry_num` (0-based).

    ``min(0.5 * 2**n, 8) * (1 - 0.25 * random())``: the openai/anthropic SDKs' formula, so the
    wait lies in [75%, 100%] of the capped exponential.
    """
    base = min(BACKOFF_BASE_S * (2.0**retry_num), BACKOFF_MAX_S)
    return base * (1.0 - 0.25 * random())


def parse_retry_after(headers: Mapping[str, str], *, now: float) -> float | None:
    """The server's requested wait in seconds, or None when absent or unusable.

    ``retry-after-ms`` wins over ``Retry-After``; the latter may be seconds or an HTTP date,
    compared against `now` (a Unix timestamp). Negative values count as zero. A long wait is
    returned as asked: `retry_wait` then refuses the retry when it cannot finish before the
    call's deadline, rather than hammering a server that asked for time.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms is not None:
        try:
            seconds = float(raw_ms) / 1000.0
        except ValueError:
            seconds = math.nan
        if not math.isnan(seconds):
            return _usable(seconds)
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
            if when is None:  # pragma: no cover - older Pythons returned None
                return None
            seconds = when.timestamp() - now
        except (TypeError, ValueError, IndexError, OverflowError, OSError):
            # OverflowError/OSError: a date whose year no clock can hold (20 digits, say)
            return None
    if math.isnan(seconds):
        return None
    # inf (or 1e400) asks for more time than any deadline has: "not now", never a retry.
    return _usable(seconds)


def _usable(seconds: float) -> float:
    return max(seconds, 0.0)


def retry_wait(
    retry_num: int,
    *,
    headers: Mapping[str, str] | None,
    remaining: float,
    random: Callable[[], float],
    now: float,
) -> float | None:
    """How long to sleep before retry `retry_num`, or None when the deadline forbids it.

    The server's ``Retry-After`` wins over backoff; either way a wait that would use up the
    `remaining` time of the call is refused, because the retry could not finish in time.
    """
    wait = parse_retry_after(headers, now=now) if headers else None
    if wait is None:
        wait = backoff_delay(retry_num, random)
    if wait >= remaining:
        return None
    return wait
