"""A bounded soak: many concurrent async stage calls against WireMock on loopback, 10% faulting.

One `AsyncRerankClient` serves `CALLS` stage calls, `CONCURRENCY` at a time, as an application
would. Every tenth call is routed (by its query) to one of four faults: a connection reset, an
empty response, a 503 that never recovers, a 200 that is not JSON. Checked at the end: every
call returned each candidate exactly once, reranked when healthy and in recall order when
faulting; WireMock saw exactly the requests the retry policy allows; every call made one span
(ERROR exactly for the faulting ones); no file descriptor or connection outlived the client;
resident memory stayed flat after warm-up. A wall-clock guard stops the soak by itself.

Measured on a 2-core machine: 6-10 s for 2,000 calls (see docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import StatusCode
from structlog.testing import capture_logs

from retrieval_stage import AsyncRerankClient, Candidate, Reranked, RerankStage

from .conftest import WireMock

CALLS = 2000
CONCURRENCY = 64
WARM_UP = 200
DOCS = 8
MAX_RETRIES = 2
GUARD_SECONDS = 100.0
"""The soak is cancelled (and fails) if it has not finished by then."""

RSS_GROWTH_LIMIT = 40 * 1024 * 1024
"""Generous: allocator noise is a few MB; a per-call leak of 1 kB x 1,800 calls is not."""

FAULTS: dict[str, tuple[dict[str, Any], int]] = {
    "reset": ({"fault": "CONNECTION_RESET_BY_PEER"}, 1 + MAX_RETRIES),
    "empty": ({"fault": "EMPTY_RESPONSE"}, 1 + MAX_RETRIES),
    "unavailable": (
        {"status": 503, "body": '{"error": "overloaded", "error_type": "Unhealthy"}'},
        1 + MAX_RETRIES,
    ),
    "not-json": ({"status": 200, "body": "<html>gateway</html>"}, 1),
}
"""Fault name: (WireMock response, requests the policy allows for one call)."""

KINDS = sorted(FAULTS)


def kind_of(i: int) -> str | None:
    """Which fault call `i` meets: every tenth call, the four kinds in turn."""
    return KINDS[(i // 10) % len(KINDS)] if i % 10 == 0 else None


def stub(wm: WireMock) -> None:
    body = [{"index": j, "score": round((j + 1) / (DOCS + 1), 4)} for j in reversed(range(DOCS))]
    wm.stub_json("/soak/rerank", body)
    for name, (response, _) in FAULTS.items():
        wm.stub(
            {
                "priority": 1,
                "request": {
                    "method": "POST",
                    "urlPath": "/soak/rerank",
                    "bodyPatterns": [
                        {"matchesJsonPath": {"expression": "$.query", "matches": f"^{name}:.*"}}
                    ],
                },
                "response": response,
            }
        )


class CountingExporter(SpanExporter):
    """Keeps counts, not spans, so memory measures the stage and not the test."""

    def __init__(self) -> None:
        self.total = 0
        self.errors = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            self.total += 1
            self.errors += span.status.status_code == StatusCode.ERROR
        return SpanExportResult.SUCCESS


def open_fds() -> list[str]:
    """What this process has open, by target (sockets show as ``socket:[inode]``)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor, already closed
            continue
    return out


def sockets() -> int:
    return sum(target.startswith("socket:") for target in open_fds())


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def candidates(i: int) -> list[Candidate]:
    return [
        Candidate(f"{i}-{j}", f"call {i} document {j}", score=round(1.0 - j / 10, 2))
        for j in range(DOCS)
    ]


def check(i: int, cands: list[Candidate], outputs: list[Reranked]) -> None:
    """Each candidate exactly once; reranked (reverse order) if healthy, recall order if not."""
    positions = [o.input_index for o in outputs]
    assert sorted(positions) == list(range(DOCS)), f"call {i}: {positions}"
    assert all(o.candidate is cands[o.input_index] for o in outputs)
    if kind_of(i) is None:
        assert positions == list(reversed(range(DOCS))), f"call {i} should be reranked"
        assert all(o.reranked for o in outputs)
    else:
        assert positions == list(range(DOCS)), f"call {i} ({kind_of(i)}) should fall back"
        assert not any(o.reranked for o in outputs)


async def soak(stage: RerankStage, calls: range, socket_samples: list[int]) -> None:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int) -> None:
        async with gate:
            cands = candidates(i)
            kind = kind_of(i)
            query = f"{kind}:{i}" if kind else f"healthy {i}"
            check(i, cands, await stage.arun(query, cands))
            if i % 50 == 0:
                socket_samples.append(sockets())

    await asyncio.gather(*(one(i) for i in calls))


async def test_soak_every_call_answers_cleanly_without_leaks(wm: WireMock) -> None:
    stub(wm)
    exporter = CountingExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    fds_before = len(open_fds())
    sockets_before = sockets()
    started = time.monotonic()
    with capture_logs() as logs:
        client = AsyncRerankClient(
            wm.url + "/soak", timeout=10.0, max_retries=MAX_RETRIES, random=lambda: 1.0
        )
        async with client:
            stage = RerankStage(client, tracer_provider=provider)
            samples: list[int] = []
            await asyncio.wait_for(soak(stage, range(WARM_UP), samples), GUARD_SECONDS)
            rss_warm = rss_bytes()
            await asyncio.wait_for(soak(stage, range(WARM_UP, CALLS), samples), GUARD_SECONDS)
            rss_end = rss_bytes()
    elapsed = time.monotonic() - started
    provider.shutdown()
    peak_sockets = max(samples)
    print(
        f"soak: {CALLS} calls at {CONCURRENCY} concurrent in {elapsed:.1f}s; "
        f"fds {fds_before} -> {len(open_fds())}, sockets {sockets_before} -> {sockets()} "
        f"(peak {peak_sockets}), RSS {rss_warm / 2**20:.1f} -> {rss_end / 2**20:.1f} MiB"
    )

    # Every call made exactly one span; the faulting ones, and only they, are ERROR.
    faulting = [i for i in range(CALLS) if kind_of(i)]
    assert exporter.total == CALLS
    assert exporter.errors == len(faulting)

    # WireMock saw exactly what the policy allows: one request per healthy call, retries for
    # the transient faults, none for a 2xx that broke the contract.
    expected = (CALLS - len(faulting)) + sum(FAULTS[kind_of(i) or ""][1] for i in faulting)
    assert len(wm.requests("/soak/rerank")) == expected

    events = Counter(entry["event"] for entry in logs)
    assert events["rerank.fallback"] == len(faulting)
    retried = sum(FAULTS[kind_of(i) or ""][1] - 1 for i in faulting)
    assert events["rerank.retry_scheduled"] == retried

    # Nothing outlived the client: no descriptor, no connection.
    assert len(open_fds()) <= fds_before, "file descriptors leaked"
    assert sockets() <= sockets_before, "connections leaked"
    assert peak_sockets - sockets_before <= 100, "more connections than httpx's pool allows"
    assert peak_sockets > sockets_before, "the samples saw the pool's connections"

    # Memory flat after warm-up.
    assert rss_end - rss_warm < RSS_GROWTH_LIMIT, (rss_warm, rss_end)
    assert elapsed < GUARD_SECONDS


def test_fault_routing_sends_one_call_in_ten_to_each_kind_in_turn() -> None:
    kinds = [kind_of(i) for i in range(80)]
    assert sum(k is not None for k in kinds) == 8
    assert Counter(k for k in kinds if k) == dict.fromkeys(KINDS, 2)
    assert json.dumps(kinds[:11]) == json.dumps([KINDS[0]] + [None] * 9 + [KINDS[1]])
