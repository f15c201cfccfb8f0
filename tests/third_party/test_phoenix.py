"""What a user sees in a real Arize Phoenix after ``retrieval-stage demo`` (issue 16).

The session's Phoenix server (`tests.phoenix_server`: the ``arize-phoenix`` package in
``.venv-phoenix``, installed by ``tests/phoenix/setup.sh``) runs on loopback, with its own SQLite
working dir, telemetry and outbound requests off. The CLI runs twice as a user runs it, with
``OTEL_EXPORTER_OTLP_ENDPOINT`` at Phoenix: once with the in-process lexical reranker, once with
``--endpoint`` at a local server that answers 500, so the demo falls back to recall order. Then
Phoenix's own REST and GraphQL APIs say where the spans landed and what they carry.
"""

from __future__ import annotations

import http.server
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from retrieval_stage.telemetry.otlp import DEFAULT_SERVICE_NAME as SERVICE_NAME

from ..phoenix_server import INGEST_SECONDS, MISSING, PHOENIX

pytestmark = pytest.mark.phoenix

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "retrieval-stage"
QUERY = "parse a JSON document"
FELL_BACK = "fell back to recall order"
# Generous: a page of 100 spans with their document metrics took over 10 s at load 11 on 2 CPUs.
GRAPHQL_TIMEOUT_S = 120.0
OUTPUT_SCORE = re.compile(r"^reranker\.output_documents\.\d+\.document\.score$")

if not PHOENIX.exists():
    pytest.skip(MISSING, allow_module_level=True)


class _Answer500(http.server.BaseHTTPRequestHandler):
    """A rerank service that fails every request, as a broken TEI would."""

    hits = 0

    def do_POST(self) -> None:
        type(self).hits += 1
        self.rfile.read(int(self.headers.get("content-length", "0")))
        body = b'{"error": "backend exploded", "error_type": "Backend"}'
        self.send_response(500)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: pytest shows failures, not access logs."""


@pytest.fixture(scope="module")
def broken_endpoint() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer500)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@dataclass(frozen=True)
class Run:
    """One CLI run: what it printed and the trace it reported sending."""

    done: subprocess.CompletedProcess[str]
    trace_id: str
    span_count: int


def _demo(phoenix: str, *args: str) -> Run:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RERANK_"))}
    env.pop("RETRIEVAL_STAGE_PROJECT", None)
    env.update(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": phoenix,
            "HF_HUB_OFFLINE": "1",
            "COLUMNS": "200",
            # The script imports this checkout's package, not whichever one the venv installed.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        }
    )
    done = subprocess.run(
        [str(SCRIPT), "demo", "--top-k", "3", "--recall-k", "10", *args, QUERY],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=120,
        check=False,
    )
    said = " ".join(done.stderr.split())  # the line wraps at the terminal's width
    found = re.search(r"spans: (\d+) from this process in trace ([0-9a-f]{32}), sent to OTLP", said)
    assert found, f"no 'spans: N from this process in trace ...' line; stderr:\n{done.stderr}"
    return Run(done, found.group(2), int(found.group(1)))


@dataclass(frozen=True)
class Runs:
    ok: Run
    fallback: Run
    spans: dict[str, list[dict[str, Any]]]  # trace id -> Phoenix's spans of that trace
    stub_hits: int


def _project_spans(phoenix: str, project: str, trace_id: str) -> list[dict[str, Any]]:
    reply = httpx.get(
        f"{phoenix}/v1/projects/{project}/spans",
        params={"trace_id": trace_id, "limit": 1000},
        timeout=10.0,
    )
    if reply.status_code == 404:  # the project does not exist (yet)
        return []
    reply.raise_for_status()
    data: list[dict[str, Any]] = reply.json()["data"]
    return data


@pytest.fixture(scope="module")
def runs(phoenix: str, broken_endpoint: str) -> Runs:
    """The two CLI runs, and their spans once Phoenix has stored all that each run reported."""
    ok = _demo(phoenix, "--reranker", "lexical")
    fallback = _demo(phoenix, "--endpoint", broken_endpoint, "--timeout", "5")
    spans: dict[str, list[dict[str, Any]]] = {}
    deadline = time.monotonic() + INGEST_SECONDS
    for run in (ok, fallback):
        while True:
            spans[run.trace_id] = _project_spans(phoenix, SERVICE_NAME, run.trace_id)
            if len(spans[run.trace_id]) >= run.span_count or time.monotonic() > deadline:
                break
            time.sleep(0.25)
    return Runs(ok, fallback, spans, _Answer500.hits)


def _one(spans: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [s for s in spans if s["span_kind"] == kind]
    assert len(found) == 1, f"expected one {kind} span, got {[s['name'] for s in spans]}"
    return found[0]


def _root(spans: list[dict[str, Any]]) -> dict[str, Any]:
    roots = [s for s in spans if s["parent_id"] is None]
    assert len(roots) == 1, roots
    return roots[0]


def _graphql(phoenix: str, query: str, **variables: Any) -> dict[str, Any]:
    reply = httpx.post(
        f"{phoenix}/graphql",
        json={"query": query, "variables": variables},
        timeout=GRAPHQL_TIMEOUT_S,
    )
    reply.raise_for_status()
    body: dict[str, Any] = reply.json()
    assert "errors" not in body, body["errors"]
    data: dict[str, Any] = body["data"]
    return data


def test_both_runs_exit_as_documented(runs: Runs) -> None:
    assert runs.ok.done.returncode == 0, runs.ok.done.stderr
    assert runs.fallback.done.returncode == 3, runs.fallback.done.stderr
    assert runs.stub_hits >= 1, "the failing run never asked the broken endpoint"


def test_spans_are_in_the_project_named_after_the_service(phoenix: str, runs: Runs) -> None:
    projects = httpx.get(f"{phoenix}/v1/projects", timeout=10.0).json()["data"]
    assert SERVICE_NAME in {p["name"] for p in projects}
    for run in (runs.ok, runs.fallback):
        assert len(runs.spans[run.trace_id]) == run.span_count
        assert _project_spans(phoenix, "default", run.trace_id) == []


def test_reranker_span_shows_the_query_and_the_reranked_scores(runs: Runs) -> None:
    span = _one(runs.spans[runs.ok.trace_id], "RERANKER")
    attributes = span["attributes"]
    assert attributes["input.value"] == QUERY
    assert attributes["input.mime_type"] == "text/plain"
    assert attributes["output.value"]
    # A successful rerank does record scores: the fallback's absence of them below is a difference.
    assert any(OUTPUT_SCORE.match(key) for key in attributes)
    # OK, not "Unset": as OpenInference's own instrumentations end a span that succeeded.
    assert {s["name"]: s["status_code"] for s in runs.spans[runs.ok.trace_id]} == {
        s["name"]: "OK" for s in runs.spans[runs.ok.trace_id]
    }


def test_fallback_span_has_no_output_scores_and_says_it_fell_back(runs: Runs) -> None:
    span = _one(runs.spans[runs.fallback.trace_id], "RERANKER")
    attributes = span["attributes"]
    assert attributes["input.value"] == QUERY
    assert [key for key in attributes if OUTPUT_SCORE.match(key)] == []
    assert span["status_code"] == "ERROR"
    assert span["status_message"].startswith(FELL_BACK), span["status_message"]
    assert attributes["retrieval_stage.fallback"] is True


def test_failing_run_root_chain_is_error(runs: Runs) -> None:
    root = _root(runs.spans[runs.fallback.trace_id])
    assert root["span_kind"] == "CHAIN"
    assert root["status_code"] == "ERROR"
    assert root["status_message"].startswith(FELL_BACK), root["status_message"]
    assert root["attributes"]["retrieval_stage.fallback"] is True


@pytest.mark.parametrize(
    ("condition", "kind"),
    [
        # The filter-bar expressions docs/observability.md gives, as Phoenix evaluates them.
        ("span_kind == 'RERANKER' and status_code == 'ERROR'", "RERANKER"),
        (f"span_kind == 'RERANKER' and '{FELL_BACK}' in status_message", "RERANKER"),
        ("span_kind == 'RERANKER' and retrieval_stage.fallback == True", "RERANKER"),
        ("span_kind == 'CHAIN' and status_code == 'ERROR'", "CHAIN"),
    ],
)
def test_documented_filters_find_only_the_degraded_trace(
    phoenix: str, runs: Runs, condition: str, kind: str
) -> None:
    data = _graphql(
        phoenix,
        """
        query ($name: String!, $condition: String!) {
          getProjectByName(name: $name) {
            spans(first: 100, filterCondition: $condition) {
              edges { node { spanKind context { traceId } } }
            }
          }
        }
        """,
        name=SERVICE_NAME,
        condition=condition,
    )
    nodes = [edge["node"] for edge in data["getProjectByName"]["spans"]["edges"]]
    assert [(n["spanKind"].upper(), n["context"]["traceId"]) for n in nodes] == [
        (kind, runs.fallback.trace_id)
    ]


def test_no_export_error_on_the_terminal(runs: Runs) -> None:
    for run in (runs.ok, runs.fallback):
        assert "Failed to export" not in run.done.stderr, run.done.stderr
        # Phoenix refused metrics (405) and the CLI said so once, in words on its last line.
        said = " ".join(run.done.stderr.split())
        assert said.count("metrics not sent:") == 1, run.done.stderr
        assert "refused them (HTTP 405)" in said
        assert '"telemetry.metrics_disabled"' not in run.done.stderr
