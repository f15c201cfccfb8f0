"""The benchmark: our stage against raw httpx and peer clients, side by side, as ratios.

Run with ``python -m benchmarks`` from the repository root (see benchmarks/README.md). It starts
`benchmarks.server` in a child process on 127.0.0.1 and measures, in one run:

- overhead: raw httpx POST + JSON parse vs `RerankClient` vs `RerankStage` (sampled out and
  traced through a BatchSpanProcessor and the real OTLP/HTTP exporter to the server's sink);
- fan-out: 512 texts in batches of 32 behind a 20 ms server delay, async vs ideal, sync beside;
- peers: the Cohere SDK, `rerankers`, LangChain's CohereRerank and LlamaIndex's TEI reranker,
  untraced, against our stage traced, on the same server;
- throughput: async stage calls per second at 64 concurrency vs a raw httpx `AsyncClient` loop;
- memory: RSS growth over 10,000 traced async stage calls after a warm-up.

Variants are interleaved round by round (so drift hits all of them alike) and each figure is
the median over rounds. Every traced block ends with `force_flush()` inside the timed region,
so the exporter's work (encoding and sending the spans) is charged to tracing, not hidden in a
background thread. Nothing here asserts; targets are reported as met or not met.
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
    overhead_rounds_10ms: int = 7
    overhead_calls_10ms: int = 20
    fanout_async_reps: int = 15
    fanout_sync_reps: int = 3
    peer_rounds: int = 9
    peer_calls: int = 30
    throughput_rounds: int = 5
    throughput_calls: int = 1536  # a multiple of 64
    memory_warmup: int = 1024
    memory_calls: int = 10_000
    breakdown_rounds: int = 9


QUICK = Scale(
    overhead_rounds=3,
    overhead_calls=10,
    overhead_rounds_10ms=2,
    overhead_calls_10ms=5,
    fanout_async_reps=3,
    fanout_sync_reps=1,
    peer_rounds=2,
    peer_calls=5,
    throughput_rounds=1,
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


def interleaved(
    variants: dict[str, Callable[[], object]],
    *,
    rounds: int,
    calls: int,
    after_block: dict[str, Callable[[], object]] | None = None,
) -> dict[str, float]:
    """Median seconds per call of each variant; variants take turns, order rotating per round.

    `after_block` runs inside the timed region after a variant's block (a traced variant's
    `force_flush`), so deferred work is charged to the variant that caused it.
    """
    after = after_block or {}
    names = list(variants)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = variants[name]
            gc.collect()
            started = time.perf_counter()
            for _ in range(calls):
                fn()
            if name in after:
                after[name]()
            samples[name].append((time.perf_counter() - started) / calls)
    return {name: statistics.median(values) for name, values in samples.items()}


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


def traced_provider(server: LocalServer) -> Any:
    """configure_tracing with the real OTLP/HTTP exporter pointed at the server's sink.

    The BatchSpanProcessor exports every 100 ms instead of every 5 s, so that within a short
    timed block it works in the background as it does in a long-running service, rather than
    all at the closing `force_flush`. The work per span is the same either way.
    """
    from retrieval_stage.telemetry import configure_tracing, otlp_span_exporter

    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = BSP_SCHEDULE_DELAY_MS
    exporter = otlp_span_exporter(server.url, protocol="http/protobuf")
    return configure_tracing("retrieval-stage-bench", exporter=exporter)


def sampled_out_provider() -> Any:
    """An SDK TracerProvider that samples every span out: non-recording spans."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    return TracerProvider(sampler=ALWAYS_OFF)


# -- sections -----------------------------------------------------------------------------------


def _overhead_at(server: LocalServer, delay_ms: int, rounds: int, calls: int) -> dict[str, float]:
    """Median seconds per call of raw httpx, the client and the stage, behind `delay_ms`."""
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

    # batch_size=DOCS: one request per call on every side (TEI's own default cap is 32).
    client = RerankClient(base_url, batch_size=DOCS)
    traced = traced_provider(server)
    stage_off = RerankStage(
        RerankClient(base_url, batch_size=DOCS), tracer_provider=sampled_out_provider()
    )
    stage_on = RerankStage(RerankClient(base_url, batch_size=DOCS), tracer_provider=traced)
    stage_hidden = RerankStage(
        RerankClient(base_url, batch_size=DOCS),
        tracer_provider=traced,
        trace_config=TraceConfig(hide_inputs=True, hide_outputs=True),
    )
    variants: dict[str, Callable[[], object]] = {
        "raw httpx": raw,
        "RerankClient": lambda: client.rerank(QUERY, texts),
        "RerankStage, sampled out": lambda: stage_off.run(QUERY, cands),
        "RerankStage, traced (OTLP)": lambda: stage_on.run(QUERY, cands),
        "RerankStage, traced, documents hidden": lambda: stage_hidden.run(QUERY, cands),
    }
    for fn in variants.values():  # warm connections and caches
        for _ in range(10):
            fn()
    traced.force_flush()
    t = interleaved(
        variants,
        rounds=rounds,
        calls=calls,
        after_block={
            "RerankStage, traced (OTLP)": traced.force_flush,
            "RerankStage, traced, documents hidden": traced.force_flush,
        },
    )
    traced.shutdown()
    raw_http.close()
    client.close()
    return t


def overhead(server: LocalServer, scale: Scale) -> dict[str, Any]:
    """Sync, TEI shape, 50 documents: what our layers add to one call.

    At 0 ms server latency (the target: the client is all there is to measure) and at 10 ms
    (about a GPU cross-encoder scoring 50 passages), where the exporter's thread can work while
    the caller waits on the network.
    """
    at0 = _overhead_at(server, 0, scale.overhead_rounds, scale.overhead_calls)
    at10 = _overhead_at(server, 10, scale.overhead_rounds_10ms, scale.overhead_calls_10ms)
    span_us = (at0["RerankStage, traced (OTLP)"] - at0["RerankStage, sampled out"]) / DOCS * 1e6
    return {
        "seconds_per_call": at0,
        "ratio_to_raw": {name: value / at0["raw httpx"] for name, value in at0.items()},
        "span_cost_us_per_document": span_us,
        "seconds_per_call_10ms": at10,
        "ratio_to_raw_10ms": {name: value / at10["raw httpx"] for name, value in at10.items()},
    }


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
    )
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


async def _drive(fn: Callable[[], Awaitable[object]], calls: int, concurrency: int) -> float:
    """Calls per second with `concurrency` workers looping on `fn`."""
    per_worker = calls // concurrency

    async def worker() -> None:
        for _ in range(per_worker):
            await fn()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return per_worker * concurrency / (time.perf_counter() - started)


def throughput(server: LocalServer, scale: Scale, concurrency: int = 64) -> dict[str, Any]:
    """Async calls per second at 64 concurrency, every variant on httpx's default pool limits.

    httpx's AsyncClient slows down as its pool grows (a 64-connection pool is slower than the
    default 20 kept alive), so every variant gets the same default client a user would get.
    The ratio is taken round by round (each round runs every variant once, back to back) and
    the median reported, because httpx's own rate at this concurrency swings between runs.
    """
    import httpx

    from retrieval_stage import AsyncRerankClient, RerankStage

    cands = candidates(DOCS)
    texts = [c.text for c in cands]
    traced = traced_provider(server)

    async def main() -> dict[str, list[float]]:
        raw_http = httpx.AsyncClient()
        url = server.url + "/rerank"

        async def raw() -> object:
            response = await raw_http.post(url, json={"query": QUERY, "texts": texts})
            return json.loads(response.content)

        on = RerankStage(AsyncRerankClient(server.url, batch_size=DOCS), tracer_provider=traced)
        off = RerankStage(
            AsyncRerankClient(server.url, batch_size=DOCS), tracer_provider=sampled_out_provider()
        )
        variants: dict[str, Callable[[], Awaitable[object]]] = {
            "raw httpx AsyncClient": raw,
            "RerankStage.arun, sampled out": lambda: off.arun(QUERY, cands),
            "RerankStage.arun, traced (OTLP)": lambda: on.arun(QUERY, cands),
        }
        for fn in variants.values():
            await _drive(fn, concurrency * 4, concurrency)
        traced.force_flush()
        samples: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        for r in range(scale.throughput_rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                gc.collect()
                started = time.perf_counter()
                await _drive(variants[name], scale.throughput_calls, concurrency)
                if "traced" in name:
                    traced.force_flush()
                elapsed = time.perf_counter() - started
                samples[name].append(scale.throughput_calls // concurrency * concurrency / elapsed)
        await raw_http.aclose()
        return samples

    samples = asyncio.run(main())
    traced.shutdown()
    raw_rates = samples["raw httpx AsyncClient"]
    per_round = {
        name: sorted(v / b for v, b in zip(values, raw_rates, strict=True))
        for name, values in samples.items()
    }
    return {
        "concurrency": concurrency,
        "calls_per_second": {name: statistics.median(v) for name, v in samples.items()},
        "ratio_to_raw": {name: statistics.median(v) for name, v in per_round.items()},
        "ratio_to_raw_per_round": per_round,
    }


def memory(server: LocalServer, scale: Scale, concurrency: int = 64) -> dict[str, Any]:
    """RSS growth over 10,000 traced async stage calls, after a warm-up at the same load."""
    from retrieval_stage import AsyncRerankClient, RerankStage

    cands = candidates(DOCS)
    traced = traced_provider(server)

    async def main() -> tuple[int, int, int]:
        before_warmup = rss_bytes()
        stage = RerankStage(AsyncRerankClient(server.url, batch_size=DOCS), tracer_provider=traced)

        async def call() -> object:
            return await stage.arun(QUERY, cands)

        await _drive(call, scale.memory_warmup, concurrency)
        traced.force_flush()
        gc.collect()
        after_warmup = rss_bytes()
        done = 0
        while done < scale.memory_calls:  # in slices, flushing, like a steady service
            step = min(1024, scale.memory_calls - done)
            await _drive(call, step, min(concurrency, step))
            done += step
        traced.force_flush()
        gc.collect()
        return before_warmup, after_warmup, rss_bytes()

    cold, warm, end = asyncio.run(main())
    traced.shutdown()
    mib = 1024 * 1024
    return {
        "calls": scale.memory_calls,
        "rss_growth_mib": (end - warm) / mib,
        "rss_growth_from_cold_mib": (end - cold) / mib,
        "rss_end_mib": end / mib,
    }


def breakdown(server: LocalServer, scale: Scale) -> dict[str, Any]:
    """Where a traced call's extra time goes, per 50-document call, measured in-process.

    The stage runs over an in-memory reranker (no HTTP) so that only its own work is timed:
    sampled out, and recording on an SDK provider with no processor; then our document
    attributes alone, and the OTLP exporter's protobuf encoding of the finished spans.
    """
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from retrieval_stage import RerankStage
    from retrieval_stage.models import Reranked, RerankResponse
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
        "OTLP protobuf encoding, per span (exporter)": lambda: encode_spans(finished),
    }
    t = interleaved(variants, rounds=scale.breakdown_rounds, calls=20)
    t["OTLP protobuf encoding, per span (exporter)"] *= per_span
    span.end()
    collecting.shutdown()
    return {
        "seconds_per_call": t,
        "attributes_per_span": len(finished[0].attributes or {}),
        "otlp_bytes_per_span": len(encode_spans(finished).SerializeToString()) * per_span,
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


def _overhead_rows(o: dict[str, Any]) -> list[Row]:
    r0, r10 = o["ratio_to_raw"], o["ratio_to_raw_10ms"]
    traced = r0["RerankStage, traced (OTLP)"]
    return [
        ("overhead, 0 ms: RerankClient / raw httpx", f"{r0['RerankClient']:.2f}x", "", ""),
        (
            "overhead, 0 ms: RerankStage sampled out / raw httpx",
            f"{r0['RerankStage, sampled out']:.2f}x",
            "",
            "",
        ),
        (
            "overhead, 0 ms: RerankStage traced (BSP + OTLP) / raw httpx",
            f"{traced:.2f}x",
            "<= 1.10x",
            verdict(traced <= 1.10),
        ),
        (
            "overhead, 0 ms: stage traced, documents hidden (OPENINFERENCE_HIDE_*) / raw",
            f"{r0['RerankStage, traced, documents hidden']:.2f}x",
            "(context)",
            "",
        ),
        (
            "span cost per document, (traced - sampled out) / 50",
            f"{o['span_cost_us_per_document']:.1f} us",
            "",
            "",
        ),
        ("overhead, 10 ms: RerankClient / raw httpx", f"{r10['RerankClient']:.3f}x", "", ""),
        (
            "overhead, 10 ms: RerankStage traced (BSP + OTLP) / raw httpx",
            f"{r10['RerankStage, traced (OTLP)']:.3f}x",
            "(context)",
            "",
        ),
    ]


def _fanout_rows(f: dict[str, Any]) -> list[Row]:
    return [
        (
            f"fan-out 512 texts / 32 per batch, 20 ms: ideal / async wall "
            f"(ideal = ceil(16/{f['max_concurrency']}) x 20 ms)",
            f"{f['async_efficiency']:.2f}",
            ">= 0.80",
            verdict(f["async_efficiency"] >= 0.8),
        ),
        (
            "fan-out: ideal / raw httpx wall, same 16 requests under the same semaphore",
            f"{f['raw_httpx_efficiency']:.2f}",
            "(ceiling)",
            "",
        ),
        ("fan-out: async client wall / raw httpx", f"{f['async_over_raw_httpx']:.2f}x", "", ""),
        ("fan-out: sync client wall / async client wall", f"{f['sync_over_async']:.1f}x", "", ""),
    ]


def _peer_rows(p: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for name, ratio in p["peer_over_ours_traced"].items():
        rows.append(
            (
                f"{name} untraced / ours traced ({p['shape'][name]} shape)",
                f"{ratio:.2f}x",
                "> 1.00x",
                verdict(ratio > 1.0),
            )
        )
    for name, ratio in p["peer_over_ours_sampled_out"].items():
        rows.append((f"{name} untraced / ours sampled out", f"{ratio:.2f}x", "(context)", ""))
    return rows


def _throughput_rows(t: dict[str, Any]) -> list[Row]:
    ratios, spread = t["ratio_to_raw"], t["ratio_to_raw_per_round"]
    traced = ratios["RerankStage.arun, traced (OTLP)"]

    def span(name: str) -> str:
        return f" (rounds {spread[name][0]:.2f}-{spread[name][-1]:.2f})"

    off = "RerankStage.arun, sampled out"
    on = "RerankStage.arun, traced (OTLP)"
    return [
        (
            f"throughput @{t['concurrency']}: stage sampled out / raw AsyncClient",
            f"{ratios[off]:.2f}x{span(off)}",
            "",
            "",
        ),
        (
            f"throughput @{t['concurrency']}: stage traced (BSP + OTLP) / raw AsyncClient",
            f"{traced:.2f}x{span(on)}",
            ">= 0.80x",
            verdict(traced >= 0.8),
        ),
    ]


def _memory_rows(m: dict[str, Any]) -> list[Row]:
    growth_mb = m["rss_growth_mib"] * 1.048576
    return [
        (
            f"memory: RSS growth over {m['calls']:,} traced async stage calls, after warm-up",
            f"{growth_mb:.1f} MB",
            "< 20 MB",
            verdict(growth_mb < 20),
        ),
        (
            "memory: RSS growth from before the warm-up",
            f"{m['rss_growth_from_cold_mib'] * 1.048576:.1f} MB",
            "(context)",
            "",
        ),
    ]


def _breakdown_rows(b: dict[str, Any], raw_seconds: float | None) -> list[Row]:
    rows: list[Row] = []
    for name, seconds in b["seconds_per_call"].items():
        share = f" = {seconds / raw_seconds:.2f} raw calls" if raw_seconds else ""
        rows.append((f"breakdown: {name}", f"{seconds * 1e6:.0f} us{share}", "(context)", ""))
    rows.append(
        (
            "breakdown: attributes / OTLP bytes per 50-document span",
            f"{b['attributes_per_span']} / {b['otlp_bytes_per_span'] / 1024:.0f} KiB",
            "(context)",
            "",
        )
    )
    return rows


def table(results: dict[str, Any]) -> str:
    """The results as a Markdown table of ratios with targets."""
    builders: dict[str, Callable[[dict[str, Any]], list[Row]]] = {
        "overhead": _overhead_rows,
        "fanout": _fanout_rows,
        "peers": _peer_rows,
        "throughput": _throughput_rows,
        "memory": _memory_rows,
    }
    rows: list[Row] = []
    for name, build in builders.items():
        if name in results:
            rows += build(results[name])
    if "breakdown" in results:
        raw = results.get("overhead", {}).get("seconds_per_call", {}).get("raw httpx")
        rows += _breakdown_rows(results["breakdown"], raw)
    lines = ["| measure | result | target | |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines)


SECTIONS: dict[str, Callable[[LocalServer, Scale], dict[str, Any]]] = {
    "overhead": overhead,
    "fanout": fanout,
    "peers": peers,
    "throughput": throughput,
    "memory": memory,
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
