"""What a server echoes back never reaches an error, and a cap it states is learned.

A marker sits in the query and in one document; every provider's error shape echoes them
(FastAPI's ``input``, messages quoting the text, JSON-escaped copies). The marker must appear
nowhere in the exception's message, repr or ``server_message``, nor in the client's log lines,
while the server's own explanation survives.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from retrieval_stage import AsyncRerankClient, RerankClient, RerankError, RerankStatusError
from retrieval_stage._redact import ECHO_MIN_CHARS, scrub
from retrieval_stage.client.error_bodies import batch_cap, batch_size_refusal

QMARK = "Qmarker7f3a9b"
DMARK = "Dmarker0c2e55"
QUERY = f"which {QMARK} is it"
DOCS = ["a plain first document", f'the "second" naïve {DMARK} document', "third"]
SECRET = "sk-sanitize-test-key"


def echo_bodies() -> dict[str, tuple[str, int, Any]]:
    """provider -> (the explanation that must survive, status, error body echoing our text)."""
    doc = DOCS[1]
    return {
        "tei": (
            "is too long",
            422,
            {"error": f"Input validation error: `{QUERY}` is too long", "error_type": "Validation"},
        ),
        "cohere": ("too long", 400, {"message": f"document '{doc}' too long"}),
        "jina": ("invalid document", 400, {"detail": f"invalid document: {doc}"}),
        "voyage": ("bad query", 400, {"detail": f"bad query {QUERY!r}"}),
        "vllm": (
            "exceeds",
            400,
            {"error": {"message": f"{doc} exceeds max length", "type": "BadRequestError"}},
        ),
        "infinity": (
            "string_too_long: String should have at most 10 characters",
            422,
            {
                "detail": [
                    {
                        "type": "string_too_long",
                        "loc": ["body", "documents", 1],
                        "msg": "String should have at most 10 characters",
                        "input": doc,
                        "ctx": {"max_length": 10},
                    },
                    {
                        "type": "missing",
                        "loc": ["body", "x"],
                        "msg": f"near {QUERY}",
                        "input": DOCS,
                    },
                ]
            },
        ),
    }


def handler_answering(status: int, body: Any) -> httpx.MockTransport:
    return httpx.MockTransport(lambda request: httpx.Response(status, json=body))


def assert_no_marker(exc: BaseException, logs: Sequence[Mapping[str, Any]]) -> None:
    shown = [str(exc), repr(exc), getattr(exc, "server_message", ""), json.dumps(logs, default=str)]
    for text in shown:
        for marker in (QMARK, DMARK, SECRET):
            assert marker not in text, text


@pytest.mark.parametrize("provider", sorted(echo_bodies()))
def test_a_server_echo_of_query_or_document_never_reaches_the_error(provider: str) -> None:
    kept, status, body = echo_bodies()[provider]
    http = httpx.Client(transport=handler_answering(status, body))
    with (
        capture_logs() as logs,
        RerankClient(
            "http://r.test", provider=provider, model="m", http_client=http, api_key=SECRET
        ) as c,
        pytest.raises(RerankStatusError) as caught,
    ):
        c.rerank(QUERY, DOCS)
    assert_no_marker(caught.value, logs)
    assert kept in caught.value.server_message
    assert str(caught.value).startswith(f"{provider} answered HTTP {status}: ")


def test_fastapi_input_fields_are_dropped_and_type_and_msg_kept() -> None:
    body = {
        "detail": [
            {
                "type": "too_long",
                "loc": ["body", "documents"],
                "msg": "List should have at most 2 items after validation, not 3",
                "input": DOCS,
            }
        ]
    }
    http = httpx.Client(transport=handler_answering(422, body))
    with (
        RerankClient("http://r.test", provider="infinity", http_client=http) as c,
        pytest.raises(RerankStatusError) as caught,
    ):
        # batch of one: the stated cap (2) is not below it, so nothing is split
        c.rerank(QUERY, [DOCS[1]])
    assert caught.value.server_message == (
        "too_long: List should have at most 2 items after validation, not 3 (at body.documents)"
    )


async def test_the_async_client_sanitises_the_same_way() -> None:
    _, status, body = echo_bodies()["infinity"]
    http = httpx.AsyncClient(transport=handler_answering(status, body))
    with capture_logs() as logs, pytest.raises(RerankStatusError) as caught:
        async with AsyncRerankClient("http://r.test", provider="infinity", http_client=http) as c:
            await c.rerank(QUERY, DOCS)
    assert_no_marker(caught.value, logs)


def test_a_plain_text_or_json_escaped_echo_is_removed_too() -> None:
    escaped = json.dumps(DOCS[1])  # \"second\" and \u00ef as a server's JSON would have them
    http = httpx.Client(transport=httpx.MockTransport(
        lambda r: httpx.Response(400, text=f"bad input {escaped} and {QUERY[:-2]}")
    ))  # fmt: skip
    with (
        RerankClient("http://r.test", http_client=http) as c,
        pytest.raises(RerankStatusError) as caught,
    ):
        c.rerank(QUERY, DOCS)
    assert_no_marker(caught.value, [])
    assert caught.value.server_message.startswith("bad input ")


def test_scrub_keeps_short_overlaps_and_caps_the_rest() -> None:
    short = "x" * (ECHO_MIN_CHARS - 1)
    assert scrub(f"error near {short}!", [f"a{short}b"]) == f"error near {short}!"
    assert scrub("abcdefghij-tail", ["zzabcdefghijzz"]) == "<echo removed>-tail"
    assert len(scrub("y" * 5000, [], limit=300)) == 300


def test_a_2xx_that_is_not_json_does_not_quote_our_text_either() -> None:
    http = httpx.Client(transport=httpx.MockTransport(
        lambda r: httpx.Response(200, text=f"<html>{DMARK}</html>",
                                 headers={"content-type": "text/html"})
    ))  # fmt: skip
    with RerankClient("http://r.test", http_client=http) as c, pytest.raises(RerankError) as caught:
        c.rerank(QUERY, DOCS)
    assert "not valid JSON (text/html)" in str(caught.value)
    assert_no_marker(caught.value, [])


# -- batch caps stated by servers other than TEI ---------------------------------------------


def infinity_like(cap: int, *, structured: bool) -> tuple[httpx.MockTransport, list[int]]:
    """A server refusing more than `cap` documents as Infinity does (422, FastAPI shape)."""
    sizes: list[int] = []

    def handle(request: httpx.Request) -> httpx.Response:
        docs = json.loads(request.content)["documents"]
        sizes.append(len(docs))
        if len(docs) > cap:
            msg = f"List should have at most {cap} items after validation, not {len(docs)}"
            entry: dict[str, Any] = {"type": "too_long", "loc": ["body", "documents"]}
            entry |= {"msg": msg, "input": docs}
            if structured:
                entry["ctx"] = {"field_type": "List", "max_length": cap, "actual_length": len(docs)}
                entry["msg"] = "too many"
            return httpx.Response(422, json={"detail": [entry]})
        results = [{"index": i, "relevance_score": 1.0 / (i + 1)} for i in range(len(docs))]
        return httpx.Response(200, json={"results": results})

    return httpx.MockTransport(handle), sizes


@pytest.mark.parametrize("structured", [False, True], ids=["message", "ctx"])
def test_infinitys_cap_is_learned_split_and_remembered(structured: bool) -> None:
    transport, sizes = infinity_like(2, structured=structured)
    texts = [f"t{i}" for i in range(5)]
    with (
        capture_logs() as logs,
        RerankClient("http://r.test", provider="infinity", http_client=httpx.Client(
            transport=transport)) as c,
    ):  # fmt: skip
        first = c.rerank("q", texts)
        assert c.batch_size == 2
        c.rerank("q", texts)
    assert sizes == [5, 2, 2, 1, 2, 2, 1]
    assert sorted(t for t, _ in first) == texts
    learned = [e for e in logs if e["event"] == "rerank.batch_size_learned"]
    assert [(e["batch_size"], e["refused"]) for e in learned] == [(2, 5)]


async def test_the_async_client_resplits_its_planned_batches_to_a_learned_cap() -> None:
    transport, sizes = infinity_like(2, structured=True)
    texts = [f"t{i}" for i in range(8)]
    http = httpx.AsyncClient(transport=transport)
    async with AsyncRerankClient(
        "http://r.test", provider="infinity", http_client=http, batch_size=4
    ) as c:
        result = await c.rerank("q", texts)
    assert c.batch_size == 2
    assert sorted(t for t, _ in result) == texts
    # two planned batches of 4, each refused, then (at most) four of 2: never more than 2 after
    assert sorted(sizes)[-2:] == [4, 4]
    assert sorted(sizes)[:-2] == [2, 2, 2, 2]


def test_a_too_long_string_is_not_taken_for_a_list_cap() -> None:
    body = {"detail": [{"type": "too_long", "ctx": {"max_length": 2, "actual_length": 900}}]}
    assert batch_cap(json.dumps(body).encode(), sent=5) is None
    body["detail"][0]["ctx"]["actual_length"] = 5  # type: ignore[index]
    assert batch_cap(json.dumps(body).encode(), sent=5) == 2


def test_batch_size_refusal_reads_tei_and_pydantic_wording() -> None:
    assert batch_size_refusal("batch size 64 > maximum allowed batch size 32") == 32
    assert batch_size_refusal("List should have at most 100 items after validation, not 300") == 100
    assert batch_size_refusal("something else") is None


# -- what a review found: partial keys, cut windows, protocol details, size, nesting ---------


def _pieces(secret: str, n: int = 8) -> list[str]:
    return [secret[i : i + n] for i in range(len(secret) - n + 1)]


def test_a_half_masked_echo_of_the_key_is_replaced() -> None:
    """OpenAI-style 401s quote the key with its middle starred: what they show is still the key."""
    shown = f"Incorrect API key provided: {SECRET[:12]}****{SECRET[-4:]}"
    http = httpx.Client(transport=handler_answering(401, {"error": {"message": shown}}))
    with (
        RerankClient("http://r.test", provider="vllm", http_client=http, api_key=SECRET) as c,
        pytest.raises(RerankStatusError) as caught,
    ):
        c.rerank(QUERY, DOCS)
    for piece in _pieces(SECRET):
        assert piece not in str(caught.value)
    assert "Incorrect API key provided" in caught.value.server_message


def test_a_key_at_the_edge_of_a_cut_non_json_answer_is_not_left_in_half() -> None:
    body = (("x" * 150) + " " + SECRET).encode()
    http = httpx.Client(
        transport=httpx.MockTransport(
            lambda r: httpx.Response(200, content=body, headers={"content-type": "text/plain"})
        )
    )
    with (
        RerankClient("http://r.test", http_client=http, api_key=SECRET) as c,
        pytest.raises(RerankError) as caught,
    ):
        c.rerank(QUERY, DOCS)
    for piece in _pieces(SECRET):
        assert piece not in str(caught.value)


def test_a_document_echoed_inside_a_malformed_result_is_not_quoted() -> None:
    """A protocol error quotes the offending value: here the server put a document there."""
    http = httpx.Client(
        transport=handler_answering(200, [{"index": DOCS[1], "score": 0.3}, {"index": 0}])
    )
    with (
        capture_logs() as logs,
        RerankClient("http://r.test", http_client=http) as c,
        pytest.raises(RerankError) as caught,
    ):
        c.rerank(QUERY, DOCS)
    assert_no_marker(caught.value, logs)
    assert "not a tei response" in str(caught.value)


def test_only_what_can_be_quoted_is_cleaned(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 30 KB error page against 1,000 documents: the cleaning sees at most two messages' worth
    of text, so its cost is bounded by that, not by the size of the page."""
    from retrieval_stage import _redact as _sanitize

    seen: list[int] = []
    real = _sanitize._mask_runs

    def spy(text: str, hay: str, n: int, replacement: str) -> str:
        seen.append(len(text))
        return real(text, hay, n, replacement)

    monkeypatch.setattr(_sanitize, "_mask_runs", spy)
    page = ("<p>gateway error</p>" * 1500).encode()
    http = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(502, content=page)))
    documents = [f"document number {i} with some words in it" for i in range(1000)]
    with (
        RerankClient("http://r.test", http_client=http, max_retries=0, batch_size=1000) as c,
        pytest.raises(RerankStatusError),
    ):
        c.rerank(QUERY, documents)
    assert seen
    assert max(seen) <= 2 * _sanitize.LIMIT


@pytest.mark.parametrize("status", [200, 500])
def test_absurdly_nested_json_is_a_rerank_error_not_a_recursion_error(status: int) -> None:
    body = b"[" * 100_000 + b"]" * 100_000
    http = httpx.Client(
        transport=httpx.MockTransport(lambda r: httpx.Response(status, content=body))
    )
    with (
        RerankClient("http://r.test", http_client=http, max_retries=0) as c,
        pytest.raises(RerankError),
    ):
        c.rerank(QUERY, DOCS)


def test_errors_survive_pickling_with_their_attributes() -> None:
    import pickle

    from retrieval_stage import RerankTransportError

    status = pickle.loads(pickle.dumps(RerankStatusError(503, "busy", provider="tei")))
    assert (status.status_code, status.server_message, status.provider) == (503, "busy", "tei")
    transport = pickle.loads(pickle.dumps(RerankTransportError("m", kind="connect", cause="X")))
    assert (transport.kind, transport.cause, str(transport)) == ("connect", "X", "m")


async def test_an_unexpected_error_in_a_split_async_call_is_raised_bare() -> None:
    """Not wrapped in an ExceptionGroup: the sync client raises it bare too."""

    def boom(request: httpx.Request) -> httpx.Response:
        raise ValueError("transport bug")

    async with AsyncRerankClient(
        "http://r.test",
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(boom)),
        batch_size=1,
    ) as c:
        with pytest.raises(ValueError, match="transport bug"):
            await c.rerank(QUERY, DOCS)
