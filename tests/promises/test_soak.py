"""A bounded soak: many concurrent async stage calls against WireMock on loopback, 10% faulting.

One `AsyncRerankClient` serves `CALLS` stage calls, `CONCURRENCY` at a time, as an application
would. Every tenth call is routed (by its query) to one of four faults: a connection reset, an
empty response, a 503 that never recovers, a 200 that is not JSON. Every healthy answer is
signed with its request's number, so the soak is a detector for the worst bug a pooled client
can have: a response read as the answer to another request. Checked at the end: every call
returned each candidate exactly once, reranked with its own request's scores when healthy and
in recall order when faulting (a wrong answer is reported with what WireMock's journal says it
served that call, which tells a client mislabel from a WireMock mismatch); WireMock matched
every request to the stub its query routes to; the client made, and WireMock journalled,
exactly the requests the retry policy allows; every call made one span (ERROR exactly for the
faulting ones); no file descriptor or connection outlived the client; resident memory stayed
flat after warm-up. A wall-clock guard stops the soak by itself.

`test_an_answer_arriving_after_the_deadline_never_reaches_the_next_request` checks the same
property deterministically, on a raw loopback server that answers an abandoned request late.

Measured on a 2-core machine: 6-10 s for 2,000 calls alone, 15-30 s under load.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple

import pytest
from openinference.semconv.trace import RerankerAttributes
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import StatusCode
from structlog.testing import capture_logs

from retrieval_stage import (
    AsyncRerankClient,
    Candidate,
    RerankClient,
    Reranked,
    RerankStage,
    RerankTransportError,
)
from retrieval_stage.spans import ATTR_REQUESTS
from tests.hooks import hooked

from ..conftest import WireMock

CALLS = 2000
CONCURRENCY = 64
WARM_UP = 200
DOCS = 8
MAX_RETRIES = 2
GUARD_SECONDS = 100.0
"""The soak is cancelled (and fails) if it has not finished by then."""


class Served(NamedTuple):
    """One request in WireMock's journal: its query, the stub that matched, the status sent."""

    query: str
    stub: str
    status: int | None


JOURNAL_SETTLE_SECONDS = 5.0
"""How long the journal may stay short of the client's count before the test believes it."""

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
HEALTHY = "healthy"
SIGNATURES = 100
"""Healthy stubs, each signing its scores with the last two digits of the calls it answers."""
UNROUTED = 0.999
"""The signature of the catch-all stub that answers a request no routed stub matched."""


def kind_of(i: int) -> str | None:
    """Which fault call `i` meets: every tenth call, the four kinds in turn."""
    return KINDS[(i // 10) % len(KINDS)] if i % 10 == 0 else None


def query_of(i: int) -> str:
    """Call `i`'s query: its kind (routes it to a stub) and its number (signs the answer)."""
    return f"{kind_of(i) or HEALTHY}:{i:05d}"


def own_score(i: int, j: int) -> float:
    """The score the healthy stubs give document `j` of call `i`: ``j + 1`` before the point
    (the reverse order) and the call's last two digits after it (which stub answered)."""
    return float(f"{j + 1}.{i % SIGNATURES:02d}")


def stub(wm: WireMock) -> dict[str, str]:
    """The stubs; their names by id (the journal names the stub that matched each request).

    A healthy call meets one of `SIGNATURES` stubs, chosen by its number's last two digits,
    which signs its scores with those digits: a call that got the answer to another call's
    request sees the wrong signature unless the two share their last two digits, which calls
    in flight together (64 of 2,000 in a row) almost never do.
    """
    unrouted = [{"index": j, "score": j + 1 + UNROUTED} for j in reversed(range(DOCS))]
    mappings: dict[str, dict[str, Any]] = {
        "unrouted": {
            "priority": 10,
            "request": {"method": "POST", "urlPath": "/soak/rerank"},
            "response": {
                "status": 200,
                "headers": {"Content-Type": "application/json"},
                "body": json.dumps(unrouted),
            },
        }
    }
    for b in range(SIGNATURES):
        body = [{"index": j, "score": own_score(b, j)} for j in reversed(range(DOCS))]
        mappings[f"{HEALTHY}-{b:02d}"] = {
            "request": {
                "method": "POST",
                "urlPath": "/soak/rerank",
                "bodyPatterns": [
                    {
                        "matchesJsonPath": {
                            "expression": "$.query",
                            "matches": f"^{HEALTHY}:[0-9]*{b:02d}$",
                        }
                    }
                ],
            },
            "response": {
                "status": 200,
                "headers": {"Content-Type": "application/json"},
                "body": json.dumps(body),
            },
        }
    for name, (response, _) in FAULTS.items():
        mappings[name] = {
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
    ids = {}
    for name, mapping in mappings.items():
        created = wm.admin.post("/mappings", json=mapping)
        created.raise_for_status()
        ids[created.json()["id"]] = name
    return ids


class CountingExporter(SpanExporter):
    """Keeps counts, not spans, so memory measures the stage and not the test."""

    def __init__(self) -> None:
        self.total = 0
        self.errors = 0
        self.requests: Counter[str] = Counter()
        """HTTP requests the client made, by query (from each span's own count)."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            self.total += 1
            self.errors += span.status.status_code == StatusCode.ERROR
            attributes = span.attributes or {}
            query = str(attributes[RerankerAttributes.RERANKER_QUERY])
            sent = attributes[ATTR_REQUESTS]
            assert isinstance(sent, int)
            self.requests[query] += sent
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


def recall_score(j: int) -> float:
    """Document `j`'s recall score: an order that is neither the input order nor the rerank."""
    return round(0.1 + (3 * j % DOCS) / 10, 2)


RECALL_ORDER = sorted(range(DOCS), key=lambda j: -recall_score(j))


def candidates(i: int) -> list[Candidate]:
    return [
        Candidate(f"{i}-{j}", f"call {i} document {j}", score=recall_score(j)) for j in range(DOCS)
    ]


def check(i: int, cands: list[Candidate], outputs: list[Reranked]) -> None:
    """Each candidate exactly once; reranked (reverse order) with the scores WireMock computed
    for this call's own request if healthy; recall order with recall scores if not."""
    positions = [o.input_index for o in outputs]
    scores = [o.score for o in outputs]
    assert sorted(positions) == list(range(DOCS)), f"call {i}: {positions}"
    assert all(o.candidate is cands[o.input_index] for o in outputs)
    if kind_of(i) is None:
        assert positions == list(reversed(range(DOCS))), f"call {i} should be reranked: {scores}"
        assert all(o.reranked for o in outputs)
        assert scores == [own_score(i, j) for j in positions], (
            f"call {i} got another's answer: {scores}"
        )
    else:
        assert positions == RECALL_ORDER, f"call {i} ({kind_of(i)}) should fall back: {scores}"
        assert scores == [recall_score(j) for j in positions]
        assert not any(o.reranked for o in outputs)


async def soak(
    stage: RerankStage, calls: range, socket_samples: list[int], failures: dict[int, str]
) -> None:
    """Run `calls`, `CONCURRENCY` at a time; a call that answers wrongly lands in `failures`
    (all of them are kept, so the report can set each against WireMock's journal)."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int) -> None:
        async with gate:
            cands = candidates(i)
            outputs = await stage.arun(query_of(i), cands)
            try:
                check(i, cands, outputs)
            except AssertionError as exc:
                failures[i] = str(exc).splitlines()[0]
            if i % 50 == 0:
                socket_samples.append(sockets())

    await asyncio.gather(*(one(i) for i in calls))


def route(query: str) -> str:
    """The stub a query is meant to meet."""
    kind, number = query.split(":")
    return f"{HEALTHY}-{int(number) % SIGNATURES:02d}" if kind == HEALTHY else kind


def settled_journal(wm: WireMock, names: dict[str, str], expected: int) -> list[Served]:
    """What WireMock served on the soak path, once its journal holds the `expected` requests
    the client counted or has stopped growing for `JOURNAL_SETTLE_SECONDS`."""
    seen, last_growth = -1, time.monotonic()
    while True:
        entries = wm.admin.get("/requests").json()["requests"]
        served = [
            Served(
                json.loads(e["request"]["body"])["query"],
                names.get((e.get("stubMapping") or {}).get("id", ""), "no stub"),
                (e.get("response") or {}).get("status"),
            )
            for e in entries
            if e["request"]["url"].split("?")[0] == "/soak/rerank"
        ]
        if len(served) >= expected or time.monotonic() - last_growth > JOURNAL_SETTLE_SECONDS:
            return served
        if len(served) > seen:
            seen, last_growth = len(served), time.monotonic()
        time.sleep(0.05)


async def test_soak_every_call_answers_cleanly_without_leaks(wm: WireMock) -> None:
    stub_names = stub(wm)
    exporter = CountingExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    fds_before = len(open_fds())
    sockets_before = sockets()
    started = time.monotonic()
    with capture_logs() as logs:
        client = hooked(
            AsyncRerankClient(wm.url + "/soak", timeout=10.0, max_retries=MAX_RETRIES),
            random=lambda: 1.0,
        )
        async with client:
            stage = RerankStage(client, tracer_provider=provider)
            samples: list[int] = []
            failures: dict[int, str] = {}
            await asyncio.wait_for(soak(stage, range(WARM_UP), samples, failures), GUARD_SECONDS)
            rss_warm = rss_bytes()
            await asyncio.wait_for(
                soak(stage, range(WARM_UP, CALLS), samples, failures), GUARD_SECONDS
            )
            rss_end = rss_bytes()
    elapsed = time.monotonic() - started
    provider.shutdown()
    peak_sockets = max(samples)
    print(
        f"soak: {CALLS} calls at {CONCURRENCY} concurrent in {elapsed:.1f}s; "
        f"fds {fds_before} -> {len(open_fds())}, sockets {sockets_before} -> {sockets()} "
        f"(peak {peak_sockets}), RSS {rss_warm / 2**20:.1f} -> {rss_end / 2**20:.1f} MiB"
    )
    served = settled_journal(wm, stub_names, sum(exporter.requests.values()))

    # Every call got its own answer. A wrong one is shown with what WireMock served that
    # call's requests: its own faulting stub there means the client paired a response with
    # the wrong request; another stub means WireMock matched the request wrongly.
    wrong = [
        f"{message}; WireMock served it {[(s.stub, s.status) for s in served if s.query == q]}"
        for i, message in sorted(failures.items())
        if (q := query_of(i))
    ]
    assert not wrong, wrong[:5]

    # WireMock matched every request to the stub its query routes to.
    misrouted = [s for s in served if s.stub != route(s.query)]
    assert not misrouted, f"WireMock matched the wrong stub: {misrouted[:5]}"

    # The client made exactly the requests the policy allows (each span counts its call's):
    # one per healthy call, retries for the transient faults, none for a 2xx that broke the
    # contract; and WireMock journalled every one of them.
    allowed = {query_of(i): FAULTS[k][1] if (k := kind_of(i)) else 1 for i in range(CALLS)}
    assert exporter.requests == allowed
    assert Counter(s.query for s in served) == allowed

    # Every call made exactly one span; the faulting ones, and only they, are ERROR.
    faulting = [i for i in range(CALLS) if kind_of(i)]
    assert exporter.total == CALLS
    assert exporter.errors == len(faulting)

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


class SigningServer:
    """A raw HTTP/1.1 rerank server on loopback that keeps connections alive, signs each answer
    with its request's query, and answers a query starting with ``late`` only after `delay`
    (so the client's deadline has passed and the bytes arrive on an abandoned connection)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.seen: list[tuple[int, str]] = []
        """(connection number, query) for every request read, in order."""
        self._connections = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:  # Python 3.11's wait_closed leaves connections open
            writer.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        number = self._connections
        self._writers.append(writer)
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                query = json.loads(await reader.readexactly(length))["query"]
                self.seen.append((number, query))
                if query.startswith("late"):
                    await asyncio.sleep(self.delay)
                body = json.dumps(
                    [{"index": j, "score": signed(query, j)} for j in reversed(range(DOCS))]
                ).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(body), body)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def signed(query: str, j: int) -> float:
    """Document `j`'s score in the answer to `query`: its rank, then the query's number."""
    return float(f"{j + 1}.{query.split(':')[1]}")


LATE_DEADLINE = 1.5
"""The client's deadline in the keep-alive tests, generous for a loopback call on a busy
machine. The server answers a ``late`` query after 1.5 times that: half a deadline after the
client gave up, so a next call started at once is waiting on its connection when the late bytes
come, and one started a whole deadline later finds them already landed."""


@pytest.mark.parametrize("flavour", ["async", "sync"])
@pytest.mark.parametrize(
    "pause", [0.0, LATE_DEADLINE], ids=["answer-still-to-come", "answer-already-landed"]
)
async def test_an_answer_arriving_after_the_deadline_never_reaches_the_next_request(
    pause: float, flavour: str
) -> None:
    """The worst bug a pooled client can have: a call abandoned at its deadline leaves its
    connection in the pool with the answer still to come (or already in the socket buffer),
    and the next request on that connection reads it as its own. Each call here must get its
    own signed answer, and the abandoned connection must carry no further request. The sync
    client (`DeadlineTransport`) runs in a worker thread, so the server keeps serving."""
    server = SigningServer(delay=1.5 * LATE_DEADLINE)
    texts = [f"document {j}" for j in range(DOCS)]
    async with server as url:
        if flavour == "async":
            async with AsyncRerankClient(url, timeout=LATE_DEADLINE, max_retries=0) as client:
                await calls_after_a_late_answer(client.rerank, texts, pause)
        else:
            with RerankClient(url, timeout=LATE_DEADLINE, max_retries=0) as sync_client:

                async def rerank(query: str, texts: list[str]) -> list[tuple[str, float]]:
                    return await asyncio.to_thread(sync_client.rerank, query, texts)

                await calls_after_a_late_answer(rerank, texts, pause)
    late_connection = next(c for c, q in server.seen if q.startswith("late"))
    on_it = [q for c, q in server.seen if c == late_connection]
    assert on_it[-1] == "late:02", f"the abandoned connection was used again: {server.seen}"


async def calls_after_a_late_answer(
    rerank: Callable[[str, list[str]], Awaitable[list[tuple[str, float]]]],
    texts: list[str],
    pause: float,
) -> None:
    """A call on a kept-alive connection, one abandoned at the deadline, then three more that
    must each read their own answer."""
    assert await rerank("warm:01", texts)  # leaves one pooled keep-alive connection
    with pytest.raises(RerankTransportError, match="deadline"):
        await rerank("late:02", texts)
    await asyncio.sleep(pause)
    for n in range(3, 6):
        got = await rerank(f"next:{n:02d}", texts)
        assert [score for _, score in got] == [
            signed(f"next:{n:02d}", j) for j in reversed(range(DOCS))
        ], f"call next:{n:02d} read another request's answer: {got}"
