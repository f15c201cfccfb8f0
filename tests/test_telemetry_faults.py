"""A broken trace collector never slows or breaks reranking, and never holds up exit for long.

Three collectors: unreachable (a closed port on 127.0.0.1), slow (WireMock holding each export
3 s, past the exporter's 1 s timeout) and failing (HTTP 500). Spans leave through
`configure_tracing`'s BatchSpanProcessor, so `span.end()` only enqueues; these tests pin that
promise from the outside: every `stage.run` returns well before one export could have timed
out, nothing is raised, and `provider.shutdown()` returns within the exporter's timeout plus a
margin.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from retrieval_stage import Candidate, RerankClient, RerankStage
from retrieval_stage.telemetry import configure_tracing, otlp_span_exporter

from .conftest import WireMock

EXPORT_TIMEOUT = 1.0
"""The exporter's timeout in these tests (configure_tracing's default is 5 s)."""

MARGIN = 1.5
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
        {"status": 200, "fixedDelayMilliseconds": 3000} if kind == "slow" else {"status": 500}
    )
    wm.stub({"request": {"method": "POST", "urlPath": f"/{kind}/v1/traces"}, "response": response})
    return f"{wm.url}/{kind}"


def stub_reranker(wm: WireMock) -> None:
    wm.stub_json("/ok/rerank", [{"index": 1, "score": 0.9}, {"index": 0, "score": 0.1}])


def cands() -> list[Candidate]:
    return [Candidate("a", "first", 0.8), Candidate("b", "second", 0.2)]


class Recorder(logging.Handler):
    """Keeps the SDK's own log records (it reports export failures there, never raises)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


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
    failures = Recorder()
    otel_logger = logging.getLogger("opentelemetry")
    otel_logger.addHandler(failures)
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
        provider.shutdown()
        shutdown = time.monotonic() - started
        otel_logger.removeHandler(failures)
    # A run that waited for even one export would have taken the exporter's whole timeout.
    assert max(latencies) < EXPORT_TIMEOUT, latencies
    # Shutdown may find one export in flight, then makes one final export: two timeouts at most.
    assert shutdown < 2 * EXPORT_TIMEOUT + MARGIN
    assert failures.records, "the exporter said nothing about failing"


def test_latency_check_would_catch_an_exporter_on_the_hot_path(wm: WireMock) -> None:
    """The control: exporting in the caller's thread makes a run wait out the timeout."""
    stub_reranker(wm)
    provider = TracerProvider()
    exporter = otlp_span_exporter(collector(wm, "slow"), timeout=EXPORT_TIMEOUT)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        (latency,) = timed_runs(wm, provider, runs=1)
    finally:
        provider.shutdown()
    assert latency >= EXPORT_TIMEOUT * 0.9


@pytest.mark.parametrize("kind", COLLECTORS)
def test_shutdown_returns_within_the_exporter_timeout(wm: WireMock, kind: str) -> None:
    stub_reranker(wm)
    provider = configure_tracing(
        "telemetry-faults", exporter=otlp_span_exporter(collector(wm, kind), timeout=EXPORT_TIMEOUT)
    )
    timed_runs(wm, provider)  # the spans wait in the queue: the schedule delay is 5 s
    started = time.monotonic()
    provider.shutdown()
    assert time.monotonic() - started < EXPORT_TIMEOUT + MARGIN


def test_shutdown_with_many_queued_spans_is_bounded_by_one_exporter_timeout(wm: WireMock) -> None:
    provider = configure_tracing(
        "telemetry-faults",
        exporter=otlp_span_exporter(collector(wm, "slow"), timeout=EXPORT_TIMEOUT),
        export_timeout=EXPORT_TIMEOUT,
    )
    tracer = provider.get_tracer("queue-filler")
    for _ in range(1500):
        with tracer.start_as_current_span("queued"):
            pass
    started = time.monotonic()
    provider.shutdown()
    assert time.monotonic() - started < EXPORT_TIMEOUT + MARGIN
