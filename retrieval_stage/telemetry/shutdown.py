"""One deadline for all the telemetry an application configured through us.

`configure_tracing` and `configure_metrics` register their providers here instead of letting
the SDK install one exit hook each (the SDK's waits up to 30 s per provider). At exit, or when
the application calls `shutdown_telemetry`, every provider is shut down in parallel and the
caller waits once, for at most the deadline; what did not reach the collector is counted and
said once, as ``telemetry.undelivered``.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from .._log import get_logger
from .exporters import Delivery

__all__ = [
    "DEFAULT_SHUTDOWN_TIMEOUT_S",
    "ShutdownReport",
    "forget",
    "in_background",
    "register",
    "shutdown_telemetry",
]

DEFAULT_SHUTDOWN_TIMEOUT_S = 1.0
"""How long exit may wait for telemetry to leave, traces and metrics together."""

_log = get_logger("retrieval_stage.telemetry")


def in_background(work: Callable[[], object]) -> threading.Event:
    """Start `work` in a daemon thread; the event is set when it has finished (or failed).

    A daemon thread left running never holds process exit. Where no thread can be started
    (interpreter shutdown on newer Pythons), `work` runs inline.
    """
    done = threading.Event()

    def run() -> None:
        try:
            work()
        except Exception as exc:  # telemetry never breaks the application's exit
            _log.debug("telemetry.shutdown_failed", caused_by=type(exc).__name__)
        finally:
            done.set()

    try:
        threading.Thread(target=run, name="retrieval-stage-telemetry-exit", daemon=True).start()
    except RuntimeError:
        run()
    return done


@dataclass
class _Registered:
    provider: Any
    deliveries: list[Delivery] = field(default_factory=list)
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S
    done: bool = False


_registry: list[_Registered] = []
_lock = threading.Lock()
_atexit_installed = False


def register(provider: Any, deliveries: list[Delivery], shutdown_timeout: float) -> None:
    """Remember `provider` (and its delivery counts) for `shutdown_telemetry` and the exit hook."""
    global _atexit_installed
    with _lock:
        _registry.append(_Registered(provider, deliveries, shutdown_timeout))
        if not _atexit_installed:
            atexit.register(_shutdown_at_exit)
            _atexit_installed = True


def is_registered(provider: Any) -> bool:
    """Whether `provider` awaits `shutdown_telemetry` (registered and not shut down yet)."""
    with _lock:
        return any(entry.provider is provider and not entry.done for entry in _registry)


def registered_timeout(provider: Any) -> float:
    """The shutdown bound `provider` was configured with."""
    with _lock:
        for entry in _registry:
            if entry.provider is provider:
                return entry.shutdown_timeout
    return DEFAULT_SHUTDOWN_TIMEOUT_S


def forget(provider: Any) -> None:
    """`provider` is being shut down by its own ``shutdown()``: the exit hook must skip it."""
    with _lock:
        for entry in _registry:
            if entry.provider is provider:
                entry.done = True


def _shutdown_at_exit() -> None:
    with _lock:
        live = [entry for entry in _registry if not entry.done]
    if live:
        shutdown_telemetry(
            *(entry.provider for entry in live),
            timeout=max(entry.shutdown_timeout for entry in live),
        )


@dataclass(frozen=True, slots=True)
class ShutdownReport:
    """What `shutdown_telemetry` could not deliver before its deadline (all zero: everything).

    `finished` is False when some provider's shutdown was still running at the deadline.
    """

    spans_not_delivered: int = 0
    metric_points_not_delivered: int = 0
    endpoints: tuple[str, ...] = ()
    finished: bool = True

    def __bool__(self) -> bool:
        """True when something was lost."""
        return bool(self.spans_not_delivered or self.metric_points_not_delivered)


def _shutdown_one(provider: Any, timeout: float) -> None:
    from opentelemetry.sdk.metrics import MeterProvider

    if isinstance(provider, MeterProvider):
        provider.shutdown(timeout_millis=timeout * 1000)
    else:
        provider.shutdown()


def _claim(providers: tuple[Any, ...]) -> tuple[list[Any], list[Delivery]]:
    """The providers not shut down yet, and the delivery counts of those we configured."""
    with _lock:
        entries = {id(entry.provider): entry for entry in _registry}
        todo: list[Any] = []
        deliveries: list[Delivery] = []
        for provider in providers:
            entry = entries.get(id(provider))
            if entry is None:
                todo.append(provider)
            elif not entry.done:
                entry.done = True
                todo.append(provider)
                deliveries.extend(entry.deliveries)
        _registry[:] = [entry for entry in _registry if not entry.done]
    return todo, deliveries


def shutdown_telemetry(
    *providers: Any,
    timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S,
) -> ShutdownReport:
    """Flush and shut down tracer and meter providers together, under ONE deadline.

    Pass everything `configure_tracing` and `configure_metrics` returned (other SDK providers
    are shut down too, just not counted). Returns within `timeout` seconds (plus scheduling
    noise) even when the collector is down or never answers: past the deadline the exporters
    are closed and what is still queued or in flight is dropped. What did not arrive is said
    once, as a ``telemetry.undelivered`` warning with the counts and the endpoints (credentials
    masked), and returned. A provider is shut down once: calling again, or the exit hook
    afterwards, skips it.
    """
    deadline = time.monotonic() + timeout
    todo, deliveries = _claim(providers)
    waits = [in_background(partial(_shutdown_one, provider, timeout)) for provider in todo]
    finished = [wait.wait(max(deadline - time.monotonic(), 0.0)) for wait in waits]
    for delivery in deliveries:
        delivery.close()
    spans = sum(d.not_delivered for d in deliveries if d.signal == "traces")
    points = sum(d.not_delivered for d in deliveries if d.signal == "metrics")
    endpoints = tuple(dict.fromkeys(d.shown for d in deliveries if d.not_delivered))
    report = ShutdownReport(spans, points, endpoints, all(finished))
    if report:
        _log.warning(
            "telemetry.undelivered",
            spans_not_delivered=spans,
            metric_points_not_delivered=points,
            endpoints=list(endpoints),
            timeout_s=timeout,
        )
    return report
