"""The command's telemetry: one bounded exit with the collector down, stuck or refusing
metrics, the Phoenix project, and OTLP settings that cannot work refused as usage errors."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from .test_commands import (
    CANDIDATES,
    invoke,
    run_script,
)

SLOW_MACHINE_MARGIN_S = 4.0
"""Added to a run without a collector: the old exit took 7-11 s, a bounded one ~1 s more."""

SDK_CHATTER = ("Transient error", "Failed to export", "HTTPConnectionPool", "Traceback")


class _PhoenixLike(http.server.BaseHTTPRequestHandler):
    """Takes OTLP traces, answers 405 to metrics (as Arize Phoenix does)."""

    posts: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.posts.append(self.path)
        self.send_response(200 if self.path == "/v1/traces" else 405)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        # Phoenix's REST API: a project by name, with the id its UI pages are under.
        name = self.path.removeprefix("/v1/projects/")
        found = name != self.path and "/" not in name
        body = json.dumps({"data": {"id": "UHJvamVjdDox", "name": name}}).encode()
        self.send_response(200 if found else 404)
        self.send_header("content-length", str(len(body) if found else 0))
        self.end_headers()
        if found:
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def phoenix_like() -> Iterator[tuple[str, list[str]]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _PhoenixLike)
    _PhoenixLike.posts = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _PhoenixLike.posts
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def silent_port() -> Iterator[str]:
    """A port that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def test_metrics_refused_with_405_are_said_once_and_no_sdk_line_reaches_the_terminal(
    phoenix_like: tuple[str, list[str]],
) -> None:
    url, posts = phoenix_like
    result = run_script(
        "demo", "--reranker", "lexical", "--top-k", "3", OTEL_EXPORTER_OTLP_ENDPOINT=url
    )
    assert result.returncode == 0, result.stderr
    assert "telemetry.metrics_disabled" not in result.stderr  # said in words, not as JSON
    assert "{" not in result.stderr
    for chatter in SDK_CHATTER:
        assert chatter not in result.stderr
    assert "/v1/traces" in posts
    assert "/v1/metrics" in posts
    said = " ".join(result.stderr.split())
    refused = f"metrics not sent: {url}/v1/metrics refused them (HTTP 405)"
    page = f"open {url}/projects/UHJvamVjdDox (Phoenix)"
    assert f"sent to OTLP at {url}/v1/traces; {page}; {refused}" in said
    assert said.count("metrics not sent") == 1


def test_log_level_info_still_shows_the_metrics_refusal_as_a_log_line(
    phoenix_like: tuple[str, list[str]],
) -> None:
    url, _ = phoenix_like
    result = run_script(
        "demo", "--reranker", "lexical", "--top-k", "3", "--log-level", "info",
        OTEL_EXPORTER_OTLP_ENDPOINT=url,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("telemetry.metrics_disabled") == 1


def test_metrics_exporter_none_sends_no_metrics(phoenix_like: tuple[str, list[str]]) -> None:
    url, posts = phoenix_like
    result = run_script(
        "demo",
        "--reranker",
        "lexical",
        "--top-k",
        "3",
        OTEL_EXPORTER_OTLP_ENDPOINT=url,
        OTEL_METRICS_EXPORTER="none",
    )
    assert result.returncode == 0, result.stderr
    assert "/v1/traces" in posts
    assert "/v1/metrics" not in posts
    assert "telemetry.metrics_disabled" not in result.stderr


def _timed(*args: str, **env: str) -> tuple[float, str]:
    started = time.monotonic()
    result = run_script(*args, stdin=CANDIDATES, **env)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    return elapsed, result.stderr


@pytest.mark.parametrize("collector", ["closed_port", "silent_port"])
def test_a_collector_down_or_stuck_costs_one_bounded_wait_and_one_line(
    collector: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(collector)
    args = ("rerank", "-q", "rust", "--reranker", "lexical", "--telemetry-timeout", "0.5")
    baseline, _ = _timed(*args)
    elapsed, stderr = _timed(*args, OTEL_EXPORTER_OTLP_ENDPOINT=url)
    assert elapsed < baseline + 0.5 + SLOW_MACHINE_MARGIN_S
    assert "telemetry.undelivered" not in stderr  # the last line says it, once, in words
    for chatter in SDK_CHATTER:
        assert chatter not in stderr
    said = " ".join(stderr.split())
    assert f"OTLP export to {url}/v1/traces failed (1 of 1 spans not delivered)" in said
    assert said.count("not delivered") == 2  # the spans, and the metric points
    assert "metric points not delivered" in said


def test_by_default_a_stuck_collector_costs_at_most_half_a_second_of_waiting(
    silent_port: str,
) -> None:
    from retrieval_stage.cli.options import DEFAULT_TELEMETRY_TIMEOUT_S

    result = run_script(
        "rerank", "-q", "rust", "--reranker", "lexical", "--log-level", "info", stdin=CANDIDATES,
        OTEL_EXPORTER_OTLP_ENDPOINT=silent_port,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    [line] = [x for x in result.stderr.splitlines() if "telemetry.undelivered" in x]
    assert json.loads(line)["timeout_s"] == DEFAULT_TELEMETRY_TIMEOUT_S <= 0.5


def test_project_lands_on_the_resource(tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.jsonl"
    result = invoke(
        "rerank", "-q", "rust", "--reranker", "lexical", "--trace-file", str(trace_file),
        "--project", "my-search", stdin=CANDIDATES,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    record = json.loads(trace_file.read_text().splitlines()[0])
    attributes = {
        a["key"]: a["value"]["stringValue"]
        for a in record["resourceSpans"][0]["resource"]["attributes"]
        if "stringValue" in a["value"]
    }
    assert attributes["openinference.project.name"] == "my-search"
    assert attributes["service.name"] == "retrieval-stage"


def test_project_from_the_environment_and_the_service_name_by_default(tmp_path: Path) -> None:
    def project(**env: str) -> str:
        trace_file = tmp_path / f"trace-{len(env)}.jsonl"
        result = invoke(
            "rerank", "-q", "rust", "--reranker", "lexical", "--trace-file", str(trace_file),
            stdin=CANDIDATES, **env,
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        record = json.loads(trace_file.read_text().splitlines()[0])
        attributes = record["resourceSpans"][0]["resource"]["attributes"]
        return str(
            next(
                a["value"]["stringValue"]
                for a in attributes
                if a["key"] == "openinference.project.name"
            )
        )

    assert project() == "retrieval-stage"
    assert project(RETRIEVAL_STAGE_PROJECT="from-env") == "from-env"


def test_an_unknown_otlp_protocol_is_a_usage_error() -> None:
    result = invoke(
        "rerank", "-q", "rust", "--reranker", "lexical", stdin=CANDIDATES,
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_EXPORTER_OTLP_PROTOCOL="http/json",
    )  # fmt: skip
    assert result.exit_code == 2
    assert "OTLP tracing" in result.output
    assert "http/json" in result.output


def test_grpc_without_the_extra_is_a_usage_error_naming_the_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from retrieval_stage import telemetry
    from retrieval_stage.telemetry.otlp import GRPC_EXTRA_HINT, OtlpExtraMissingError

    def missing(*args: object, **kwargs: object) -> None:
        raise OtlpExtraMissingError(f"OTLP over gRPC (traces) needs grpcio: {GRPC_EXTRA_HINT}")

    monkeypatch.setattr(telemetry, "configure_tracing", missing)
    result = invoke(
        "rerank", "-q", "rust", "--reranker", "lexical", stdin=CANDIDATES,
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
    )  # fmt: skip
    assert result.exit_code == 2
    assert GRPC_EXTRA_HINT in " ".join(result.output.split())


def test_after_a_human_error_no_json_line_repeats_what_was_not_delivered(closed_port: str) -> None:
    result = run_script(
        "rerank", "-q", "rust", "--endpoint", closed_port, stdin=CANDIDATES,
        OTEL_EXPORTER_OTLP_ENDPOINT=closed_port,
    )  # fmt: skip
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"error: rerank failed: could not connect to {closed_port}")
    assert not [line for line in lines if line.lstrip().startswith("{")]
    assert "spans not delivered" in " ".join(result.stderr.split())


def test_spans_sent_to_phoenix_name_the_project_page_to_open(
    phoenix_like: tuple[str, list[str]],
) -> None:
    url, _ = phoenix_like
    result = run_script(
        "rerank", "-q", "rust", "--reranker", "lexical", stdin=CANDIDATES,
        OTEL_EXPORTER_OTLP_ENDPOINT=url,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stderr.split())
    assert f"sent to OTLP at {url}/v1/traces; open {url}/projects/UHJvamVjdDox (Phoenix)" in said


def test_spans_sent_to_a_collector_name_no_phoenix_page() -> None:
    # An OTLP receiver that is not Phoenix: its GETs are 404.
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CollectorLike)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        result = run_script(
            "rerank", "-q", "rust", "--reranker", "lexical", stdin=CANDIDATES,
            OTEL_EXPORTER_OTLP_ENDPOINT=url,
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stderr.split())
    assert f"sent to OTLP at {url}/v1/traces" in said
    assert "Phoenix" not in said


class _CollectorLike(http.server.BaseHTTPRequestHandler):
    """Takes OTLP traces and metrics; any GET is 404, as the Collector's receiver answers."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self.send_response(404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        """Quiet."""
