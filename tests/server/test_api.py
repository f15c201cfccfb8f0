"""The HTTP API against a real server on loopback: TEI's shapes, the sidecar's, /info, errors.

Scores are checked against sentence-transformers run directly in this process, one text at a
time (`tests._minilm.reference_cosines`), and mapped back by ``index`` / ``id``: a score on the
wrong text fails here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from .served import Served

QUERY = "how do I delete a directory tree"
TEXTS = [
    "json.dumps serializes an object to a JSON string",
    "shutil.rmtree removes a directory and everything below it",
    "os.rmdir removes an empty directory",
    "pathlib.Path.unlink removes a file",
    "bananas are yellow",
]
SECRET = "SECRETMARK93f1"


def post(url: str, body: object, **kw: object) -> httpx.Response:
    return httpx.post(url + "/rerank", json=body, timeout=60.0, **kw)  # type: ignore[arg-type]


def test_tei_shape_is_a_bare_array_sorted_by_score_and_mapped_by_index(
    embedding_server: Served,
) -> None:
    from tests._minilm import reference_cosines

    reply = post(embedding_server.url, {"query": QUERY, "texts": TEXTS})
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"] == "application/json"
    ranks = reply.json()
    assert isinstance(ranks, list)
    assert sorted(r["index"] for r in ranks) == list(range(len(TEXTS)))
    assert [r["score"] for r in ranks] == sorted((r["score"] for r in ranks), reverse=True)
    assert [r["index"] for r in ranks] != list(range(len(TEXTS))), "sorted, not input order"
    expected = reference_cosines(QUERY, TEXTS)
    for r in ranks:
        assert set(r) == {"index", "score"}
        assert r["score"] == pytest.approx(expected[r["index"]], abs=1e-5)
    assert ranks[0]["index"] == 1, "shutil.rmtree answers the question"
    assert int(reply.headers["x-compute-tokens"]) > len(TEXTS)


def test_return_text_adds_each_text_to_its_own_rank(lexical_server: Served) -> None:
    ranks = post(lexical_server.url, {"query": QUERY, "texts": TEXTS, "return_text": True}).json()
    assert {r["index"]: r["text"] for r in ranks} == dict(enumerate(TEXTS))


def test_sidecar_shape_answers_in_input_order_by_id(embedding_server: Served) -> None:
    from tests._minilm import reference_cosines

    ids = [f"doc-{i * 7}" for i in range(len(TEXTS))]
    reply = post(
        embedding_server.url,
        {
            "query": QUERY,
            "documents": [{"id": i, "text": t} for i, t in zip(ids, TEXTS, strict=True)],
        },
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert list(body) == ["scores"]
    assert [s["id"] for s in body["scores"]] == ids, "input order, not sorted"
    expected = reference_cosines(QUERY, TEXTS)
    for entry, score in zip(body["scores"], expected, strict=True):
        assert entry["score"] == pytest.approx(score, abs=1e-5)


def test_info_has_teis_fields_and_health_says_ready(embedding_server: Served) -> None:
    info = httpx.get(embedding_server.url + "/info", timeout=10.0).json()
    assert info["model_id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert info["max_client_batch_size"] == 32  # the fixture's; the default is 128
    assert info["max_batch_tokens"] == 16384
    assert info["max_input_length"] == 256
    assert info["reranker"] == "embedding"
    assert "reranker" in info["model_type"]
    for key in ("version", "max_concurrent_requests", "auto_truncate", "model_dtype"):
        assert key in info
    health = httpx.get(embedding_server.url + "/health", timeout=10.0)
    assert health.status_code == 200


def _error(reply: httpx.Response, status: int, kind: str) -> str:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/json"
    body = reply.json()
    assert set(body) == {"error", "error_type"}
    assert body["error_type"] == kind
    message: str = body["error"]
    assert SECRET not in message, "the caller's text is never echoed"
    return message


def test_more_texts_than_the_cap_are_refused_in_teis_words(lexical_server: Served) -> None:
    texts = [f"{SECRET} {i}" for i in range(200)]
    reply = post(lexical_server.url, {"query": SECRET, "texts": texts})
    assert _error(reply, 422, "Validation") == "batch size 200 > maximum allowed batch size 128"
    from retrieval_stage.client.error_bodies import batch_size_refusal

    assert batch_size_refusal(reply.json()["error"]) == 128, "our client reads the cap"
    docs = [{"id": str(i), "text": t} for i, t in enumerate(texts[:129])]
    sidecar = post(lexical_server.url, {"query": SECRET, "documents": docs})
    assert _error(sidecar, 422, "Validation") == "batch size 129 > maximum allowed batch size 128"
    at_cap = post(lexical_server.url, {"query": SECRET, "texts": texts[:100]})
    assert at_cap.status_code == 200, "a 100-candidate request is served in one call"


@pytest.mark.parametrize(
    ("body", "status", "kind", "says"),
    [
        ({"query": SECRET, "texts": []}, 400, "Empty", "`texts` cannot be empty"),
        ({"query": SECRET, "documents": []}, 400, "Empty", "`documents` cannot be empty"),
        ({"texts": [SECRET]}, 422, "Validation", "missing field `query`"),
        ({"query": SECRET}, 422, "Validation", "neither"),
        ({"query": SECRET, "texts": [SECRET], "documents": []}, 422, "Validation", "both"),
        ({"query": SECRET, "texts": SECRET}, 422, "Validation", "`texts` must be an array"),
        ({"query": SECRET, "texts": [SECRET, 7]}, 422, "Validation", "`texts[1]` must be a"),
        ({"query": 3, "texts": [SECRET]}, 422, "Validation", "`query` must be a string"),
        (
            {"query": SECRET, "texts": [SECRET], "raw_scores": "yes"},
            422,
            "Validation",
            "`raw_scores` must be a boolean",
        ),
        (
            {"query": SECRET, "texts": [SECRET], "truncation_direction": "Left"},
            422,
            "Validation",
            "truncation_direction",
        ),
        (
            {"query": SECRET, "documents": [{"id": "a", "text": SECRET}, SECRET]},
            422,
            "Validation",
            "`documents[1]` must be an object",
        ),
        (
            {"query": SECRET, "documents": [{"id": "a"}]},
            422,
            "Validation",
            "`documents[0]` has no `text`",
        ),
        (
            {"query": SECRET, "documents": [{"id": "a", "text": SECRET}] * 2},
            422,
            "Validation",
            "`documents[1].id` repeats the id of `documents[0]`",
        ),
        ([SECRET], 422, "Validation", "must be a JSON object"),
    ],
)
def test_bad_bodies_name_what_was_wrong_and_never_echo_the_texts(
    lexical_server: Served, body: object, status: int, kind: str, says: str
) -> None:
    assert says in _error(post(lexical_server.url, body), status, kind)


def test_malformed_json_and_the_wrong_media_type(lexical_server: Served) -> None:
    url = lexical_server.url + "/rerank"
    headers = {"content-type": "application/json"}
    broken = httpx.post(url, content=b'{"query": "' + SECRET.encode() + b'", ', headers=headers)
    assert "not valid JSON" in _error(broken, 400, "Validation")
    form = httpx.post(url, content=json.dumps({"query": "q", "texts": ["t"]}).encode())
    assert "Content-Type: application/json" in _error(form, 415, "UnsupportedMediaType")


def test_a_body_over_the_limit_is_refused_unread(lexical_server: Served) -> None:
    big = {"query": "q", "texts": [SECRET * 80_000]}  # ~1.1 MB
    reply = post(lexical_server.url, {"query": "q", "texts": [SECRET * 160_000]})  # ~2.2 MB
    assert "2000000-byte limit" in _error(reply, 413, "PayloadTooLarge")
    assert post(lexical_server.url, big).status_code == 200


def _post_chunked(url: str, chunks: int) -> httpx.Response:
    """A TEI body of one text of `chunks` 14 KB chunks, sent chunked (no Content-Length)."""

    def body() -> Iterator[bytes]:
        yield b'{"query": "q", "texts": ["'
        for _ in range(chunks):
            yield SECRET.encode() * 1000  # 14 KB a chunk
        yield b'"]}'

    reply = httpx.post(
        url + "/rerank",
        content=body(),
        headers={"content-type": "application/json"},
        timeout=60.0,
    )
    assert "content-length" not in reply.request.headers
    return reply


def test_a_chunked_body_is_cut_off_at_the_limit(lexical_server: Served) -> None:
    """No Content-Length to refuse by: the server stops reading once the limit is passed."""
    reply = _post_chunked(lexical_server.url, 300)  # ~4.2 MB
    assert "2000000-byte limit" in _error(reply, 413, "PayloadTooLarge")


def test_a_chunked_body_just_over_the_limit_is_refused(lexical_server: Served) -> None:
    """A tenth over the 2,000,000-byte limit, in valid JSON: refused, not read on to some larger
    bound (a mutation reading up to twice the limit went unnoticed by the 4 MB test above)."""
    reply = _post_chunked(lexical_server.url, 157)  # ~2.2 MB
    assert "2000000-byte limit" in _error(reply, 413, "PayloadTooLarge")


def test_unknown_paths_and_methods_answer_in_teis_shape(lexical_server: Served) -> None:
    _error(httpx.get(lexical_server.url + "/nope"), 404, "NotFound")
    _error(httpx.get(lexical_server.url + "/rerank"), 405, "MethodNotAllowed")


def test_truncate_false_refuses_a_text_longer_than_the_model_reads(
    embedding_server: Served,
) -> None:
    long_text = " ".join([SECRET] * 400)
    ok = post(embedding_server.url, {"query": QUERY, "texts": ["short", long_text]})
    assert ok.status_code == 200, "truncated by default (TEI's --auto-truncate)"
    refused = post(
        embedding_server.url, {"query": QUERY, "texts": ["short", long_text], "truncate": False}
    )
    message = _error(refused, 422, "Validation")
    assert "must have less than 256 tokens" in message
    assert "`texts[1]`" in message


def test_every_request_is_one_json_log_line_without_texts(lexical_server: Served) -> None:
    post(lexical_server.url, {"query": SECRET, "texts": [SECRET, "other"]})
    assert SECRET not in lexical_server.log_text()
    lines = [line for line in lexical_server.log_lines() if line["event"] == "server.request"]
    assert lines, "one server.request line per request"
    last = lines[-1]
    assert last["status"] == 200
    assert last["texts"] == 2
    assert last["shape"] == "tei"
    # Spans are made even when none are exported: the line carries the request's trace id.
    assert len(last["trace_id"]) == 32


def test_a_refused_request_is_logged_with_the_status_and_type_it_was_answered(
    lexical_server: Served,
) -> None:
    """The access-log line of a refusal says what the caller got: its status and TEI's error
    type, the shape still unknown (refused while parsing) and no batch run."""
    _error(post(lexical_server.url, {"query": QUERY, "texts": []}), 400, "Empty")
    lines = [line for line in lexical_server.log_lines() if line["event"] == "server.request"]
    last = lines[-1]
    assert (last["status"], last["error_type"]) == (400, "Empty")
    assert (last["shape"], last["texts"], last["batches"], last["tokens"]) == ("unknown", 0, 0, 0)
