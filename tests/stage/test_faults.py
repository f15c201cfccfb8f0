"""Fault injection against a real WireMock: what the stage does when the reranker misbehaves.

Each case runs `RerankStage` over the sync and the async client and asserts the outcome (the
reranked order or recall-order fallback, from candidates whose recall order is not their input
order), how many requests WireMock saw, that the call ended within its deadline plus
`SCHEDULING_MARGIN`, the span's status and events, and that every candidate came back exactly
once. The retry waits use ``random=1.0`` (the shortest jitter: 0.375 s, 0.75 s)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from structlog.testing import capture_logs

from retrieval_stage import AsyncRerankClient, Candidate, RerankClient, Reranked, RerankStage
from tests.hooks import hooked

from ..conftest import WireMock

Spans = tuple[TracerProvider, InMemorySpanExporter]
Flavour = Literal["sync", "async"]
FLAVOURS: list[Flavour] = ["sync", "async"]

SCHEDULING_MARGIN = 3.0
"""Seconds allowed past a deadline for scheduling noise on a loaded two-core machine.

Every server delay that a broken client would wait out is chosen longer than the deadline plus
this margin, so the bound still tells a held deadline from a missed one."""

DEADLINE = 5.0
"""The call's timeout in the cases that retry: room for every attempt and wait they make."""

SHORTEST_JITTER = 1.0
"""`random` value giving the shortest backoff: 0.375 s, then 0.75 s."""


RECALL_SCORES: list[float | None] = [0.1, 0.5, None, 0.8, 0.8, 0.3, 0.9, 0.2]
"""Recall scores of the candidates, by input position: a missing score, a tie, and an order
that is neither the input order nor its reverse (what the reranker stubs answer) from 3 up."""

RECALL_ORDERS = {
    2: [1, 0],
    3: [1, 0, 2],
    4: [3, 1, 0, 2],
    5: [3, 4, 1, 0, 2],
    8: [6, 3, 4, 1, 5, 7, 0, 2],
}
"""The recall order of `candidates(n)`, written out by hand: best score first, ties in input
order, a missing score last. Never computed by the library's own `recall_order`."""


def candidates(n: int) -> list[Candidate]:
    """`n` candidates whose recall order (`RECALL_ORDERS[n]`) is not their input order."""
    assert RECALL_ORDERS[n] != list(range(n))
    return [Candidate(f"d{i}", f"doc {i}", score=RECALL_SCORES[i]) for i in range(n)]


def reversed_body(n: int) -> list[dict[str, Any]]:
    """A valid TEI answer for `n` texts ranking them in reverse input order, best first."""
    return [{"index": i, "score": round((i + 1) / (n + 1), 4)} for i in reversed(range(n))]


def by_count(n: int) -> dict[str, Any]:
    """A body pattern matching a request with exactly `n` texts."""
    return {"matchesJsonPath": {"expression": "$.texts.length()", "equalTo": str(n)}}


def stub_reversed(wm: WireMock, path: str, sizes: range, **mapping: Any) -> None:
    """Answer any request of `path` with 1..n texts with `reversed_body`."""
    for n in sizes:
        wm.stub(
            {
                "request": {"method": "POST", "urlPath": path, "bodyPatterns": [by_count(n)]},
                "response": {
                    "status": 200,
                    "headers": {"Content-Type": "application/json"},
                    "body": json.dumps(reversed_body(n)),
                },
                **mapping,
            }
        )


def stub_sequence(wm: WireMock, path: str, responses: list[dict[str, Any]]) -> None:
    """Answer `path` with `responses` in turn (a WireMock scenario); the last one repeats."""
    name = "seq " + path
    for i, response in enumerate(responses):
        mapping: dict[str, Any] = {
            "scenarioName": name,
            "requiredScenarioState": "Started" if i == 0 else f"s{i}",
            "request": {"method": "POST", "urlPath": path},
            "response": response,
        }
        if i + 1 < len(responses):
            mapping["newScenarioState"] = f"s{i + 1}"
        wm.stub(mapping)


def json_response(body: Any, status: int = 200, **headers: str) -> dict[str, Any]:
    return {
        "status": status,
        "headers": {"Content-Type": "application/json", **headers},
        "body": json.dumps(body),
    }


@dataclass
class Run:
    """What one stage call came to."""

    outputs: list[Reranked]
    elapsed: float
    span: ReadableSpan
    client: RerankClient | AsyncRerankClient


def run_stage(
    flavour: Flavour,
    spans: Spans,
    url: str,
    cands: list[Candidate],
    *,
    identity: bool = False,
    calls: int = 1,
    **client_kw: Any,
) -> list[Run]:
    """Run the stage `calls` times over one client of `flavour`; one `Run` per call.

    `identity` asks WireMock not to gzip, so a dribbled body really arrives in pieces.
    """
    provider, exporter = spans
    headers = {"Accept-Encoding": "identity"} if identity else None
    jitter = client_kw.pop("random", lambda: SHORTEST_JITTER)
    runs: list[Run] = []

    def record(outputs: list[Reranked], started: float, client: Any) -> None:
        elapsed = time.monotonic() - started
        span = exporter.get_finished_spans()[-1]
        runs.append(Run(outputs, elapsed, span, client))

    if flavour == "sync":
        http = httpx.Client(headers=headers)
        with (
            http,
            hooked(RerankClient(url, http_client=http, **client_kw), random=jitter) as client,
        ):
            stage = RerankStage(client, tracer_provider=provider)
            for _ in range(calls):
                started = time.monotonic()
                record(stage.run("q", cands), started, client)
        return runs

    async def go() -> None:
        ahttp = httpx.AsyncClient(headers=headers)
        client = hooked(AsyncRerankClient(url, http_client=ahttp, **client_kw), random=jitter)
        async with ahttp, client:
            stage = RerankStage(client, tracer_provider=provider)
            for _ in range(calls):
                started = time.monotonic()
                record(await stage.arun("q", cands), started, client)

    asyncio.run(go())
    return runs


def run_once(flavour: Flavour, spans: Spans, url: str, cands: list[Candidate], **kw: Any) -> Run:
    (run,) = run_stage(flavour, spans, url, cands, **kw)
    return run


def assert_every_candidate_once(outputs: list[Reranked], cands: list[Candidate]) -> None:
    assert sorted(o.input_index for o in outputs) == list(range(len(cands)))
    assert all(o.candidate is cands[o.input_index] for o in outputs)


def assert_reranked(run: Run, cands: list[Candidate]) -> None:
    """The reranker's order (reverse input), scores from the server, a clean span."""
    assert_every_candidate_once(run.outputs, cands)
    assert [o.input_index for o in run.outputs] == list(reversed(range(len(cands))))
    assert all(o.reranked for o in run.outputs)
    assert run.span.status.status_code == StatusCode.OK
    assert run.span.attributes is not None
    assert run.span.attributes["retrieval_stage.fallback"] is False


def assert_fell_back(run: Run, cands: list[Candidate], error_type: str) -> None:
    """Recall order, recall scores, nothing marked reranked, and the honest fallback span: ERROR
    saying why, `retrieval_stage.fallback`, the order named as recall in `output.value`, and no
    output documents (a recall score must never be shown as the reranker's score)."""
    order = RECALL_ORDERS[len(cands)]
    assert_every_candidate_once(run.outputs, cands)
    assert [o.input_index for o in run.outputs] == order, "recall order, not input order"
    assert [o.score for o in run.outputs] == [cands[i].score for i in order]
    assert not any(o.reranked for o in run.outputs)
    assert run.span.status.status_code == StatusCode.ERROR
    description = run.span.status.description or ""
    assert description.startswith(f"fell back to recall order: {error_type}: "), description
    attributes = dict(run.span.attributes or {})
    assert attributes["retrieval_stage.fallback"] is True
    assert attributes["retrieval_stage.top1_changed"] is False
    assert attributes["error.type"] == error_type
    ids = ",".join(f'{{"id":"{cands[i].id}"}}' for i in order)
    assert attributes["output.value"] == f'{{"order":"recall","documents":[{ids}]}}'
    outputs = [k for k in attributes if k.startswith("reranker.output_documents.")]
    assert outputs == [], "a fallback span has no output documents"


def retry_events(span: ReadableSpan) -> list[dict[str, Any]]:
    return [dict(e.attributes or {}) for e in span.events if e.name == "rerank.retry_scheduled"]


def event_names(span: ReadableSpan) -> list[str]:
    return [e.name for e in span.events]


# -- a server too slow for the deadline ----------------------------------------------------


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_delay_past_the_deadline_falls_back_within_the_deadline(
    wm: WireMock, spans: Spans, flavour: Flavour
) -> None:
    wm.stub_json("/slow/rerank", reversed_body(3), fixedDelayMilliseconds=10_000)
    cands = candidates(3)
    run = run_once(flavour, spans, wm.url + "/slow", cands, timeout=0.5)
    assert run.elapsed < 0.5 + SCHEDULING_MARGIN
    assert_fell_back(run, cands, "RerankTransportError")
    assert len(wm.requests("/slow/rerank")) == 1, "no time was left for a retry"
    assert retry_events(run.span) == []


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_trickling_body_cannot_hold_the_call_past_its_deadline(
    wm: WireMock, spans: Spans, flavour: Flavour
) -> None:
    # Every piece arrives well inside httpx's read timeout; only a whole-call deadline stops it.
    body = json.dumps(reversed_body(3)) + " " * 200
    wm.stub(
        {
            "request": {"method": "POST", "urlPath": "/trickle/rerank"},
            "response": {
                **json_response(None),
                "body": body,
                "chunkedDribbleDelay": {"numberOfChunks": 20, "totalDuration": 10_000},
            },
        }
    )
    cands = candidates(3)
    run = run_once(flavour, spans, wm.url + "/trickle", cands, timeout=1.0, identity=True)
    assert run.elapsed < 1.0 + SCHEDULING_MARGIN
    assert_fell_back(run, cands, "RerankTransportError")
    assert len(wm.requests("/trickle/rerank")) == 1


# -- broken connections --------------------------------------------------------------------

FAULTS = [
    "CONNECTION_RESET_BY_PEER",
    "EMPTY_RESPONSE",
    "MALFORMED_RESPONSE_CHUNK",
    "RANDOM_DATA_THEN_CLOSE",
]


def fault_causes(wm: WireMock, fault: str) -> set[str]:
    """The httpx error (the retry event's `caused_by`) a fault can reach the client as.

    A reset is a `ReadError` when the client talks to WireMock directly, but Docker's port proxy
    turns it into a clean close, a `RemoteProtocolError` (see docs/reliability.md). Either way
    it is a `RerankTransportError`, retried, then the fallback: what the tests hold on every route.
    """
    if fault != "CONNECTION_RESET_BY_PEER":
        return {"RemoteProtocolError"}
    return {
        "direct": {"ReadError"},
        "docker-proxy": {"RemoteProtocolError"},
    }.get(wm.route, {"ReadError", "RemoteProtocolError"})


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_connection_fault_is_retried_then_falls_back(
    wm: WireMock, spans: Spans, flavour: Flavour, fault: str
) -> None:
    wm.stub(
        {"request": {"method": "POST", "urlPath": "/fault/rerank"}, "response": {"fault": fault}}
    )
    cands = candidates(3)
    run = run_once(flavour, spans, wm.url + "/fault", cands, timeout=DEADLINE, max_retries=1)
    assert run.elapsed < DEADLINE + SCHEDULING_MARGIN
    assert_fell_back(run, cands, "RerankTransportError")
    assert len(wm.requests("/fault/rerank")) == 2
    (retry,) = retry_events(run.span)
    cause = retry.pop("caused_by")
    assert cause in fault_causes(wm, fault)
    assert retry == {"retry_num": 1, "wait_for": 0.375, "batch_offset": 0}
    (exception,) = [e for e in run.span.events if e.name == "exception"]
    assert exception.attributes is not None
    assert str(exception.attributes["exception.message"]).startswith(cause)


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_connection_fault_then_success_is_reranked(
    wm: WireMock, spans: Spans, flavour: Flavour, fault: str
) -> None:
    stub_sequence(wm, "/flaky/rerank", [{"fault": fault}, json_response(reversed_body(3))])
    cands = candidates(3)
    run = run_once(flavour, spans, wm.url + "/flaky", cands, timeout=DEADLINE)
    assert run.elapsed < DEADLINE + SCHEDULING_MARGIN
    assert_reranked(run, cands)
    assert len(wm.requests("/flaky/rerank")) == 2
    (retry,) = retry_events(run.span)
    assert retry["caused_by"] in fault_causes(wm, fault)
    assert run.span.attributes is not None
    assert run.span.attributes["retrieval_stage.retries"] == 1
    assert run.span.attributes["retrieval_stage.requests"] == 2


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_default_policy_makes_three_attempts_on_a_persistent_reset(
    wm: WireMock, spans: Spans, flavour: Flavour
) -> None:
    wm.stub(
        {
            "request": {"method": "POST", "urlPath": "/reset/rerank"},
            "response": {"fault": "CONNECTION_RESET_BY_PEER"},
        }
    )
    cands = candidates(2)
    run = run_once(flavour, spans, wm.url + "/reset", cands, timeout=DEADLINE)
    assert run.elapsed < DEADLINE + SCHEDULING_MARGIN
    assert_fell_back(run, cands, "RerankTransportError")
    assert len(wm.requests("/reset/rerank")) == 3
    assert [(e["retry_num"], e["wait_for"]) for e in retry_events(run.span)] == [
        (1, 0.375),
        (2, 0.75),
    ]


# -- statuses ------------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_503_twice_then_200_is_reranked_after_two_retries(
    wm: WireMock, spans: Spans, flavour: Flavour
) -> None:
    down = json_response({"error": "model is loading", "error_type": "Unhealthy"}, 503)
    stub_sequence(wm, "/recovering/rerank", [down, down, json_response(reversed_body(3))])
    cands = candidates(3)
    run = run_once(flavour, spans, wm.url + "/recovering", cands, timeout=DEADLINE)
    assert run.elapsed < DEADLINE + SCHEDULING_MARGIN
    assert_reranked(run, cands)
    assert len(wm.requests("/recovering/rerank")) == 3
    assert retry_events(run.span) == [
        {"retry_num": 1, "wait_for": 0.375, "caused_by": "HTTP 503", "batch_offset": 0},
        {"retry_num": 2, "wait_for": 0.75, "caused_by": "HTTP 503", "batch_offset": 0},
    ]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_429_with_retry_after_waits_what_the_server_asked(
    wm: WireMock, spans: Spans, flavour: Flavour
) -> None:
    busy = json_response({"error": "too many requests", "error_type": "Overloaded"}, 429)
    busy["headers"]["Retry-After"] = "1"
    stub_sequence(wm, "/busy/rerank", [busy, json_response(reversed_body(3))])
    cands = candidates(3)
    run = run_once(flavour, spans, wm.url + "/busy", cands, timeout=DEADLINE)
    assert run.elapsed < DEADLINE + SCHEDULING_MARGIN
    assert_reranked(run, cands)
    first, second = wm.requests("/busy/rerank")
    assert second["loggedDate"] - first["loggedDate"] >= 950, "the server saw the wait"
    assert retry_events(run.span) == [
        {"retry_num": 1, "wait_for": 1.0, "caused_by": "HTTP 429", "batch_offset": 0}
    ]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_429_asking_for_more_than_the_deadline_falls_back_at_once(
    wm: WireMock, spans: Spans, flavour: Flavour
) -> None:
    wm.stub_json(
        "/slow-down/rerank",
        {"error": "too many requests", "error_type": "Overloaded"},
        status=429,
        headers={"Retry-After": "30"},
    )
    cands = candidates(3)
    run = run_once(flavour, spans, wm.url + "/slow-down", cands, timeout=10.0)
    # A client that slept until its deadline before giving up would take the whole 10 s.
    assert run.elapsed < SCHEDULING_MARGIN, "nothing to wait for: the retry could not finish"
    assert_fell_back(run, cands, "RerankStatusError")
    assert len(wm.requests("/slow-down/rerank")) == 1
    assert retry_events(run.span) == []


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_424_is_retried_once_only(wm: WireMock, spans: Spans, flavour: Flavour) -> None:
    wm.stub_json("/backend/rerank", {"error": "CUDA error", "error_type": "Backend"}, status=424)
    cands = candidates(2)
    run = run_once(flavour, spans, wm.url + "/backend", cands, timeout=DEADLINE, max_retries=5)
    assert run.elapsed < DEADLINE + SCHEDULING_MARGIN
    assert_fell_back(run, cands, "RerankStatusError")
    assert len(wm.requests("/backend/rerank")) == 2
    assert [e["caused_by"] for e in retry_events(run.span)] == ["HTTP 424"]


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_client_errors_are_not_retried(
    wm: WireMock, spans: Spans, flavour: Flavour, status: int
) -> None:
    wm.stub_json("/refuse/rerank", {"error": "no", "error_type": "Validation"}, status=status)
    cands = candidates(2)
    run = run_once(flavour, spans, wm.url + "/refuse", cands, timeout=DEADLINE)
    assert run.elapsed < DEADLINE + SCHEDULING_MARGIN
    assert_fell_back(run, cands, "RerankStatusError")
    assert len(wm.requests("/refuse/rerank")) == 1
    assert retry_events(run.span) == []


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_2xx_breaking_the_contract_is_not_retried(
    wm: WireMock, spans: Spans, flavour: Flavour
) -> None:
    wm.stub_json("/lying/rerank", [{"index": 0, "score": 0.9}, {"index": 0, "score": 0.1}])
    cands = candidates(2)
    run = run_once(flavour, spans, wm.url + "/lying", cands, timeout=DEADLINE)
    assert_fell_back(run, cands, "RerankProtocolError")
    assert len(wm.requests("/lying/rerank")) == 1


# -- one sub-batch failing while the others succeed ----------------------------------------


def stub_one_bad_batch(wm: WireMock, path: str, bad: dict[str, Any]) -> None:
    """Batches of texts answer correctly, except the one holding "doc 2", which gets `bad`."""
    stub_reversed(wm, path, range(1, 3))
    wm.stub(
        {
            "priority": 1,
            "request": {
                "method": "POST",
                "urlPath": path,
                "bodyPatterns": [{"matchesJsonPath": "$.texts[?(@ == 'doc 2')]"}],
            },
            "response": bad,
        }
    )


BAD_BATCHES = {
    "status": (json_response({"error": "bad input", "error_type": "Validation"}, 400), 1),
    "wrong-labels": (json_response([{"index": 0, "score": 0.9}, {"index": 7, "score": 0.1}]), 1),
    "reset": ({"fault": "CONNECTION_RESET_BY_PEER"}, 2),
}
"""The failing batch's answer, and how many attempts it gets (max_retries=1)."""


@pytest.mark.parametrize("bad", sorted(BAD_BATCHES))
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_one_failing_sub_batch_fails_the_whole_call_and_the_stage_falls_back(
    wm: WireMock, spans: Spans, flavour: Flavour, bad: str
) -> None:
    response, bad_attempts = BAD_BATCHES[bad]
    stub_one_bad_batch(wm, "/part/rerank", response)
    cands = candidates(5)  # batches of 2: [doc 0, doc 1], [doc 2, doc 3], [doc 4]
    run = run_once(
        flavour, spans, wm.url + "/part", cands, batch_size=2, max_retries=1, timeout=DEADLINE
    )
    assert run.elapsed < DEADLINE + SCHEDULING_MARGIN
    error = {"status": "RerankStatusError", "wrong-labels": "RerankProtocolError"}
    assert_fell_back(run, cands, error.get(bad, "RerankTransportError"))
    requests = wm.requests("/part/rerank")
    bad_batch = [r for r in requests if "doc 2" in r["body"]]
    assert len(bad_batch) == bad_attempts, "the failing batch got exactly its retries"
    # Concurrently (both clients): the other batches may or may not have reached WireMock
    # before the failure stopped them; either way nothing of theirs was returned.
    assert bad_attempts <= len(requests) <= bad_attempts + 2


@pytest.mark.parametrize("bad", sorted(BAD_BATCHES))
def test_one_at_a_time_a_failing_sub_batch_stops_the_batches_after_it(
    wm: WireMock, spans: Spans, bad: str
) -> None:
    """With ``max_concurrency=1`` the sync client sends its batches in order: the first
    answers, the second fails, the third is never sent."""
    response, bad_attempts = BAD_BATCHES[bad]
    stub_one_bad_batch(wm, "/part/rerank", response)
    cands = candidates(5)
    run = run_once(
        "sync", spans, wm.url + "/part", cands,
        batch_size=2, max_retries=1, timeout=DEADLINE, max_concurrency=1,
    )  # fmt: skip
    error = {"status": "RerankStatusError", "wrong-labels": "RerankProtocolError"}
    assert_fell_back(run, cands, error.get(bad, "RerankTransportError"))
    assert len(wm.requests("/part/rerank")) == 1 + bad_attempts


# -- batch-size refusals -------------------------------------------------------------------


REFUSAL = {"error": "batch size 4 > maximum allowed batch size 2", "error_type": "Validation"}


def stub_refusing_batches_over_two(wm: WireMock, path: str, status: int) -> None:
    stub_reversed(wm, path, range(1, 3))
    wm.stub(
        {
            "priority": 1,
            "request": {
                "method": "POST",
                "urlPath": path,
                "bodyPatterns": [{"matchesJsonPath": "$.texts[2]"}],
            },
            "response": json_response(REFUSAL, status),
        }
    )


def texts_per_request(wm: WireMock, path: str) -> list[int]:
    return [len(body["texts"]) for body in wm.bodies(path)]


@pytest.mark.parametrize("status", [413, 422])
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_batch_size_refusal_splits_once_and_is_remembered(
    wm: WireMock, spans: Spans, flavour: Flavour, status: int
) -> None:
    stub_refusing_batches_over_two(wm, "/capped/rerank", status)
    cands = candidates(4)
    with capture_logs() as logs:
        first, second = run_stage(
            flavour, spans, wm.url + "/capped", cands, calls=2, batch_size=4, timeout=DEADLINE
        )
    # Results are mapped per sub-batch: each half comes back reversed within itself.
    for run in (first, second):
        assert_every_candidate_once(run.outputs, cands)
        assert all(o.reranked for o in run.outputs)
        assert run.elapsed < DEADLINE + SCHEDULING_MARGIN
        assert run.span.status.status_code == StatusCode.OK
    assert texts_per_request(wm, "/capped/rerank") == [4, 2, 2, 2, 2]
    assert first.client.batch_size == 2
    assert event_names(first.span) == ["rerank.batch_split"]
    (split,) = [e.attributes for e in first.span.events]
    assert dict(split or {}) == {
        "batch_offset": 0,
        "refused": 4,
        "split_to": 2,
        "caused_by": f"HTTP {status}",
    }
    assert event_names(second.span) == [], "the second call sends batches of 2 at once"
    learned = [e for e in logs if e["event"] == "rerank.batch_size_learned"]
    assert [(e["batch_size"], e["refused"]) for e in learned] == [(2, 4)], "logged once"


def test_learned_cap_also_splits_the_batches_already_planned(wm: WireMock, spans: Spans) -> None:
    stub_refusing_batches_over_two(wm, "/capped/rerank", 413)
    cands = candidates(8)
    # One request at a time, so the second batch of 4 is sent after the cap was learned.
    run = run_once(
        "sync", spans, wm.url + "/capped", cands, batch_size=4, timeout=DEADLINE, max_concurrency=1
    )
    assert_every_candidate_once(run.outputs, cands)
    assert texts_per_request(wm, "/capped/rerank") == [4, 2, 2, 2, 2], (
        "the second batch of 4 goes out as two of 2, without a second refusal"
    )


def stub_plain_413_above(wm: WireMock, path: str, largest_accepted: int) -> None:
    """A proxy's plain-text 413 for any request with more than `largest_accepted` texts."""
    stub_reversed(wm, path, range(1, largest_accepted + 1))
    wm.stub(
        {
            "priority": 1,
            "request": {
                "method": "POST",
                "urlPath": path,
                "bodyPatterns": [{"matchesJsonPath": f"$.texts[{largest_accepted}]"}],
            },
            "response": {
                "status": 413,
                "headers": {"Content-Type": "text/plain"},
                "body": "Failed to buffer the request body: length limit exceeded",
            },
        }
    )


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_plain_413_halves_down_to_single_texts(
    wm: WireMock, spans: Spans, flavour: Flavour
) -> None:
    stub_plain_413_above(wm, "/too-large/rerank", 1)
    cands = candidates(4)
    run = run_once(flavour, spans, wm.url + "/too-large", cands, batch_size=4, timeout=DEADLINE)
    assert run.elapsed < DEADLINE + SCHEDULING_MARGIN
    assert_every_candidate_once(run.outputs, cands)
    assert all(o.reranked for o in run.outputs)
    assert sorted(texts_per_request(wm, "/too-large/rerank")) == [1, 1, 1, 1, 2, 2, 4]
    assert event_names(run.span).count("rerank.batch_split") == 3
    assert run.client.batch_size == 4, "a plain 413 states no cap to remember"


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_plain_413_for_a_single_text_gives_up_and_falls_back(
    wm: WireMock, spans: Spans, flavour: Flavour
) -> None:
    wm.stub(
        {
            "request": {"method": "POST", "urlPath": "/huge/rerank"},
            "response": {"status": 413, "body": "Payload Too Large"},
        }
    )
    cands = candidates(4)
    run = run_once(flavour, spans, wm.url + "/huge", cands, batch_size=4, timeout=DEADLINE)
    assert run.elapsed < DEADLINE + SCHEDULING_MARGIN
    assert_fell_back(run, cands, "RerankStatusError")
    sizes = texts_per_request(wm, "/huge/rerank")
    assert sizes[:2] == [4, 2]
    assert 1 in sizes
    assert len(sizes) <= 7


# -- a client that the test can break at will ----------------------------------------------


def test_run_stage_helper_detects_a_wrong_order(wm: WireMock, spans: Spans) -> None:
    """The assertions above can fail: a reranked run is not a fallback, and vice versa."""
    stub_reversed(wm, "/ok/rerank", range(1, 4))
    cands = candidates(3)
    run = run_once("sync", spans, wm.url + "/ok", cands)
    assert_reranked(run, cands)
    with pytest.raises(AssertionError):
        assert_fell_back(run, cands, "RerankTransportError")
