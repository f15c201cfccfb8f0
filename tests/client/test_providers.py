"""Every provider's wire format against WireMock, plus the pure parts of `providers`.

Fixtures (tests/wiremock/mappings/provider-*.json) follow each API's documented response
shape, with results sorted by score rather than input order, so a client that joined by
position would attach every score to the wrong text. The texts are Cohere's documented
example; each provider answers under its own prefix: ``/<provider>/all`` (every text),
``/<provider>/top2`` (two results), ``/<provider>/error`` (the provider's error body) and
``/<provider>/slow`` (``all`` after 300 ms). TEI's live under ``/tei-example``.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from retrieval_stage import (
    PROVIDERS,
    AsyncRerankClient,
    Candidate,
    RerankClient,
    RerankProtocolError,
    RerankStage,
    RerankStatusError,
    Usage,
)
from retrieval_stage.client.error_bodies import error_message
from retrieval_stage.client.providers import WireFormat, build_request, get_format, parse_response
from retrieval_stage.spans import ATTR_USAGE_SEARCH_UNITS, ATTR_USAGE_TOTAL_TOKENS

from ..conftest import WireMock

QUERY = "What is the capital of the United States?"
TEXTS = [
    "Carson City is the capital city of the American state of Nevada.",
    "The Commonwealth of the Northern Mariana Islands is a group of islands in the Pacific "
    "Ocean. Its capital is Saipan.",
    "Washington, D.C. (also known as simply Washington or D.C.) is the capital of the United "
    "States.",
]
# What every fixture answers, best first: input 2, then 0, then 1.
RANKED = [(2, 0.9991), (0, 0.3526), (1, 0.0417)]


@dataclass(frozen=True)
class Doc:
    """A caller's own item: results must be these very objects."""

    name: str
    text: str


def docs() -> list[Doc]:
    return [Doc(f"doc-{i}", t) for i, t in enumerate(TEXTS)]


@dataclass(frozen=True)
class Case:
    """One provider as its documentation describes it (written out, not read from PROVIDERS)."""

    provider: str
    prefix: str
    path: str
    model: str | None
    body: dict[str, Any]
    top_n_field: str | None
    usage: Usage
    reported_model: str | None
    error_status: int
    error_message: str
    extra: dict[str, Any] = field(default_factory=dict)

    def url(self, wm: WireMock, scenario: str) -> str:
        return f"{wm.url}{self.prefix}/{scenario}"

    def api(self, scenario: str) -> str:
        return f"{self.prefix}/{scenario}{self.path}"

    def __str__(self) -> str:
        return self.provider


def _docs_body(model: str, texts_field: str = "documents") -> dict[str, Any]:
    return {"query": QUERY, "model": model, texts_field: TEXTS}


CASES = [
    Case(
        provider="tei",
        prefix="/tei-example",
        path="/rerank",
        model=None,
        body={"query": QUERY, "texts": TEXTS},
        top_n_field=None,
        usage=Usage(total_tokens=21),
        reported_model=None,
        error_status=422,
        error_message="Input validation error: `texts` cannot be empty (Validation)",
    ),
    Case(
        provider="cohere",
        prefix="/cohere",
        path="/v2/rerank",
        model="rerank-v3.5",
        body=_docs_body("rerank-v3.5"),
        top_n_field="top_n",
        usage=Usage(search_units=1.0),
        reported_model=None,
        error_status=400,
        error_message="invalid request: list of documents must not be empty",
    ),
    Case(
        provider="jina",
        prefix="/jina",
        path="/v1/rerank",
        model="jina-reranker-v2-base-multilingual",
        body={**_docs_body("jina-reranker-v2-base-multilingual"), "return_documents": False},
        top_n_field="top_n",
        usage=Usage(total_tokens=38),
        reported_model="jina-reranker-v2-base-multilingual",
        error_status=400,
        error_message="Invalid model jina-reranker-v9, please check the model name",
    ),
    Case(
        provider="voyage",
        prefix="/voyage",
        path="/v1/rerank",
        model="rerank-2",
        body=_docs_body("rerank-2"),
        top_n_field="top_k",
        usage=Usage(total_tokens=26),
        reported_model="rerank-2",
        error_status=400,
        error_message="The number of documents exceeds the limit of 1000.",
    ),
    Case(
        provider="vllm",
        prefix="/vllm",
        path="/v1/rerank",
        model="BAAI/bge-reranker-v2-m3",
        body=_docs_body("BAAI/bge-reranker-v2-m3"),
        top_n_field="top_n",
        usage=Usage(total_tokens=30),
        reported_model="BAAI/bge-reranker-v2-m3",
        error_status=400,
        error_message="The model `bge` does not exist.",
    ),
    Case(
        provider="infinity",
        prefix="/infinity",
        path="/rerank",
        model="mixedbread-ai/mxbai-rerank-xsmall-v1",
        body=_docs_body("mixedbread-ai/mxbai-rerank-xsmall-v1"),
        top_n_field="top_n",
        usage=Usage(total_tokens=44),
        reported_model="mixedbread-ai/mxbai-rerank-xsmall-v1",
        error_status=400,
        error_message="ModelNotDeployedError: model=`x` does not support `rerank`.",
    ),
    Case(
        provider="mixedbread",
        prefix="/mixedbread",
        path="/v1/reranking",
        model="mixedbread-ai/mxbai-rerank-large-v2",
        body=_docs_body("mixedbread-ai/mxbai-rerank-large-v2", texts_field="input"),
        top_n_field="top_k",
        usage=Usage(total_tokens=120),
        reported_model="mixedbread-ai/mxbai-rerank-large-v2",
        error_status=400,
        error_message="Input must contain between 1 and 1000 items.",
    ),
    Case(
        provider="sidecar",
        prefix="/sidecar",
        path="/rerank",
        model=None,
        body={
            "query": QUERY,
            "documents": [{"id": str(i), "text": t} for i, t in enumerate(TEXTS)],
        },
        top_n_field=None,
        usage=Usage(),
        reported_model=None,
        error_status=503,
        error_message="reranker model is still loading",
    ),
]
TOP_N_CASES = [c for c in CASES if c.top_n_field is not None]
by_provider = pytest.mark.parametrize("case", CASES, ids=str)
by_top_n_provider = pytest.mark.parametrize("case", TOP_N_CASES, ids=str)


def client(case: Case, wm: WireMock, scenario: str, **kw: Any) -> RerankClient:
    kw.setdefault("model", case.model)
    kw.setdefault("max_retries", 0)
    return RerankClient(case.url(wm, scenario), provider=case.provider, **kw)


def expected(items: list[Doc], ranked: list[tuple[int, float]]) -> list[tuple[Doc, float]]:
    return [(items[i], score) for i, score in ranked]


# -- results, request bodies, usage and model -------------------------------------------------


@by_provider
def test_each_provider_maps_results_by_index_not_position(case: Case, wm: WireMock) -> None:
    items = docs()
    with client(case, wm, "all") as c:
        response = c.rerank_response(QUERY, items, text=lambda d: d.text)
    assert response.results == expected(items, RANKED)
    assert all(
        got is want
        for (got, _), (want, _) in zip(response.results, expected(items, RANKED), strict=True)
    )
    assert response.indices == [i for i, _ in RANKED]  # each result's position, as answered
    assert wm.bodies(case.api("all")) == [case.body]
    assert response.usage == case.usage
    assert response.model == (case.reported_model or case.model)
    assert (response.requests, response.batches) == (1, 1)


@by_provider
async def test_the_async_client_reports_each_results_index(case: Case, wm: WireMock) -> None:
    items = docs()
    async with AsyncRerankClient(
        case.url(wm, "all"), provider=case.provider, model=case.model, max_retries=0
    ) as c:
        response = await c.rerank_response(QUERY, items, text=lambda d: d.text)
    assert response.results == expected(items, RANKED)
    assert response.indices == [i for i, _ in RANKED]
    assert all(
        items[i] is item for i, (item, _) in zip(response.indices, response.results, strict=True)
    )


@pytest.mark.parametrize(
    "case", [c for c in CASES if not PROVIDERS[c.provider].requires_model], ids=str
)
def test_each_provider_reports_the_servers_model_when_none_is_configured(
    case: Case, wm: WireMock
) -> None:
    with client(case, wm, "all", model=None) as c:
        response = c.rerank_response(QUERY, TEXTS)
    assert response.model == case.reported_model
    assert "model" not in wm.bodies(case.api("all"))[0]


def test_tei_token_count_comes_from_the_x_compute_tokens_header(wm: WireMock) -> None:
    (tei,) = [c for c in CASES if c.provider == "tei"]
    with client(tei, wm, "all") as c:
        assert c.rerank_response(QUERY, TEXTS).usage == Usage(total_tokens=21)


# -- top-N: sent where the API takes one, and exactly that many results expected --------------


@by_top_n_provider
def test_top_k_is_sent_in_the_providers_own_top_n_field(case: Case, wm: WireMock) -> None:
    items = docs()
    with client(case, wm, "top2") as c:
        result = c.rerank(QUERY, items, text=lambda d: d.text, top_k=2)
    assert result == expected(items, RANKED[:2])
    (body,) = wm.bodies(case.api("top2"))
    assert case.top_n_field is not None
    assert body == {**case.body, case.top_n_field: 2}


@by_top_n_provider
def test_top_k_above_the_number_of_texts_sends_the_number_of_texts(
    case: Case, wm: WireMock
) -> None:
    with client(case, wm, "all") as c:
        result = c.rerank(QUERY, TEXTS, top_k=10)
    assert [t for t, _ in result] == [TEXTS[2], TEXTS[0], TEXTS[1]]
    (body,) = wm.bodies(case.api("all"))
    assert body[case.top_n_field] == 3


@by_provider
@pytest.mark.parametrize("top_k", [None, 0])
def test_top_k_none_or_zero_sends_no_top_n_and_expects_every_text(
    case: Case, wm: WireMock, top_k: int | None
) -> None:
    with client(case, wm, "all") as c:
        result = c.rerank(QUERY, TEXTS, top_k=top_k)
    assert len(result) == 3
    assert wm.bodies(case.api("all")) == [case.body]


@by_top_n_provider
def test_more_results_than_the_top_n_sent_is_a_protocol_error(case: Case, wm: WireMock) -> None:
    with (
        client(case, wm, "all") as c,
        pytest.raises(
            RerankProtocolError,
            match=f"{case.provider} answered something that is not a {case.provider} response: "
            "expected 2 results for 3 texts, got 3",
        ),
    ):
        c.rerank(QUERY, TEXTS, top_k=2)
    assert len(wm.requests(case.api("all"))) == 1, "a protocol error is not retried"


@by_top_n_provider
def test_fewer_results_than_every_text_is_a_protocol_error(case: Case, wm: WireMock) -> None:
    with (
        client(case, wm, "top2") as c,
        pytest.raises(RerankProtocolError, match="expected 3 results for 3 texts, got 2"),
    ):
        c.rerank(QUERY, TEXTS)


def test_tei_takes_no_top_n_so_top_k_is_cut_client_side(wm: WireMock) -> None:
    (tei,) = [c for c in CASES if c.provider == "tei"]
    with client(tei, wm, "all") as c:
        result = c.rerank(QUERY, TEXTS, top_k=2)
    assert result == [(TEXTS[2], 0.9991), (TEXTS[0], 0.3526)]
    assert wm.bodies(tei.api("all")) == [tei.body]


@by_provider
def test_negative_top_k_raises_before_any_request(case: Case, wm: WireMock) -> None:
    with client(case, wm, "all") as c, pytest.raises(ValueError, match="top_k must be >= 0"):
        c.rerank(QUERY, TEXTS, top_k=-1)
    assert wm.requests() == []


@by_provider
async def test_async_negative_top_k_raises_before_any_request(case: Case, wm: WireMock) -> None:
    async with AsyncRerankClient(
        case.url(wm, "all"), provider=case.provider, model=case.model
    ) as c:
        with pytest.raises(ValueError, match="top_k must be >= 0"):
            await c.rerank(QUERY, TEXTS, top_k=-3)
    assert wm.requests() == []


# -- error bodies -------------------------------------------------------------------------------


@by_provider
def test_each_providers_error_body_becomes_the_status_errors_message(
    case: Case, wm: WireMock
) -> None:
    with client(case, wm, "error") as c, pytest.raises(RerankStatusError) as caught:
        c.rerank(QUERY, TEXTS)
    assert caught.value.status_code == case.error_status
    assert caught.value.server_message == case.error_message
    assert caught.value.provider == case.provider
    assert str(caught.value) == (
        f"{case.provider} answered HTTP {case.error_status}: {case.error_message}"
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"error": "batch size 64 > maximum allowed batch size 32", "error_type": "Validation"},
            "batch size 64 > maximum allowed batch size 32 (Validation)",
        ),
        ({"error": "Model is overloaded"}, "Model is overloaded"),
        ({"message": "invalid api token"}, "invalid api token"),
        ({"detail": "Unauthorized"}, "Unauthorized"),
        (
            {"error": {"message": "context too long", "type": "BadRequestError", "code": 400}},
            "context too long",
        ),
        (
            {"object": "error", "message": "old vLLM shape", "type": "BadRequestError"},
            "old vLLM shape",
        ),
        (
            {"type": "bad_request_error", "message": "mixedbread shape", "details": None},
            "mixedbread shape",
        ),
        (
            {"detail": [{"loc": ["body", "query"], "msg": "field required"}]},
            "field required (at body.query)",
        ),
    ],
)
def test_error_message_reads_every_known_error_shape(body: Any, message: str) -> None:
    assert error_message(json.dumps(body).encode()) == message


def test_error_message_falls_back_to_the_text_and_cuts_it() -> None:
    assert error_message(b"  502 Bad Gateway\n") == "502 Bad Gateway"
    assert error_message(b'{"unexpected": 1}') == '{"unexpected": 1}'
    assert error_message(b"\xff\xfe broken") == "\ufffd\ufffd broken"
    assert error_message(json.dumps({"message": "x" * 900}).encode()) == "x" * 500
    assert len(error_message(b"y" * 900, limit=20)) == 20


# -- the sidecar: ids, not indices --------------------------------------------------------------

SIDECAR = next(c for c in CASES if c.provider == "sidecar")


@pytest.mark.parametrize("scenario", ["all", "shuffled"])
def test_sidecar_maps_scores_by_id_in_any_order(wm: WireMock, scenario: str) -> None:
    items = docs()
    with client(SIDECAR, wm, scenario) as c:
        result = c.rerank(QUERY, items, text=lambda d: d.text)
    assert result == expected(items, RANKED)
    assert wm.bodies(SIDECAR.api(scenario)) == [SIDECAR.body]


@pytest.mark.parametrize(
    ("scenario", "says"),
    [
        ("unknown-id", r"result 2: unknown id \"7\" \(not one of the 3 submitted ids\)"),
        ("duplicate-id", r"result 2: duplicate id '1'"),
        (
            "missing-id",
            r"sidecar answered something that is not a sidecar response: "
            r"expected 3 results for 3 texts, got 2; unscored indices include \[1\]",
        ),
    ],
)
def test_sidecar_off_contract_ids_raise_protocol_errors(
    wm: WireMock, scenario: str, says: str
) -> None:
    with client(SIDECAR, wm, scenario) as c, pytest.raises(RerankProtocolError, match=says):
        c.rerank(QUERY, TEXTS)


def test_sidecar_pool_above_128_is_split_and_every_id_maps_back(wm: WireMock) -> None:
    first = {"scores": [{"id": str(i), "score": i / 1000} for i in range(128)]}
    second = {"scores": [{"id": "0", "score": 0.9}, {"id": "1", "score": 0.8}]}
    wm.stub(
        {
            "priority": 1,
            "request": {
                "method": "POST",
                "urlPath": "/sidecar/big/rerank",
                "bodyPatterns": [{"matchesJsonPath": "$.documents[127]"}],
            },
            "response": {"status": 200, "jsonBody": first},
        }
    )
    wm.stub(
        {
            "priority": 2,
            "request": {"method": "POST", "urlPath": "/sidecar/big/rerank"},
            "response": {"status": 200, "jsonBody": second},
        }
    )
    items = [f"text {i}" for i in range(130)]
    with client(SIDECAR, wm, "big") as c:
        response = c.rerank_response(QUERY, items)
    sent = wm.bodies("/sidecar/big/rerank")
    # The two sub-batches go concurrently: in either order.
    assert sorted(len(b["documents"]) for b in sent) == [2, 128]
    (tail,) = [b for b in sent if len(b["documents"]) == 2]
    assert [d["id"] for d in tail["documents"]] == ["0", "1"]
    assert response.batches == 2
    scores = dict(response.results)
    assert scores["text 128"] == 0.9
    assert scores["text 129"] == 0.8
    assert all(scores[f"text {i}"] == i / 1000 for i in range(128))
    assert [t for t, _ in response.results[:3]] == ["text 128", "text 129", "text 127"]
    # The indices are positions in the whole list, not in the sub-batch that scored them.
    assert response.indices is not None
    assert response.indices[:3] == [128, 129, 127]
    assert sorted(response.indices) == list(range(130))
    assert all(
        items[i] is item for i, (item, _) in zip(response.indices, response.results, strict=True)
    )


@pytest.mark.parametrize("raw_id", ["01", "-1", " 1", "3", 1, None, "1.0", "\u0661"])
def test_sidecar_ids_must_be_the_canonical_strings_that_were_sent(raw_id: Any) -> None:
    fmt = get_format("sidecar")
    body = {
        "scores": [
            {"id": "0", "score": 0.1},
            {"id": "2", "score": 0.2},
            {"id": raw_id, "score": 0.3},
        ]
    }
    with pytest.raises(RerankProtocolError, match="unknown id"):
        parse_response(fmt, body, {}, n_texts=3, expected=3)


# -- the client copies its input before any I/O -------------------------------------------------


class HeldTransport(httpx.AsyncBaseTransport):
    """Forwards to the real network, but holds each request at the transport until released:
    the test changes its list while the request is certainly in flight, with no sleep racing
    the server."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.sent = asyncio.Event()
        self.release = asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.set()
        await self.release.wait()
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


HOLD_LIMIT_S = 30.0
"""How long the test waits for the request to reach the transport before failing (never, when
the client works: it is there within milliseconds)."""


@by_provider
async def test_async_client_snapshots_items_before_io(case: Case, wm: WireMock) -> None:
    items = docs()
    originals = list(items)
    held = HeldTransport()
    async with (
        httpx.AsyncClient(transport=held) as http,
        AsyncRerankClient(
            case.url(wm, "slow"),
            provider=case.provider,
            model=case.model,
            max_retries=0,
            http_client=http,
        ) as c,
    ):
        task = asyncio.ensure_future(c.rerank(QUERY, items, text=lambda d: d.text))
        await asyncio.wait_for(held.sent.wait(), HOLD_LIMIT_S)
        assert not task.done(), "the request is held at the transport"
        items.reverse()
        items[0] = Doc("intruder", "not sent")
        items.append(Doc("late", "also not sent"))
        held.release.set()
        result = await task
    assert result == expected(originals, RANKED)
    assert all(
        got is want for (got, _), (want, _) in zip(result, expected(originals, RANKED), strict=True)
    )
    assert wm.bodies(case.api("slow")) == [case.body]


# -- the stage over every provider --------------------------------------------------------------


def test_stage_over_every_provider_emits_the_same_span_shape(wm: WireMock, spans: Any) -> None:
    provider, exporter = spans
    usage_keys = {ATTR_USAGE_TOTAL_TOKENS, ATTR_USAGE_SEARCH_UNITS}
    shapes: dict[str, set[str]] = {}
    usage_seen: dict[str, dict[str, Any]] = {}
    for case in CASES:
        cands = [Candidate(id=f"d{i}", text=t, score=1.0 - i / 10) for i, t in enumerate(TEXTS)]
        with client(case, wm, "all", model=case.model or "BAAI/bge-reranker-base") as c:
            outputs = RerankStage(c, tracer_provider=provider).run(QUERY, cands)
        assert [o.input_index for o in outputs] == [2, 0, 1], case.provider
        (span,) = exporter.get_finished_spans()
        exporter.clear()
        attributes = dict(span.attributes or {})
        assert attributes["openinference.span.kind"] == "RERANKER"
        assert attributes["retrieval_stage.provider"] == case.provider
        assert attributes["reranker.model_name"] == (
            case.reported_model or case.model or "BAAI/bge-reranker-base"
        )
        usage_seen[case.provider] = {k: attributes[k] for k in usage_keys if k in attributes}
        shapes[case.provider] = set(attributes) - usage_keys
    reference = shapes["tei"]
    assert {p: s ^ reference for p, s in shapes.items()} == {p: set() for p in shapes}
    assert usage_seen == {
        "tei": {ATTR_USAGE_TOTAL_TOKENS: 21},
        "cohere": {ATTR_USAGE_SEARCH_UNITS: 1.0},
        "jina": {ATTR_USAGE_TOTAL_TOKENS: 38},
        "voyage": {ATTR_USAGE_TOTAL_TOKENS: 26},
        "vllm": {ATTR_USAGE_TOTAL_TOKENS: 30},
        "infinity": {ATTR_USAGE_TOTAL_TOKENS: 44},
        "mixedbread": {ATTR_USAGE_TOTAL_TOKENS: 120},
        "sidecar": {},
    }


# -- the table itself ---------------------------------------------------------------------------


def test_default_batch_caps_are_the_documented_limits() -> None:
    caps = {name: fmt.batch_size for name, fmt in PROVIDERS.items()}
    assert caps == {
        "tei": 32,  # --max-client-batch-size default
        "cohere": 1000,  # "recommend against sending more than 1,000 documents"
        "jina": 1000,  # none documented
        "voyage": 1000,  # "the number of documents cannot exceed 1000"
        "vllm": 1000,  # none documented
        "infinity": 2048,  # INFINITY_MAX_CLIENT_BATCH_SIZE default
        "mixedbread": 1000,  # input: 1 to 1000 items
        "sidecar": 128,  # RERANKER_MAX_DOCUMENTS default (seed)
    }
    for name, cap in caps.items():
        with RerankClient("http://localhost", provider=name, model="m") as c:
            assert c.batch_size == cap, name


def test_every_provider_in_the_table_has_a_wiremock_case() -> None:
    assert sorted(PROVIDERS) == sorted(c.provider for c in CASES)


@pytest.mark.parametrize("top_n", [0, -1, True])
def test_build_request_refuses_a_top_n_below_one(top_n: Any) -> None:
    with pytest.raises(ValueError, match="top_n must be a positive int"):
        build_request(get_format("cohere"), "q", ["a"], model=None, top_n=top_n)


def test_unknown_provider_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown rerank provider 'openai'; known: cohere, "):
        get_format("openai")
    with pytest.raises(ValueError, match="unknown rerank provider"):
        RerankClient("http://localhost", provider="openai")


def test_wire_formats_are_frozen_data() -> None:
    fmt: WireFormat = get_format("tei")
    with pytest.raises(AttributeError):
        fmt.batch_size = 64  # type: ignore[misc]
