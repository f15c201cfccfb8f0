"""What the command says when the reranker fails: the demo's fallback, --repeat going on
through failures, and messages that name what happened (the hint only where it is likely)."""

from __future__ import annotations

import socket

import pytest

from retrieval_stage.cli.failure import (
    MAX_BACKOFF_S,
    Witness,
    backoff_s,
    describe,
    transport_kind,
)
from retrieval_stage.errors import (
    RerankError,
    RerankProtocolError,
    RerankStatusError,
    RerankTransportError,
)

from ..conftest import WireMock
from .test_commands import (
    CANDIDATES,
    flat,
    invoke,
)

URL = "http://rerank.internal:8080"


def failing_tei(wm: WireMock, status: int = 500) -> str:
    wm.stub_json("/tei/rerank", {"error": "model crashed", "error_type": "Backend"}, status=status)
    return wm.url + "/tei"


def test_demo_against_a_failing_service_shows_the_fallback_table_with_the_reason(
    wm: WireMock,
) -> None:
    result = invoke("demo", "--top-k", "3", "--endpoint", failing_tei(wm))
    assert result.exit_code == 3, result.stderr
    out = flat(result.stdout)
    assert "fallback: the reranker failed" in out
    assert f"{wm.url}/tei answered HTTP 500: model crashed" in out
    assert "showing recall order" in out
    rows = [line for line in result.stdout.splitlines() if "json." in line]
    assert len(rows) == 3
    for number, row in enumerate(rows, start=1):
        cells = [cell.strip() for cell in row.split("│")]
        assert cells[0] == cells[1] == str(number)  # recall order: nothing moved
        assert cells[3] == "—"  # no rerank score: the bm25 column keeps recall's
    assert "up?" not in result.stdout + result.stderr


def test_demo_repeat_keeps_going_through_failures_and_counts_them(wm: WireMock) -> None:
    result = invoke(
        "demo", "--top-k", "2", "--repeat", "5", "--interval", "0",
        "--endpoint", failing_tei(wm),
    )  # fmt: skip
    assert result.exit_code == 3, result.stderr
    err = flat(result.stderr)
    for run in range(2, 6):
        assert f"run {run}: fell back to recall order" in err
    assert "5 runs, 5 fell back to recall order" in err
    assert len(wm.requests("/tei/rerank")) >= 5  # each run asked (500s are retried, too)


def test_demo_that_reranks_exits_0() -> None:
    result = invoke("demo", "--top-k", "2", "--reranker", "lexical")
    assert result.exit_code == 0, result.stderr
    assert "fallback" not in result.stdout


def test_an_answer_that_is_not_tei_is_named_so(wm: WireMock) -> None:
    wm.stub_json("/odd/rerank", {"results": "nope"})
    result = invoke("rerank", "-q", "q", "--endpoint", wm.url + "/odd", stdin=CANDIDATES)
    assert result.exit_code == 1
    assert f"{wm.url}/odd answered something that is not a TEI response:" in flat(result.stderr)
    assert "up?" not in result.stderr


def test_a_closed_port_is_could_not_connect_with_the_hint() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    result = invoke("rerank", "-q", "q", "--endpoint", url, "--timeout", "3", stdin=CANDIDATES)
    assert result.exit_code == 1
    assert f"could not connect to {url}" in flat(result.stderr)
    assert "is the service up?" in flat(result.stderr)


def test_no_answer_names_the_deadline_and_the_option(wm: WireMock) -> None:
    wm.stub_json("/slow/rerank", [], fixedDelayMilliseconds=5000)
    result = invoke(
        "rerank", "-q", "q", "--endpoint", wm.url + "/slow", "--timeout", "0.5", stdin=CANDIDATES
    )
    assert result.exit_code == 1
    assert "no answer within the 0.5 s deadline (--timeout)" in flat(result.stderr)
    assert "up?" not in result.stderr


# -- the words, keyed on the error's type and attributes ------------------------------------


def test_status_error_quotes_the_servers_message_and_hints_only_for_likely_causes() -> None:
    failure = describe(RerankStatusError(500, "model crashed"), base_url=URL)
    assert failure.message == f"{URL} answered HTTP 500: model crashed"
    assert failure.hint is None
    unauthorised = describe(RerankStatusError(401, ""), base_url=URL)
    assert unauthorised.message == f"{URL} answered HTTP 401 with no message"
    assert unauthorised.hint is not None
    assert "--api-key" in unauthorised.hint


def test_protocol_error_names_the_provider() -> None:
    failure = describe(RerankProtocolError("index 7 out of range"), base_url=URL, provider="tei")
    assert failure.message == (
        f"{URL} answered something that is not a TEI response: index 7 out of range"
    )
    cohere = describe(RerankProtocolError("x"), base_url=URL, provider="cohere")
    assert "not a cohere response" in cohere.message


def test_transport_kind_reads_the_errors_kind_not_its_message() -> None:
    assert transport_kind(RerankTransportError("timed out", kind="connect")) == "connect"
    assert transport_kind(RerankTransportError("could not connect", kind="timeout")) == "timeout"
    assert transport_kind(RerankTransportError("x", kind="deadline")) == "timeout"
    assert transport_kind(RerankTransportError("connection refused")) == "other"


def test_the_up_hint_only_for_a_connection_never_made() -> None:
    connect = describe(RerankTransportError("x", kind="connect"), base_url=URL)
    assert connect.message == f"could not connect to {URL}"
    assert connect.hint is not None
    assert connect.hint.startswith("is the service up?")
    timeout = describe(RerankTransportError("x", kind="deadline"), base_url=URL, timeout=30)
    assert timeout.message == f"{URL}: no answer within the 30 s deadline (--timeout)"
    assert timeout.hint is None
    reset = describe(RerankTransportError("reset"), base_url=URL)
    assert reset.message == f"the connection to {URL} failed: reset"
    assert reset.hint is None


def test_credentials_never_appear_in_the_words() -> None:
    url = "http://user:sekrit-pw@rerank.internal:8080"
    failure = describe(RerankStatusError(500, f"bad url {url}"), base_url=url)
    assert "sekrit" not in str(failure)


def test_an_in_process_reranker_failure_is_said_as_is() -> None:
    assert describe(RerankError("model exploded"), base_url=None).message == (
        "the reranker failed: model exploded"
    )


# -- the witness and the backoff policy ------------------------------------------------------


class _Failing:
    model_name = "m"
    provider = "tei"

    def __init__(self) -> None:
        self.calls = 0

    def rerank(self, query: str, items: list[str], **kwargs: object) -> list[tuple[str, float]]:
        self.calls += 1
        if self.calls == 1:
            raise RerankStatusError(503, "warming up")
        return [(item, 1.0) for item in items]


def test_witness_remembers_the_last_failure_and_forgets_it_on_the_next_call() -> None:
    ticks = iter([0.0, 2.5, 3.0, 3.1])
    inner = _Failing()
    witness = Witness(inner, clock=lambda: next(ticks))
    with pytest.raises(RerankStatusError):
        witness.rerank("q", ["a"])
    assert isinstance(witness.last_error, RerankStatusError)
    assert witness.last_elapsed == 2.5
    assert witness.rerank("q", ["a"]) == [("a", 1.0)]
    assert witness.last_error is None
    assert (witness.model_name, witness.provider) == ("m", "tei")  # the stage names the real one


def test_backoff_doubles_after_failures_and_is_bounded() -> None:
    assert backoff_s(0, 1.0) == 1.0
    assert backoff_s(0, 0.0) == 0.0
    assert [backoff_s(n, 0.0) for n in (1, 2, 3)] == [0.1, 0.2, 0.4]
    assert [backoff_s(n, 1.0) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
    assert backoff_s(50, 1.0) == MAX_BACKOFF_S
    assert backoff_s(3, 60.0) == 60.0  # never shorter than the asked interval


def test_a_token_given_as_the_username_is_scrubbed() -> None:
    from retrieval_stage._redact import scrubbed_message as scrubbed

    url = "https://tok3n-s3cret@rerank.internal/api"
    said = scrubbed(f"refused tok3n-s3cret at {url}", url)
    assert "tok3n-s3cret" not in said
