"""A broken trace collector never slows or breaks reranking, and never holds up exit for long.

Three collectors: unreachable (a closed port on 127.0.0.1), slow (WireMock holding each export
6 s, past the exporter's 5 s timeout) and failing (HTTP 500). Spans leave through
`configure_tracing`'s BatchSpanProcessor, so `span.end()` only enqueues; these tests pin that
promise from the outside: every `stage.run` returns well before one export could have timed
out, nothing is raised, and shutdown returns within its deadline plus a named margin, however
many spans are queued, with what was lost counted.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from retrieval_stage import Candidate, RerankClient, RerankStage
from retrieval_stage.telemetry import configure_tracing, otlp_span_exporter, shutdown_telemetry

from ..conftest import WireMock

EXPORT_TIMEOUT = 5.0
"""The exporter's timeout per export in these tests (configure_tracing's default). Anything
that waits for one export takes this long: longer than any bound below, so a wait is caught."""
SHUTDOWN_TIMEOUT = 0.5
"""The shutdown deadline in these tests: well under one export timeout, so waiting for an
export at shutdown, or for the SDK's own unbounded flush, fails the check."""
SLOW_COLLECTOR_DELAY_MS = 6000
"""Longer than `EXPORT_TIMEOUT`: every export to the slow collector times out."""

SCHEDULING_MARGIN = 3.0
"""Seconds allowed past a deadline for scheduling noise on a shared, busy 2-core machine.

`SHUTDOWN_TIMEOUT` plus this stays under `EXPORT_TIMEOUT`, so a shutdown that waits out one
export still fails its bound."""
RUNS = 8
COLLECTORS = ["unreachable", "slow", "failing"]


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def collector(wm: WireMock, kind: str) -> str:
    """The base URL of a collector of `kind`; the exporter appends /v1/traces."""
    if kind == "unreachable":
        return f"http://127.0.0.1:{closed_port()}"
    response = (
        {"status": 200, "fixedDelayMilliseconds": SLOW_COLLECTOR_DELAY_MS}
        if kind == "slow"
        else {"status": 500}
    )
    wm.stub({"request": {"method": "POST", "urlPath": f"/{kind}/v1/traces"}, "response": response})
    return f"{wm.url}/{kind}"


def stub_reranker(wm: WireMock) -> None:
    wm.stub_json("/ok/rerank", [{"index": 1, "score": 0.9}, {"index": 0, "score": 0.1}])


def cands() -> list[Candidate]:
    return [Candidate("a", "first", 0.8), Candidate("b", "second", 0.2)]


def wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def timed_runs(wm: WireMock, provider: TracerProvider, runs: int = RUNS) -> list[float]:
    """Run the stage `runs` times; every run must rerank. Returns each run's seconds."""
    latencies = []
    with RerankClient(wm.url + "/ok") as client:
        stage = RerankStage(client, tracer_provider=provider)
        for _ in range(runs):
            started = time.monotonic()
            outputs = stage.run("q", cands())
            latencies.append(time.monotonic() - started)
            assert [o.candidate.id for o in outputs] == ["b", "a"]
            assert all(o.reranked for o in outputs)
    return latencies


@pytest.mark.parametrize("kind", COLLECTORS)
def test_broken_collector_leaves_reranking_fast_and_raises_nothing(
    wm: WireMock, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Export each span at once, so the exporter is busy (or stuck) while the stage keeps going.
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
    stub_reranker(wm)
    endpoint = collector(wm, kind)
    provider = configure_tracing(
        "telemetry-faults", exporter=otlp_span_exporter(endpoint, timeout=EXPORT_TIMEOUT)
    )
    try:
        latencies = timed_runs(wm, provider)
        if kind != "unreachable":
            # The positive control: exports really went out (and were stuck or refused).
            assert wait_for(lambda: bool(wm.requests(f"/{kind}/v1/traces")), 3.0)
    finally:
        started = time.monotonic()
        report = shutdown_telemetry(provider, timeout=SHUTDOWN_TIMEOUT)
        shutdown = time.monotonic() - started
    # A run that waited for even one export would have taken the exporter's whole timeout; a
    # run that did not takes milliseconds, so the bound leaves seconds for a busy machine.
    assert max(latencies) < EXPORT_TIMEOUT, latencies
    # One deadline for the whole shutdown, however many exports were queued or in flight.
    assert shutdown < SHUTDOWN_TIMEOUT + SCHEDULING_MARGIN
    # Failures are counted and reported once, not raised (and not printed per attempt).
    assert report.spans_not_delivered > 0, report


def test_latency_check_would_catch_an_exporter_on_the_hot_path(wm: WireMock) -> None:
    """The control: exporting in the caller's thread makes a run wait out the timeout."""
    stub_reranker(wm)
    provider = TracerProvider()
    exporter = otlp_span_exporter(collector(wm, "slow"), timeout=EXPORT_TIMEOUT)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        (latency,) = timed_runs(wm, provider, runs=1)
    finally:
        exporter.shutdown()
        provider.shutdown()
    assert latency >= EXPORT_TIMEOUT * 0.9


@pytest.mark.parametrize("kind", COLLECTORS)
def test_provider_shutdown_returns_within_the_shutdown_timeout(wm: WireMock, kind: str) -> None:
    stub_reranker(wm)
    provider = configure_tracing(
        "telemetry-faults",
        exporter=otlp_span_exporter(collector(wm, kind), timeout=EXPORT_TIMEOUT),
        shutdown_timeout=SHUTDOWN_TIMEOUT,
    )
    timed_runs(wm, provider)  # the spans wait in the queue: the schedule delay is 5 s
    started = time.monotonic()
    provider.shutdown()
    assert time.monotonic() - started < SHUTDOWN_TIMEOUT + SCHEDULING_MARGIN


def test_shutdown_with_many_queued_spans_is_bounded_by_the_deadline(wm: WireMock) -> None:
    provider = configure_tracing(
        "telemetry-faults",
        exporter=otlp_span_exporter(collector(wm, "slow"), timeout=EXPORT_TIMEOUT),
        shutdown_timeout=SHUTDOWN_TIMEOUT,
    )
    tracer = provider.get_tracer("queue-filler")
    for _ in range(1500):
        with tracer.start_as_current_span("queued"):
            pass
    started = time.monotonic()
    provider.shutdown()
    assert time.monotonic() - started < SHUTDOWN_TIMEOUT + SCHEDULING_MARGIN
