"""What the sections share: the query, the documents, the local server and the providers.

`LocalServer` runs `benchmarks.server` (the loopback rerank server) in a child process;
`candidates` builds the ~300-character passages every section ranks; `traced_provider` and
`sampled_out_provider` are the two sides of every traced / sampled-out ratio. Nothing here
imports the library or the SDK at module level, so `benchmarks.guard` is installed first.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
QUERY = "which passage explains how a cross-encoder reranks retrieved documents"
DOCS = 50
MODEL = "rerank-v3.5"


# -- the local server ---------------------------------------------------------------------------


class LocalServer:
    """`benchmarks.server` in a child process; it exits when we close its stdin."""

    def __init__(self, max_seconds: float) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.server", "--max-seconds", str(max_seconds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if len(line) != 2 or line[0] != "PORT":
            self.stop()
            raise RuntimeError(f"benchmark server did not start (said {line!r})")
        self.url = f"http://127.0.0.1:{int(line[1])}"

    def delayed(self, ms: int) -> str:
        """Base URL whose answers are held back `ms` milliseconds."""
        return f"{self.url}/delay/{ms}"

    def stats(self) -> dict[str, int]:
        import httpx

        counts: dict[str, int] = httpx.get(self.url + "/stats", timeout=5).json()
        return counts

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


# -- documents ----------------------------------------------------------------------------------


def passage(i: int) -> str:
    """A ~300-character passage, different for each i."""
    words = [
        "retrieval",
        "cross",
        "encoder",
        "query",
        "passage",
        "relevance",
        "score",
        "candidate",
        "ranking",
        "model",
        "latency",
        "batch",
        "vector",
        "index",
        "recall",
        "precision",
        "token",
        "context",
        "answer",
        "document",
    ]
    body = " ".join(words[(i * 7 + k * 3) % len(words)] for k in range(40))
    return f"Passage {i}: {body}."[:300]


def candidates(n: int) -> list[Any]:
    from retrieval_stage import Candidate

    return [Candidate(id=f"doc-{i}", text=passage(i), score=1.0 - i / n) for i in range(n)]


# -- tracer providers ---------------------------------------------------------------------------

BSP_SCHEDULE_DELAY_MS = "100"


def traced_provider(server: LocalServer, *, fast: bool = True) -> Any:
    """configure_tracing with its OTLP/HTTP exporter pointed at the server's sink.

    `fast=False` builds the exporter under ``RETRIEVAL_STAGE_FAST_OTLP=0`` (the SDK's own
    encoder); the switch is read when the exporter is built, so it is restored right after.
    The BatchSpanProcessor exports every 100 ms instead of every 5 s, so that within a short
    timed block it works in the background as it does in a long-running service, rather than
    all at the closing `force_flush`. The work per span is the same either way.
    """
    from retrieval_stage.telemetry import configure_tracing, otlp_span_exporter
    from retrieval_stage.telemetry.otlp_exporter import FAST_OTLP_ENV

    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = BSP_SCHEDULE_DELAY_MS
    saved = os.environ.get(FAST_OTLP_ENV)
    os.environ[FAST_OTLP_ENV] = "1" if fast else "0"
    try:
        exporter = otlp_span_exporter(server.url, protocol="http/protobuf")
    finally:
        if saved is None:
            del os.environ[FAST_OTLP_ENV]
        else:
            os.environ[FAST_OTLP_ENV] = saved
    if getattr(exporter, "fast_encoding", False) != fast:
        raise RuntimeError(f"{type(exporter).__name__}: fast encoding is not {fast}")
    return configure_tracing("retrieval-stage-bench", exporter=exporter)


def sampled_out_provider() -> Any:
    """An SDK TracerProvider that samples every span out: non-recording spans."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    return TracerProvider(sampler=ALWAYS_OFF)
