"""Exit is bounded as a whole: traces and metrics flushed together under one deadline.

With the collector down (a closed port) or stuck (a port that accepts and never answers),
`shutdown_telemetry` returns within its deadline plus `MARGIN` and says once, in our log format,
what was not delivered, with the endpoint's credentials masked. An endpoint refusing metrics
(404/405, as Arize Phoenix does) turns metrics off once, with one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import pytest

from retrieval_stage.metrics import RerankMetrics
from retrieval_stage.telemetry import configure_metrics, configure_tracing, shutdown_telemetry

from ..otlp_receivers import closed_port, http_receiver, json_log_lines, silent_port

DEADLINE = 2.0
"""The shutdown deadline here. Each provider alone is bounded by it too, so shutting traces
down and then metrics (instead of together) would take twice as long: > DEADLINE + MARGIN."""
MARGIN = 1.5
"""Generous slack for a shared, busy 2-core machine; still less than one more DEADLINE."""
EXPORT_TIMEOUT = 10.0
"""Each export's own timeout: without the deadline, shutdown would wait this long."""
PROCESS_MARGIN = 6.0
"""Slack when comparing two whole interpreter runs: their start-up alone differed by 2.2 s on a
loaded 2-core machine. DEADLINE plus this stays under EXPORT_TIMEOUT, so an unbounded exit that
waits out one export still fails."""

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "telemetry_shutdown.py"

CALL: dict[str, Any] = {
    "duration_s": 0.01,
    "documents": 3,
    "batches": 1,
    "requests": 1,
    "retries": 0,
    "outcome": "ok",
    "fallback": False,
    "top1_changed": True,
    "model": "m",
    "provider": "tei",
}


@pytest.fixture
def logs() -> Iterator[Callable[[], list[dict[str, Any]]]]:
    with json_log_lines() as read:
        yield read


def _broken(kind: str) -> AbstractContextManager[int]:
    return silent_port() if kind == "silent" else nullcontext(closed_port())


@pytest.mark.parametrize("kind", ["closed", "silent"])
def test_traces_and_metrics_shut_down_together_within_one_deadline(
    kind: str, logs: Callable[[], list[dict[str, Any]]]
) -> None:
    with _broken(kind) as port:
        endpoint = f"http://user:secret@127.0.0.1:{port}"
        tracer_provider = configure_tracing(
            "shutdown", endpoint=endpoint, export_timeout=EXPORT_TIMEOUT, shutdown_timeout=9.0
        )
        meter_provider = configure_metrics(
            "shutdown", endpoint=endpoint, export_timeout=EXPORT_TIMEOUT, shutdown_timeout=9.0
        )
        with tracer_provider.get_tracer("t").start_as_current_span("one"):
            pass
        RerankMetrics(meter_provider).record(**CALL)

        started = time.monotonic()
        report = shutdown_telemetry(tracer_provider, meter_provider, timeout=DEADLINE)
        took = time.monotonic() - started

    assert took < DEADLINE + MARGIN, took
    assert report.spans_not_delivered == 1
    assert report.metric_points_not_delivered == 7  # one point per instrument
    (line,) = [line for line in logs() if line["event"] == "telemetry.undelivered"]
    assert line["level"] == "warning"
    assert line["spans_not_delivered"] == 1
    assert line["metric_points_not_delivered"] == 7
    assert line["endpoints"] == [
        f"http://***@127.0.0.1:{port}/v1/traces",
        f"http://***@127.0.0.1:{port}/v1/metrics",
    ]
    assert "secret" not in json.dumps(logs())
    # No SDK exporter chatter among our lines (it is off by default in configure_logging).
    assert [line["event"] for line in logs()] == ["telemetry.undelivered"]


def test_a_healthy_collector_gets_everything_and_nothing_is_reported(
    logs: Callable[[], list[dict[str, Any]]],
) -> None:
    with http_receiver() as receiver:
        tracer_provider = configure_tracing("shutdown", endpoint=receiver.url)
        meter_provider = configure_metrics("shutdown", endpoint=receiver.url)
        with tracer_provider.get_tracer("t").start_as_current_span("one"):
            pass
        RerankMetrics(meter_provider).record(**CALL)
        report = shutdown_telemetry(tracer_provider, meter_provider, timeout=DEADLINE)
        assert len(receiver.received("/v1/traces")) == 1
        assert len(receiver.received("/v1/metrics")) == 1

    assert not report
    assert report.finished
    assert logs() == []


def test_a_second_shutdown_is_a_no_op(logs: Callable[[], list[dict[str, Any]]]) -> None:
    tracer_provider = configure_tracing("shutdown", endpoint=f"http://127.0.0.1:{closed_port()}")
    shutdown_telemetry(tracer_provider, timeout=0.1)
    started = time.monotonic()
    assert not shutdown_telemetry(tracer_provider, timeout=DEADLINE)
    assert time.monotonic() - started < MARGIN


@pytest.mark.parametrize("status", [404, 405])
def test_an_endpoint_refusing_metrics_turns_them_off_once(
    status: int, logs: Callable[[], list[dict[str, Any]]]
) -> None:
    with http_receiver({"/v1/metrics": status}) as receiver:
        meter_provider = configure_metrics(
            "phoenix-like", endpoint=receiver.url, export_interval_millis=3_600_000
        )
        rerank_metrics = RerankMetrics(meter_provider)
        rerank_metrics.record(**CALL)
        meter_provider.force_flush()
        rerank_metrics.record(**CALL)
        meter_provider.force_flush()
        report = shutdown_telemetry(meter_provider, timeout=DEADLINE)
        sent = receiver.received("/v1/metrics")

    assert len(sent) == 1  # the first export found out; nothing was sent after it
    (line,) = logs()
    assert line["event"] == "telemetry.metrics_disabled"
    assert line["status"] == status
    assert line["endpoint"] == f"{receiver.url}/v1/metrics"
    assert not report  # dropped by choice, already said: not "undelivered"


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_exit_hook_is_bounded_and_prints_no_sdk_lines_on_a_bare_terminal() -> None:
    """No configure_logging, no shutdown call: the README's library snippet with a stuck
    collector. The exit hook keeps exit within the deadline, prints no SDK line, and says once
    what was lost (through `logging.lastResort`: nothing configured logging)."""
    started = time.monotonic()
    baseline = _script("--case", "ok", "--at-exit")
    baseline_s = time.monotonic() - started
    started = time.monotonic()
    stuck = _script("--case", "silent", "--at-exit", "--timeout", str(DEADLINE))
    stuck_s = time.monotonic() - started

    assert baseline.returncode == 0, baseline.stderr
    assert stuck.returncode == 0, stuck.stderr
    assert baseline.stderr == ""
    (line,) = stuck.stderr.splitlines()
    assert line.startswith("telemetry.undelivered: "), line
    assert "could not be delivered" in line
    assert stuck_s - baseline_s < DEADLINE + PROCESS_MARGIN, (stuck_s, baseline_s)


def test_the_exit_hook_says_once_in_our_format_what_was_lost() -> None:
    result = _script("--case", "closed", "--at-exit", "--log", "--timeout", "0.5")

    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    assert [line["event"] for line in lines] == ["telemetry.undelivered"]
    assert lines[0]["spans_not_delivered"] == 1
