"""The benchmark: our stage against raw httpx and peer clients, side by side, as ratios.

Run with ``python -m benchmarks`` from the repository root (see benchmarks/README.md). It starts
`benchmarks.server` in a child process on 127.0.0.1 and reports issue 15's targets in one run:

- overhead: sync, 0 ms: the CPU tracing adds per 50-document call in raw httpx calls of CPU
  (fast OTLP encoder, and the SDK's with ``RETRIEVAL_STAGE_FAST_OTLP=0``); wall time traced /
  sampled out at 0, 10 and 20 ms server latency;
- throughput: async calls per second at 64 concurrent behind 20 ms (and 0 ms): the stage
  sampled out vs a raw httpx `AsyncClient` loop, traced vs sampled out;
- peer_tracing: our tracing CPU per call vs openinference-instrumentation-cohere's over the
  cohere SDK, same provider and exporter;
- fanout: 512 texts in batches of 32 behind 20 ms, async client vs raw httpx under the same
  bound; memory: RSS over 10,000 traced async calls;
- context: untraced peer clients (peers) and an in-process CPU breakdown (breakdown).

Variants are interleaved round by round (so drift hits all of them alike); wall and CPU time
(process time: every thread, so the exporter's counts) are kept per round, and ratios are
taken within a round, the median over rounds reported with its range. Every traced block ends
with `force_flush()` inside the timed region, so the exporter's work is charged to tracing.
Nothing here asserts; targets are reported as met or not met.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import guard

ROOT = Path(__file__).resolve().parent.parent
QUERY = "which passage explains how a cross-encoder reranks retrieved documents"
DOCS = 50
MODEL = "rerank-v3.5"


# -- scale --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scale:
    """How many repetitions each section runs; `quick` is a smoke test, not a measurement."""

    overhead_rounds: int = 15
    overhead_calls: int = 60
    latency_rounds: int = 9
    latency_calls: int = 20
    fanout_async_reps: int = 15
    fanout_sync_reps: int = 3
    peer_rounds: int = 9
    peer_calls: int = 30
    throughput_rounds: int = 5
    throughput_rounds_0ms: int = 3  # context only; the target is at 20 ms
    pool_rounds: int = 3
    pool_calls: int = 1024
    throughput_calls: int = 1536  # a multiple of 64
    memory_warmup: int = 1024
    memory_calls: int = 10_000
    breakdown_rounds: int = 9


QUICK = Scale(
    overhead_rounds=3,
    overhead_calls=10,
    latency_rounds=2,
    latency_calls=5,
    fanout_async_reps=3,
    fanout_sync_reps=1,
    peer_rounds=2,
    peer_calls=5,
    throughput_rounds=1,
    throughput_rounds_0ms=1,
    pool_rounds=1,
    pool_calls=256,
    throughput_calls=256,
    memory_warmup=128,
    memory_calls=512,
    breakdown_rounds=2,
)


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


# -- measuring ----------------------------------------------------------------------------------


@dataclass
class Samples:
    """Per-round seconds per call of each variant: wall clock and process CPU (all threads)."""

    wall: dict[str, list[float]]
    cpu: dict[str, list[float]]

    def median_wall(self) -> dict[str, float]:
        return {name: statistics.median(v) for name, v in self.wall.items()}

    def median_cpu(self) -> dict[str, float]:
        return {name: statistics.median(v) for name, v in self.cpu.items()}


def per_round(a: list[float], b: list[float]) -> dict[str, float]:
    """Median, min and max over rounds of a[r] / b[r] (both taken in the same round)."""
    ratios = sorted(x / y for x, y in zip(a, b, strict=True))
    return {"median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1]}


def per_round_extra(on: list[float], off: list[float], unit: list[float]) -> dict[str, float]:
    """Median, min and max over rounds of (on[r] - off[r]) / unit[r]: an added cost in units."""
    ratios = sorted((x - y) / u for x, y, u in zip(on, off, unit, strict=True))
    return {"median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1]}


def interleaved(
    variants: dict[str, Callable[[], object]],
    *,
    rounds: int,
    calls: int,
    after_block: dict[str, Callable[[], object]] | None = None,
) -> Samples:
    """Seconds per call of each variant, per round; variants take turns, order rotating.

    Wall time (`perf_counter`) and CPU time (`process_time`: every thread of this process,
    so the BatchSpanProcessor's exporter thread counts; the server is another process).
    `after_block` runs inside the timed region after a variant's block (a traced variant's
    `force_flush`), so deferred work is charged to the variant that caused it.
    """
    after = after_block or {}
    names = list(variants)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = variants[name]
            gc.collect()
            started, cpu_started = time.perf_counter(), time.process_time()
            for _ in range(calls):
                fn()
            if name in after:
                after[name]()
            cpu[name].append((time.process_time() - cpu_started) / calls)
            wall[name].append((time.perf_counter() - started) / calls)
    return Samples(wall, cpu)


def rss_bytes() -> int:
    """This process's resident set size."""
    try:
        import psutil  # type: ignore[import-untyped]

        return int(psutil.Process().memory_info().rss)
    except ImportError:  # Linux fallback, no extra package
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# -- fixtures -----------------------------------------------------------------------------------


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


BSP_SCHEDULE_DELAY_MS = "100"


def traced_provider(server: LocalServer, *, fast: bool = True) -> Any:
    """configure_tracing with its OTLP/HTTP exporter pointed at the server's sink.

    `fast=False` builds the exporter under ``RETRIEVAL_STAGE_FAST_OTLP=0`` (the SDK's own
    encoder); the switch is read when the exporter is built, so it is restored right after.
    The BatchSpanProcessor exports every 100 ms instead of every 5 s, so that within a short
    timed block it works in the background as it does in a long-running service, rather than
    all at the closing `force_flush`. The work per span is the same either way.
    """
    from retrieval_stage.telemetry.otlp_exporter import FAST_OTLP_ENV
    from retrieval_stage.telemetry import configure_tracing, otlp_span_exporter

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


# -- sections -----------------------------------------------------------------------------------

RAW = "raw httpx"
CLIENT = "RerankClient"
OFF = "stage, sampled out"
ON = "stage, traced (fast OTLP)"
ON_SDK = "stage, traced (RETRIEVAL_STAGE_FAST_OTLP=0)"
ON_LEAN = "stage, traced, output_content=False"
HIDDEN = "stage, traced, documents hidden"
TRACED = (ON, ON_SDK, ON_LEAN, HIDDEN)


def _overhead_at(
    server: LocalServer, delay_ms: int, rounds: int, calls: int, *, full: bool
) -> Samples:
    """Per-round seconds per call (wall and CPU) of raw httpx and our layers, behind `delay_ms`.

    `full` adds the client alone, the stage with output content off and with documents hidden.
    """
    import httpx
    from openinference.instrumentation import TraceConfig

    from retrieval_stage import RerankClient, RerankStage

    base_url = server.delayed(delay_ms) if delay_ms else server.url
    cands = candidates(DOCS)
    texts = [c.text for c in cands]
    raw_http = httpx.Client()
    url = base_url + "/rerank"

    def raw() -> object:
        response = raw_http.post(url, json={"query": QUERY, "texts": texts})
        return json.loads(response.content)

    def stage(provider: Any, **kwargs: Any) -> Any:
        # batch_size=DOCS: one request per call on every side (TEI's own default cap is 32).
        return RerankStage(
            RerankClient(base_url, batch_size=DOCS), tracer_provider=provider, **kwargs
        )

    client = RerankClient(base_url, batch_size=DOCS)
    fast, sdk = traced_provider(server), traced_provider(server, fast=False)
    stage_off, stage_on, stage_sdk = stage(sampled_out_provider()), stage(fast), stage(sdk)
    variants: dict[str, Callable[[], object]] = {
        RAW: raw,
        OFF: lambda: stage_off.run(QUERY, cands),
        ON: lambda: stage_on.run(QUERY, cands),
        ON_SDK: lambda: stage_sdk.run(QUERY, cands),
    }
    flush = {ON: fast.force_flush, ON_SDK: sdk.force_flush}
    if full:
        stage_lean = stage(fast, output_content=False)
        stage_hidden = stage(fast, trace_config=TraceConfig(hide_inputs=True, hide_outputs=True))
        variants[CLIENT] = lambda: client.rerank(QUERY, texts)
        variants[ON_LEAN] = lambda: stage_lean.run(QUERY, cands)
        variants[HIDDEN] = lambda: stage_hidden.run(QUERY, cands)
        flush |= {ON_LEAN: fast.force_flush, HIDDEN: fast.force_flush}
    for fn in variants.values():  # warm connections and caches
        for _ in range(10):
            fn()
    fast.force_flush()
    sdk.force_flush()
    samples = interleaved(variants, rounds=rounds, calls=calls, after_block=flush)
    fast.shutdown()
    sdk.shutdown()
    raw_http.close()
    client.close()
    return samples


def overhead(server: LocalServer, scale: Scale) -> dict[str, Any]:
    """Sync, TEI shape, 50 documents: the CPU tracing costs, and traced / sampled out by latency.

    At 0 ms server latency every variant runs, and CPU time (process time, the exporter's
    thread included) gives tracing's cost in raw httpx calls: per round,
    (CPU traced - CPU sampled out) / CPU raw. At 0, 10 and 20 ms the wall-time ratio traced /
    sampled out is what a caller feels.
    """
    at0 = _overhead_at(server, 0, scale.overhead_rounds, scale.overhead_calls, full=True)
    result: dict[str, Any] = {
        "seconds_per_call": at0.median_wall(),
        "cpu_seconds_per_call": at0.median_cpu(),
        "samples": {"wall": at0.wall, "cpu": at0.cpu},
        "ratio_to_raw": {n: per_round(v, at0.wall[RAW]) for n, v in at0.wall.items()},
        "cpu_ratio_to_raw": {n: per_round(v, at0.cpu[RAW]) for n, v in at0.cpu.items()},
        "tracing_cpu_in_raw_calls": {
            n: per_round_extra(at0.cpu[n], at0.cpu[OFF], at0.cpu[RAW]) for n in TRACED
        },
        "traced_over_sampled_out": {0: {n: per_round(at0.wall[n], at0.wall[OFF]) for n in TRACED}},
    }
    for delay in (10, 20):
        s = _overhead_at(server, delay, scale.latency_rounds, scale.latency_calls, full=False)
        result["traced_over_sampled_out"][delay] = {
            n: per_round(s.wall[n], s.wall[OFF]) for n in (ON, ON_SDK)
        }
        result[f"seconds_per_call_{delay}ms"] = s.median_wall()
        result[f"tracing_cpu_in_raw_calls_{delay}ms"] = {
            n: per_round_extra(s.cpu[n], s.cpu[OFF], s.cpu[RAW]) for n in (ON, ON_SDK)
        }
    return result


def fanout(server: LocalServer, scale: Scale) -> dict[str, Any]:
    """512 texts, batch size 32 (16 requests), 20 ms server delay, max_concurrency 8.

    Beside the ideal, the same 16 requests sent by raw httpx under the same semaphore: the
    ceiling httpx itself allows on this machine.
    """
    import httpx

    from retrieval_stage import AsyncRerankClient, RerankClient

    texts = [passage(i) for i in range(512)]
    base = server.delayed(20)
    batches, delay = math.ceil(512 / 32), 0.020

    async def run_async() -> tuple[list[float], list[float], int]:
        raw_http = httpx.AsyncClient()
        async with AsyncRerankClient(base, batch_size=32) as client:
            bound = client.max_concurrency
            gate = asyncio.Semaphore(bound)

            async def one(a: int) -> object:
                async with gate:
                    body = {"query": QUERY, "texts": texts[a : a + 32]}
                    response = await raw_http.post(base + "/rerank", json=body)
                    return json.loads(response.content)

            async def raw() -> object:
                return await asyncio.gather(*(one(a) for a in range(0, 512, 32)))

            for _ in range(2):
                await client.rerank(QUERY, texts)
                await raw()
            ours, ceiling = [], []
            for _ in range(scale.fanout_async_reps):
                started = time.perf_counter()
                response = await client.rerank_response(QUERY, texts)
                ours.append(time.perf_counter() - started)
                assert response.batches == batches
                assert len(response.results) == 512
                started = time.perf_counter()
                await raw()
                ceiling.append(time.perf_counter() - started)
        await raw_http.aclose()
        return ours, ceiling, bound

    async_times, raw_times, bound = asyncio.run(run_async())
    ideal = math.ceil(batches / bound) * delay
    with RerankClient(base, batch_size=32) as sync_client:
        sync_client.rerank(QUERY, texts)
        sync_times = []
        for _ in range(scale.fanout_sync_reps):
            started = time.perf_counter()
            sync_client.rerank(QUERY, texts)
            sync_times.append(time.perf_counter() - started)
    a, s = statistics.median(async_times), statistics.median(sync_times)
    r = statistics.median(raw_times)
    return {
        "batches": batches,
        "max_concurrency": bound,
        "ideal_seconds": ideal,
        "async_seconds": a,
        "raw_httpx_same_bound_seconds": r,
        "raw_httpx_efficiency": ideal / r,
        "async_over_raw_httpx": a / r,
        "sync_seconds": s,
        "async_efficiency": ideal / a,
        "sync_efficiency_vs_sequential_ideal": batches * delay / s,
        "sync_over_async": s / a,
    }


def peers(server: LocalServer, scale: Scale) -> dict[str, Any]:
    """Cohere-shaped (and TEI-shaped) calls of 50 documents by each peer, untraced, vs ours."""
    from retrieval_stage import RerankClient, RerankStage

    cands = candidates(DOCS)
    texts = [c.text for c in cands]
    traced = traced_provider(server)
    ours_cohere = RerankStage(
        RerankClient(server.url, provider="cohere", model=MODEL, api_key="bench-key"),
        tracer_provider=traced,
    )
    ours_tei = RerankStage(RerankClient(server.url, batch_size=DOCS), tracer_provider=traced)
    ours_off = RerankStage(
        RerankClient(server.url, provider="cohere", model=MODEL, api_key="bench-key"),
        tracer_provider=sampled_out_provider(),
    )
    variants: dict[str, Callable[[], object]] = {
        "ours: RerankStage traced, Cohere shape": lambda: ours_cohere.run(QUERY, cands),
        "ours: RerankStage traced, TEI shape": lambda: ours_tei.run(QUERY, cands),
        "ours: RerankStage sampled out, Cohere shape": lambda: ours_off.run(QUERY, cands),
    }
    notes: dict[str, str] = {}
    shape: dict[str, str] = {}

    try:
        import cohere

        co = cohere.ClientV2(api_key="bench-key", base_url=server.url, timeout=30)
        variants["cohere ClientV2.rerank"] = lambda: co.rerank(
            model=MODEL, query=QUERY, documents=texts
        )
        shape["cohere ClientV2.rerank"] = "cohere"
        notes["cohere ClientV2.rerank"] = f"cohere {cohere.__version__}, base_url=<local>"
    except ImportError as exc:
        notes["cohere ClientV2.rerank"] = f"not installed: {exc}"

    try:
        from importlib.metadata import version

        from rerankers import Reranker  # type: ignore[import-untyped]

        ranker = Reranker(
            MODEL,
            model_type="APIRanker",
            api_provider="cohere",
            api_key="bench-key",
            url=server.url + "/v2/rerank",
            verbose=0,
        )
        variants["rerankers APIRanker (cohere)"] = lambda: ranker.rank(QUERY, texts)
        shape["rerankers APIRanker (cohere)"] = "cohere"
        notes["rerankers APIRanker (cohere)"] = (
            f"rerankers {version('rerankers')}, url=<local>/v2/rerank"
        )
    except ImportError as exc:
        notes["rerankers APIRanker (cohere)"] = f"not installed: {exc}"

    try:
        from importlib.metadata import version

        from langchain_cohere import CohereRerank
        from langchain_core.documents import Document
        from pydantic import SecretStr

        lc = CohereRerank(
            model=MODEL, cohere_api_key=SecretStr("bench-key"), base_url=server.url, top_n=DOCS
        )
        lc_docs = [
            Document(page_content=t, metadata={"id": c.id})
            for t, c in zip(texts, cands, strict=False)
        ]
        variants["langchain-cohere CohereRerank"] = lambda: lc.compress_documents(lc_docs, QUERY)
        shape["langchain-cohere CohereRerank"] = "cohere"
        notes["langchain-cohere CohereRerank"] = (
            f"langchain-cohere {version('langchain-cohere')}, compress_documents, top_n=50"
        )
    except ImportError as exc:
        notes["langchain-cohere CohereRerank"] = f"not installed: {exc}"

    try:
        from importlib.metadata import version

        from llama_index.core.schema import NodeWithScore, TextNode
        from llama_index.postprocessor.tei_rerank import (  # type: ignore[import-untyped]
            TextEmbeddingInference,
        )

        li = TextEmbeddingInference(base_url=server.url, top_n=DOCS)
        nodes = [NodeWithScore(node=TextNode(text=c.text, id_=c.id), score=c.score) for c in cands]
        name = "llama-index TextEmbeddingInference (TEI)"
        variants[name] = lambda: li.postprocess_nodes(nodes, query_str=QUERY)
        shape[name] = "tei"
        notes[name] = (
            f"llama-index-postprocessor-tei-rerank "
            f"{version('llama-index-postprocessor-tei-rerank')}, postprocess_nodes"
        )
    except ImportError as exc:
        notes["llama-index TextEmbeddingInference (TEI)"] = f"not installed: {exc}"

    for fn in variants.values():
        for _ in range(10):
            fn()
    traced.force_flush()
    flush = traced.force_flush
    t = interleaved(
        variants,
        rounds=scale.peer_rounds,
        calls=scale.peer_calls,
        after_block={
            "ours: RerankStage traced, Cohere shape": flush,
            "ours: RerankStage traced, TEI shape": flush,
        },
    ).median_wall()
    traced.shutdown()
    reference = {
        "cohere": t["ours: RerankStage traced, Cohere shape"],
        "tei": t["ours: RerankStage traced, TEI shape"],
    }
    untraced = t["ours: RerankStage sampled out, Cohere shape"]
    return {
        "seconds_per_call": t,
        "peer_over_ours_traced": {name: t[name] / reference[s] for name, s in shape.items()},
        "peer_over_ours_sampled_out": {
            name: t[name] / untraced for name, s in shape.items() if s == "cohere"
        },
        "shape": shape,
        "notes": notes,
    }


OURS_OFF = "ours: stage sampled out (Cohere shape)"
OURS_ON = "ours: stage traced (Cohere shape)"
CO_OFF = "cohere ClientV2.rerank, uninstrumented"
CO_ON = "cohere ClientV2.rerank + openinference-instrumentation-cohere"


def _their_span(co: Any, texts: list[str]) -> tuple[int, int]:
    """Attributes and OTLP bytes of one openinference-instrumentation-cohere rerank span."""
    from openinference.instrumentation.cohere import CohereInstrumentor
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from retrieval_stage.telemetry.otlp_encoder import encode_spans_fast
    from retrieval_stage.telemetry import DEFAULT_SPAN_ATTRIBUTE_LIMIT

    exporter = InMemorySpanExporter()  # configure_tracing's limits, so nothing is evicted
    provider = TracerProvider(
        span_limits=SpanLimits(max_span_attributes=DEFAULT_SPAN_ATTRIBUTE_LIMIT)
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = CohereInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        co.rerank(model=MODEL, query=QUERY, documents=texts)
    finally:
        instrumentor.uninstrument()
    spans = exporter.get_finished_spans()
    if len(spans) != 1:
        raise RuntimeError(f"the cohere instrumentor made {len(spans)} spans, not 1")
    return len(spans[0].attributes or {}), len(encode_spans_fast(spans))


def peer_tracing(server: LocalServer, scale: Scale) -> dict[str, Any]:
    """Our tracing's CPU per call against openinference-instrumentation-cohere's.

    Same 50 documents, same server (Cohere v2 shape), same provider: configure_tracing's
    BatchSpanProcessor and fast OTLP/HTTP exporter. Each side's tracing cost is its traced CPU
    minus its untraced CPU, per round: ours sampled out; theirs the cohere SDK's own `rerank`
    with the instrumentor's wrapper bypassed (`__wrapped__`).
    """
    try:
        import cohere
        from openinference.instrumentation.cohere import CohereInstrumentor
    except ImportError as exc:
        return {"skipped": f"not installed: {exc}"}
    from importlib.metadata import version

    from retrieval_stage import RerankClient, RerankStage

    cands = candidates(DOCS)
    texts = [c.text for c in cands]
    co = cohere.ClientV2(api_key="bench-key", base_url=server.url, timeout=30)
    their_attributes, their_bytes = _their_span(co, texts)
    traced = traced_provider(server)

    def ours(provider: Any) -> Any:
        client = RerankClient(server.url, provider="cohere", model=MODEL, api_key="bench-key")
        return RerankStage(client, tracer_provider=provider)

    ours_off, ours_on = ours(sampled_out_provider()), ours(traced)
    instrumentor = CohereInstrumentor()
    instrumentor.instrument(tracer_provider=traced)
    try:
        # the SDK's own method, past the instrumentor's wrapper
        untraced: Any = getattr(co.rerank, "__wrapped__")  # noqa: B009
        variants: dict[str, Callable[[], object]] = {
            OURS_OFF: lambda: ours_off.run(QUERY, cands),
            OURS_ON: lambda: ours_on.run(QUERY, cands),
            CO_OFF: lambda: untraced(model=MODEL, query=QUERY, documents=texts),
            CO_ON: lambda: co.rerank(model=MODEL, query=QUERY, documents=texts),
        }
        for fn in variants.values():
            for _ in range(10):
                fn()
        traced.force_flush()
        s = interleaved(
            variants,
            rounds=scale.peer_rounds,
            calls=scale.peer_calls,
            after_block={OURS_ON: traced.force_flush, CO_ON: traced.force_flush},
        )
    finally:
        instrumentor.uninstrument()
        traced.shutdown()
    ours_cost = [on - off for on, off in zip(s.cpu[OURS_ON], s.cpu[OURS_OFF], strict=True)]
    their_cost = [on - off for on, off in zip(s.cpu[CO_ON], s.cpu[CO_OFF], strict=True)]
    wall_ours = [on - off for on, off in zip(s.wall[OURS_ON], s.wall[OURS_OFF], strict=True)]
    wall_theirs = [on - off for on, off in zip(s.wall[CO_ON], s.wall[CO_OFF], strict=True)]
    return {
        "cpu_seconds_per_call": s.median_cpu(),
        "seconds_per_call": s.median_wall(),
        "tracing_cpu_us": {
            "ours": statistics.median(ours_cost) * 1e6,
            "theirs": statistics.median(their_cost) * 1e6,
        },
        "ours_over_theirs_cpu": per_round(ours_cost, their_cost),
        "ours_over_theirs_wall": per_round(wall_ours, wall_theirs),
        "their_attributes_per_span": their_attributes,
        "their_otlp_bytes_per_span": their_bytes,
        "versions": {
            "cohere": cohere.__version__,
            "openinference-instrumentation-cohere": version("openinference-instrumentation-cohere"),
        },
    }


async def _drive(fn: Callable[[], Awaitable[object]], calls: int, concurrency: int) -> float:
    """Calls per second with `concurrency` workers looping on `fn`."""
    per_worker = calls // concurrency

    async def worker() -> None:
        for _ in range(per_worker):
            await fn()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return per_worker * concurrency / (time.perf_counter() - started)


T_RAW = "raw httpx AsyncClient"
T_OFF = "RerankStage.arun, sampled out"
T_ON = "RerankStage.arun, traced (fast OTLP)"


def _throughput_at(
    server: LocalServer, scale: Scale, delay_ms: int, concurrency: int, rounds: int
) -> dict[str, dict[str, list[float]]]:
    """Per-round calls per second and CPU seconds per call of each variant behind `delay_ms`."""
    import httpx

    from retrieval_stage import AsyncRerankClient, RerankStage

    cands = candidates(DOCS)
    texts = [c.text for c in cands]
    base_url = server.delayed(delay_ms) if delay_ms else server.url
    traced = traced_provider(server)

    async def main() -> dict[str, dict[str, list[float]]]:
        raw_http = httpx.AsyncClient()
        url = base_url + "/rerank"
        stats_http = httpx.AsyncClient()  # its own connection, opened once

        async def stats() -> dict[str, int]:
            counts: dict[str, int] = (await stats_http.get(server.url + "/stats")).json()
            return counts

        async def raw() -> object:
            response = await raw_http.post(url, json={"query": QUERY, "texts": texts})
            return json.loads(response.content)

        on = RerankStage(AsyncRerankClient(base_url, batch_size=DOCS), tracer_provider=traced)
        off = RerankStage(
            AsyncRerankClient(base_url, batch_size=DOCS), tracer_provider=sampled_out_provider()
        )
        variants: dict[str, Callable[[], Awaitable[object]]] = {
            T_RAW: raw,
            T_OFF: lambda: off.arun(QUERY, cands),
            T_ON: lambda: on.arun(QUERY, cands),
        }
        for fn in variants.values():
            await _drive(fn, concurrency * 4, concurrency)
        traced.force_flush()
        rates: dict[str, list[float]] = {name: [] for name in variants}
        cpu: dict[str, list[float]] = {name: [] for name in variants}
        opened: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        calls = scale.throughput_calls // concurrency * concurrency
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                gc.collect()
                connections = (await stats())["connections"]
                started, cpu_started = time.perf_counter(), time.process_time()
                await _drive(variants[name], calls, concurrency)
                if name == T_ON:
                    traced.force_flush()
                cpu[name].append((time.process_time() - cpu_started) / calls)
                rates[name].append(calls / (time.perf_counter() - started))
                opened[name].append(((await stats())["connections"] - connections) / calls)
        await raw_http.aclose()
        await stats_http.aclose()
        return {"calls_per_second": rates, "cpu_seconds_per_call": cpu, "new_connections": opened}

    samples = asyncio.run(main())
    traced.shutdown()
    return samples


def throughput(server: LocalServer, scale: Scale, concurrency: int = 64) -> dict[str, Any]:
    """Async calls per second at 64 concurrency, 20 ms server latency (and 0 ms for context).

    Every variant gets httpx's default pool limits (the client's default too). Ratios are taken
    round by round (each round runs every variant once, back to back), median and range
    reported, because httpx's own rate at this concurrency swings between runs. CPU per call
    (process time, the exporter's thread included) says whether a variant is CPU-bound.
    """
    result: dict[str, Any] = {"concurrency": concurrency}
    for delay, rounds in ((20, scale.throughput_rounds), (0, scale.throughput_rounds_0ms)):
        s = _throughput_at(server, scale, delay, concurrency, rounds)
        rates, cpu = s["calls_per_second"], s["cpu_seconds_per_call"]
        result[f"{delay}ms"] = {
            "samples": s,
            "calls_per_second": {n: statistics.median(v) for n, v in rates.items()},
            "cpu_us_per_call": {n: statistics.median(v) * 1e6 for n, v in cpu.items()},
            "new_connections_per_call": {
                n: statistics.median(v) for n, v in s["new_connections"].items()
            },
            "sampled_out_over_raw": per_round(rates[T_OFF], rates[T_RAW]),
            "traced_over_sampled_out": per_round(rates[T_ON], rates[T_OFF]),
            "traced_over_raw": per_round(rates[T_ON], rates[T_RAW]),
        }
    return result


POOL_LIMITS = {"httpx default (20 kept idle)": 20, "64 kept idle": 64}


def pool(server: LocalServer, scale: Scale, concurrency: int = 64) -> dict[str, Any]:
    """Raw httpx at 64 concurrent behind 20 ms: the default pool against one keeping 64 idle.

    With 20 kept idle, answers arriving in waves of 64 close the surplus and the next wave
    reconnects; keeping 64 idle stops that, but httpcore then scans more connections (each a
    socket readability check) for every request. CPU per call and new TCP connections per call
    say which costs more; this is why every throughput variant keeps httpx's default.
    """
    import httpx

    texts = [c.text for c in candidates(DOCS)]
    url = server.delayed(20) + "/rerank"

    async def main() -> dict[str, dict[str, list[float]]]:
        stats_http = httpx.AsyncClient()
        clients = {
            name: httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=idle))
            for name, idle in POOL_LIMITS.items()
        }
        out: dict[str, dict[str, list[float]]] = {
            name: {"calls_per_second": [], "cpu_us_per_call": [], "new_connections_per_call": []}
            for name in clients
        }

        def caller(client: httpx.AsyncClient) -> Callable[[], Awaitable[object]]:
            async def call() -> object:
                response = await client.post(url, json={"query": QUERY, "texts": texts})
                return json.loads(response.content)

            return call

        async def opened() -> int:
            count: int = (await stats_http.get(server.url + "/stats")).json()["connections"]
            return count

        for client in clients.values():
            await _drive(caller(client), concurrency * 4, concurrency)
        calls = scale.pool_calls // concurrency * concurrency
        for _ in range(scale.pool_rounds):
            for name, client in clients.items():
                gc.collect()
                before, cpu = await opened(), time.process_time()
                rate = await _drive(caller(client), calls, concurrency)
                out[name]["cpu_us_per_call"].append((time.process_time() - cpu) / calls * 1e6)
                out[name]["calls_per_second"].append(rate)
                out[name]["new_connections_per_call"].append((await opened() - before) / calls)
        for client in (*clients.values(), stats_http):
            await client.aclose()
        return out

    samples = asyncio.run(main())
    return {
        "samples": samples,
        "median": {
            name: {key: statistics.median(v) for key, v in values.items()}
            for name, values in samples.items()
        },
    }


def _pool_rows(p: dict[str, Any]) -> list[Row]:
    return [
        (
            f"raw httpx @64, 20 ms, {name}: calls/s, CPU us/call, new connections/call",
            f"{m['calls_per_second']:.0f}, {m['cpu_us_per_call']:.0f}, "
            f"{m['new_connections_per_call']:.2f}",
            "(context)",
            "",
        )
        for name, m in p["median"].items()
    ]


def memory(server: LocalServer, scale: Scale, concurrency: int = 64) -> dict[str, Any]:
    """RSS over 10,000 traced async stage calls, after a warm-up at the same load.

    Read after every slice of 1,024 calls (spans flushed, `gc.collect()` first), so that
    "flat" can be told from "grew a little once": the growth over the second half of the run
    is reported beside the growth over all of it.
    """
    from retrieval_stage import AsyncRerankClient, RerankStage

    cands = candidates(DOCS)
    traced = traced_provider(server)

    async def main() -> tuple[int, int, list[tuple[int, int]]]:
        before_warmup = rss_bytes()
        stage = RerankStage(AsyncRerankClient(server.url, batch_size=DOCS), tracer_provider=traced)

        async def call() -> object:
            return await stage.arun(QUERY, cands)

        await _drive(call, scale.memory_warmup, concurrency)
        traced.force_flush()
        gc.collect()
        after_warmup = rss_bytes()
        done, readings = 0, [(0, after_warmup)]
        while done < scale.memory_calls:  # in slices, flushing, like a steady service
            step = min(1024, scale.memory_calls - done)
            await _drive(call, step, min(concurrency, step))
            done += step
            traced.force_flush()
            gc.collect()
            readings.append((done, rss_bytes()))
        return before_warmup, after_warmup, readings

    cold, warm, readings = asyncio.run(main())
    traced.shutdown()
    mib = 1024 * 1024
    end = readings[-1][1]
    half = min(readings, key=lambda r: abs(r[0] - scale.memory_calls / 2))
    return {
        "calls": scale.memory_calls,
        "rss_growth_mib": (end - warm) / mib,
        "rss_growth_second_half_mib": (end - half[1]) / mib,
        "second_half_from_call": half[0],
        "rss_growth_from_cold_mib": (end - cold) / mib,
        "rss_end_mib": end / mib,
        "rss_readings_mib": [(n, rss / mib) for n, rss in readings],
    }


SDK_ENCODE = "OTLP encoding per span, SDK encode_spans + SerializePartialToString"
FAST_ENCODE = "OTLP encoding per span, our encode_spans_fast"


def breakdown(server: LocalServer, scale: Scale) -> dict[str, Any]:
    """Where a traced call's extra time goes, per 50-document call, measured in-process.

    The stage runs over an in-memory reranker (no HTTP) so that only its own work is timed:
    sampled out, and recording on an SDK provider with no processor; then our document
    attributes alone, and the OTLP protobuf encoding of the finished spans by the SDK's
    encoder and by ours. CPU time (process time) per call.
    """
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from retrieval_stage import RerankStage
    from retrieval_stage.models import Reranked, RerankResponse
    from retrieval_stage.telemetry.otlp_encoder import encode_spans_fast, sdk_serialize_spans
    from retrieval_stage.spans import document_attributes
    from retrieval_stage.stage import map_results
    from retrieval_stage.telemetry import DEFAULT_SPAN_ATTRIBUTE_LIMIT

    cands = candidates(DOCS)
    scored = [(c, 1.0 - ((i * 7919) % DOCS) / DOCS) for i, c in enumerate(cands)]

    class InMemory:
        """A reranker answering at once, shaped like our clients."""

        model_name = MODEL
        provider = "tei"

        def rerank(self, query: str, items: Any, **_: Any) -> Any:
            return list(scored)

        def rerank_response(self, query: str, items: Any, **_: Any) -> Any:
            return RerankResponse(results=list(scored), requests=1, batches=1)

    limits = SpanLimits(max_span_attributes=DEFAULT_SPAN_ATTRIBUTE_LIMIT)
    recording = TracerProvider(span_limits=limits)
    memory_exporter = InMemorySpanExporter()
    collecting = TracerProvider(span_limits=limits)
    collecting.add_span_processor(SimpleSpanProcessor(memory_exporter))
    off = RerankStage(InMemory(), tracer_provider=sampled_out_provider())
    on = RerankStage(InMemory(), tracer_provider=recording)
    outputs = [Reranked(cands[i], score, i) for i, score in map_results(cands, scored)]
    span = recording.get_tracer("bench").start_span("rerank")
    config = on.trace_config
    for _ in range(10):
        RerankStage(InMemory(), tracer_provider=collecting).run(QUERY, cands)
    finished = list(memory_exporter.get_finished_spans())
    per_span = 1.0 / len(finished)
    variants: dict[str, Callable[[], object]] = {
        "stage, sampled out (own work)": lambda: off.run(QUERY, cands),
        "stage, recording, no processor (own work + SDK attributes)": lambda: on.run(QUERY, cands),
        "document_attributes (ours)": lambda: document_attributes(
            span, cands, outputs, config=config, max_content_length=2000
        ),
        "document_attributes, output_content=False (ours)": lambda: document_attributes(
            span, cands, outputs, config=config, max_content_length=2000, output_content=False
        ),
        SDK_ENCODE: lambda: sdk_serialize_spans(finished),
        FAST_ENCODE: lambda: encode_spans_fast(finished),
    }
    t = interleaved(variants, rounds=scale.breakdown_rounds, calls=20).median_cpu()
    t[SDK_ENCODE] *= per_span
    t[FAST_ENCODE] *= per_span
    span.end()
    collecting.shutdown()
    return {
        "cpu_seconds_per_call": t,
        "attributes_per_span": len(finished[0].attributes or {}),
        "otlp_bytes_per_span": len(encode_spans_fast(finished)) * per_span,
        "fast_equals_sdk": encode_spans_fast(finished) == sdk_serialize_spans(finished),
    }


# -- report -------------------------------------------------------------------------------------


def machine() -> dict[str, str]:
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpus": str(os.cpu_count()),
        "cpu_model": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


Row = tuple[str, str, str, str]


def _r(x: dict[str, float], digits: int = 2, suffix: str = "x") -> str:
    """A per-round ratio as 'median (rounds min-max)'."""
    return f"{x['median']:.{digits}f}{suffix} (rounds {x['min']:.{digits}f}-{x['max']:.{digits}f})"


def _target_rows(results: dict[str, Any]) -> list[Row]:
    """The issue's targets, one row each, in the order the issue lists them."""
    rows: list[Row] = []
    o = results.get("overhead")
    if o:
        cost = o["tracing_cpu_in_raw_calls"][ON]
        raw_us = o["cpu_seconds_per_call"][RAW] * 1e6
        rows.append(
            (
                f"(a) tracing CPU per traced 50-document call, exported (BSP + fast OTLP/HTTP), "
                f"in raw httpx calls of CPU (1 = {raw_us:.0f} us)",
                _r(o["tracing_cpu_in_raw_calls"][ON], suffix=""),
                "<= 0.50",
                verdict(cost["median"] <= 0.5),
            )
        )
        for delay, limit in ((0, 1.5), (10, 1.03), (20, 1.02)):
            ratio = o["traced_over_sampled_out"][delay][ON]
            rows.append(
                (
                    f"(b) wall time traced / sampled out, {delay} ms server latency",
                    _r(ratio, 3 if delay else 2),
                    f"<= {limit}x",
                    verdict(ratio["median"] <= limit),
                )
            )
    t = results.get("throughput")
    if t:
        at20 = t["20ms"]
        off, on = at20["sampled_out_over_raw"], at20["traced_over_sampled_out"]
        rows += [
            (
                f"(c) throughput @{t['concurrency']}, 20 ms: stage sampled out / raw httpx "
                "AsyncClient loop",
                _r(off, 3),
                ">= 0.80x",
                verdict(off["median"] >= 0.8),
            ),
            (
                f"(c) throughput @{t['concurrency']}, 20 ms: stage traced / stage sampled out",
                _r(on, 3),
                ">= 0.90x",
                verdict(on["median"] >= 0.9),
            ),
        ]
    p = results.get("peer_tracing")
    if p and "skipped" not in p:
        ratio = p["ours_over_theirs_cpu"]
        us = p["tracing_cpu_us"]
        rows.append(
            (
                "(d) tracing CPU per call, ours / openinference-instrumentation-cohere over "
                f"cohere ClientV2.rerank ({us['ours']:.0f} us / {us['theirs']:.0f} us)",
                _r(ratio),
                "<= 0.25x",
                verdict(ratio["median"] <= 0.25),
            )
        )
    f = results.get("fanout")
    if f:
        rows.append(
            (
                f"(e) fan-out 512 texts / 32 per batch, 20 ms, bound {f['max_concurrency']}: "
                "async client wall / raw httpx under the same semaphore",
                f"{f['async_over_raw_httpx']:.3f}x",
                "<= 1.05x",
                verdict(f["async_over_raw_httpx"] <= 1.05),
            )
        )
    m = results.get("memory")
    if m:
        growth = m["rss_growth_mib"] * 1.048576
        second = m["rss_growth_second_half_mib"] * 1.048576
        rows.append(
            (
                f"(e) memory: RSS growth over {m['calls']:,} traced async calls after warm-up "
                f"(over the last {m['calls'] - m['second_half_from_call']:,}: {second:.1f} MB)",
                f"{growth:.1f} MB",
                "< 20 MB",
                verdict(growth < 20),
            )
        )
    return rows


def _overhead_rows(o: dict[str, Any]) -> list[Row]:
    cpu, wall = o["cpu_ratio_to_raw"], o["ratio_to_raw"]
    rows: list[Row] = []
    for name in (CLIENT, OFF, ON, ON_SDK, ON_LEAN, HIDDEN):
        rows.append(
            (f"0 ms, {name} / raw httpx: wall, CPU", f"{_r(wall[name])}, {_r(cpu[name])}", "", "")
        )
    for name in (ON_SDK, ON_LEAN, HIDDEN):
        rows.append(
            (
                f"tracing CPU in raw httpx calls, {name}",
                _r(o["tracing_cpu_in_raw_calls"][name], suffix=""),
                "(context)",
                "",
            )
        )
    for delay in (10, 20):
        rows.append(
            (
                f"tracing CPU in raw httpx calls at {delay} ms, fast / SDK encoder",
                f"{o[f'tracing_cpu_in_raw_calls_{delay}ms'][ON]['median']:.2f} / "
                f"{o[f'tracing_cpu_in_raw_calls_{delay}ms'][ON_SDK]['median']:.2f}",
                "(context)",
                "",
            )
        )
    for delay in (0, 10, 20):
        rows.append(
            (
                f"wall time traced / sampled out at {delay} ms, RETRIEVAL_STAGE_FAST_OTLP=0",
                _r(o["traced_over_sampled_out"][delay][ON_SDK], 3),
                "(context)",
                "",
            )
        )
    return rows


def _fanout_rows(f: dict[str, Any]) -> list[Row]:
    return [
        (
            f"fan-out: ideal / async wall (ideal = ceil(16/{f['max_concurrency']}) x 20 ms)",
            f"{f['async_efficiency']:.2f}",
            "(context)",
            "",
        ),
        (
            "fan-out: ideal / raw httpx wall, same 16 requests under the same semaphore",
            f"{f['raw_httpx_efficiency']:.2f}",
            "(ceiling)",
            "",
        ),
        ("fan-out: sync client wall / async client wall", f"{f['sync_over_async']:.1f}x", "", ""),
    ]


def _peer_tracing_rows(p: dict[str, Any]) -> list[Row]:
    if "skipped" in p:
        return [("traced peer (openinference-instrumentation-cohere)", p["skipped"], "", "")]
    cpu = p["cpu_seconds_per_call"]
    return [
        (
            f"traced peer, CPU per call: {name}",
            f"{cpu[name] * 1e6:.0f} us",
            "(context)",
            "",
        )
        for name in (OURS_OFF, OURS_ON, CO_OFF, CO_ON)
    ] + [
        (
            "traced peer: tracing wall time per call, ours / theirs",
            _r(p["ours_over_theirs_wall"]),
            "(context)",
            "",
        ),
        (
            "traced peer: attributes / OTLP bytes per span, theirs (ours: see breakdown)",
            f"{p['their_attributes_per_span']} / {p['their_otlp_bytes_per_span'] / 1024:.0f} KiB",
            "(context)",
            "",
        ),
    ]


def _peer_rows(p: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for name, ratio in p["peer_over_ours_traced"].items():
        rows.append(
            (f"{name} untraced / ours traced ({p['shape'][name]} shape)", f"{ratio:.2f}x", "", "")
        )
    for name, ratio in p["peer_over_ours_sampled_out"].items():
        rows.append((f"{name} untraced / ours sampled out", f"{ratio:.2f}x", "", ""))
    return rows


def _throughput_rows(t: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for delay in ("20ms", "0ms"):
        d = t[delay]
        rates, cpu = d["calls_per_second"], d["cpu_us_per_call"]
        rows.append(
            (
                f"throughput @{t['concurrency']}, {delay}: calls/s raw, sampled out, traced",
                " / ".join(f"{rates[n]:.0f}" for n in (T_RAW, T_OFF, T_ON)),
                "(context)",
                "",
            )
        )
        rows.append(
            (
                f"throughput @{t['concurrency']}, {delay}: CPU us/call raw, sampled out, traced",
                " / ".join(f"{cpu[n]:.0f}" for n in (T_RAW, T_OFF, T_ON)),
                "(context)",
                "",
            )
        )
        opened = d["new_connections_per_call"]
        rows.append(
            (
                f"throughput @{t['concurrency']}, {delay}: new TCP connections per call "
                "(httpx keeps 20 idle), raw, sampled out, traced",
                " / ".join(f"{opened[n]:.2f}" for n in (T_RAW, T_OFF, T_ON)),
                "(context)",
                "",
            )
        )
        if delay == "0ms":
            rows.append(
                (
                    f"throughput @{t['concurrency']}, 0 ms: "
                    "sampled out / raw; traced / sampled out",
                    f"{_r(d['sampled_out_over_raw'])}; {_r(d['traced_over_sampled_out'])}",
                    "(context)",
                    "",
                )
            )
    return rows


def _breakdown_rows(b: dict[str, Any], raw_cpu: float | None) -> list[Row]:
    rows: list[Row] = []
    for name, seconds in b["cpu_seconds_per_call"].items():
        share = f" = {seconds / raw_cpu:.2f} raw calls" if raw_cpu else ""
        rows.append((f"breakdown (CPU): {name}", f"{seconds * 1e6:.0f} us{share}", "", ""))
    rows.append(
        (
            "breakdown: attributes / OTLP bytes per 50-document span; fast bytes == SDK bytes",
            f"{b['attributes_per_span']} / {b['otlp_bytes_per_span'] / 1024:.0f} KiB; "
            f"{b['fast_equals_sdk']}",
            "",
            "",
        )
    )
    return rows


def _markdown(rows: list[Row]) -> str:
    lines = ["| measure | result | target | |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines)


def table(results: dict[str, Any]) -> str:
    """The issue's targets first, then every other figure, as Markdown tables."""
    builders: dict[str, Callable[[dict[str, Any]], list[Row]]] = {
        "overhead": _overhead_rows,
        "throughput": _throughput_rows,
        "pool": _pool_rows,
        "peer_tracing": _peer_tracing_rows,
        "fanout": _fanout_rows,
        "peers": _peer_rows,
    }
    rows: list[Row] = []
    for name, build in builders.items():
        if name in results:
            rows += build(results[name])
    if "breakdown" in results:
        raw = results.get("overhead", {}).get("cpu_seconds_per_call", {}).get(RAW)
        rows += _breakdown_rows(results["breakdown"], raw)
    loads = ", ".join(
        f"{name} {load:.2f}" for name, load in results.get("section_load", {}).items()
    )
    return (
        "Targets (issue 15), ratios per interleaved round: median (range)\n\n"
        + _markdown(_target_rows(results))
        + f"\n\nEverything else\n\n{_markdown(rows)}\n\n"
        + f"1-minute load average at each section's start: {loads}"
    )


SECTIONS: dict[str, Callable[[LocalServer, Scale], dict[str, Any]]] = {
    "overhead": overhead,
    "throughput": throughput,
    "pool": pool,
    "peer_tracing": peer_tracing,
    "fanout": fanout,
    "memory": memory,
    "peers": peers,
    "breakdown": breakdown,
}


def main(argv: list[str] | None = None) -> int:
    """Command line: run the sections, print the table, optionally write JSON."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run, not a measurement")
    parser.add_argument("--only", action="append", choices=sorted(SECTIONS), help="repeatable")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args(argv)
    guard.install()
    scale = QUICK if args.quick else Scale()
    chosen = args.only or list(SECTIONS)
    results: dict[str, Any] = {"machine": machine(), "scale": scale.__dict__}
    results["load_average_before"] = os.getloadavg()
    server = LocalServer(max_seconds=900)
    started = time.perf_counter()
    try:
        for name in chosen:
            t0 = time.perf_counter()
            print(f"-- {name} ...", file=sys.stderr, flush=True)
            results.setdefault("section_load", {})[name] = os.getloadavg()[0]
            results[name] = SECTIONS[name](server, scale)
            print(f"   {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
        results["server_requests"] = server.stats()
    finally:
        server.stop()
    results["wall_seconds"] = time.perf_counter() - started
    results["load_average_after"] = os.getloadavg()
    m = results["machine"]
    print(f"\nmachine: {m['cpus']} CPUs, {m['cpu_model']}, Python {m['python']}")
    before = " ".join(f"{x:.2f}" for x in results["load_average_before"])
    after = " ".join(f"{x:.2f}" for x in results["load_average_after"])
    print(f"wall time: {results['wall_seconds']:.0f}s; load average before {before}, after {after}")
    print("(a busy machine skews ratios: rerun when the load average before is well under 1)\n")
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return 0
