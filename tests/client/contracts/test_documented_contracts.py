"""The client against the rerank APIs' documented contracts (schemas/, written from each
provider's documentation; sources in SOURCES.md).

0. Each contract is a valid JSON Schema, and the client posts to the documented path.
1. Every request body the client can send (plain, top_k, batched, batched with top_k,
   batch_size="auto"), captured by a real WireMock, validates against the documented request
   and holds only documented fields.
2. Responses generated from the documented response schema (Hypothesis, derandomised)
   map to the caller's own items by index. A schema cannot say "index < number of texts sent"
   or "each index once", so the generator draws the indices as a permutation of the batch.
3. Every documented error status raises `RerankStatusError` with its status and message.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retrieval_stage import PROVIDERS, RerankClient, RerankStatusError

from ...conftest import WireMock
from . import contract

DOCUMENTED = contract.DOCUMENTED
MODELS = {
    "tei": None,
    "cohere": "rerank-v3.5",
    "jina": "jina-reranker-v2-base-multilingual",
    "voyage": "rerank-2.5",
    "infinity": "mixedbread-ai/mxbai-rerank-xsmall-v1",
    "mixedbread": "mixedbread-ai/mxbai-rerank-large-v2",
}
TEXTS = ["t0", "t1", "t2", "t3", "t4"]
QUERY = "What is the capital of the United States?"


def envelope(provider: str, entries: list[dict[str, Any]]) -> Any:
    """A response body as the contract shapes it (with every field it requires)."""
    fmt = PROVIDERS[provider]
    usage = {"prompt_tokens": 7, "total_tokens": 7}
    wrap: dict[str, dict[str, Any]] = {
        "cohere": {"id": "r-1", "meta": {"billed_units": {"search_units": 1}}},
        "jina": {"model": MODELS["jina"], "usage": usage},
        "voyage": {"object": "list", "model": MODELS["voyage"], "usage": {"total_tokens": 7}},
        "infinity": {"object": "rerank", "model": MODELS["infinity"], "usage": usage},
        "mixedbread": {
            "object": "list",
            "model": MODELS["mixedbread"],
            "usage": usage,
            "top_k": len(entries),
            "return_input": False,
        },
    }
    if fmt.results_key is None:
        return entries
    return {**wrap[provider], fmt.results_key: entries}


def ranked(provider: str, indices: list[int]) -> Any:
    key = PROVIDERS[provider].score_key
    return envelope(
        provider, [{"index": i, key: round(0.9 - 0.1 * r, 2)} for r, i in enumerate(indices)]
    )


# -- 0. the contracts themselves ----------------------------------------------------------------


@pytest.mark.parametrize("provider", DOCUMENTED)
def test_each_documented_contract_is_a_valid_json_schema(provider: str) -> None:
    found = contract.schemas(provider)
    assert [where for where, _ in found][:2] == ["request", "response"]
    for where, schema in found:
        contract.check_schema(schema)
        assert "$ref" not in json.dumps(schema), where


def test_every_provider_with_a_documented_contract_is_one_the_client_speaks() -> None:
    assert set(DOCUMENTED) <= set(PROVIDERS)
    assert set(DOCUMENTED) == set(MODELS)


@pytest.mark.parametrize("provider", DOCUMENTED)
def test_the_client_posts_to_the_documented_path(provider: str) -> None:
    assert contract.endpoint(provider) == ("POST", PROVIDERS[provider].path)


# -- 1. request bodies, captured by WireMock ------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    top_k: int | None
    batch_size: int | str | None


SCENARIOS = [
    Scenario("plain", None, None),
    Scenario("top_k", 2, None),
    Scenario("batched", None, 2),
    Scenario("batched_top_k", 2, 2),
    Scenario("auto", None, "auto"),
]


def _stub_scenario(wm: WireMock, provider: str, scenario: Scenario, prefix: str) -> None:
    fmt = PROVIDERS[provider]
    path = prefix + fmt.path
    # TEI's batch_size="auto" reads the cap from GET /info (a body valid against its Info schema).
    batched = scenario.batch_size == 2 or (scenario.batch_size == "auto" and provider == "tei")
    if scenario.batch_size == "auto" and provider == "tei":
        info = {
            "model_id": "BAAI/bge-reranker-base",
            "model_dtype": "float32",
            "served_model_name": "BAAI/bge-reranker-base",
            "model_type": {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}},
            "max_concurrent_requests": 512,
            "max_input_length": 512,
            "max_batch_tokens": 16384,
            "max_client_batch_size": 2,
            "auto_truncate": True,
            "tokenization_workers": 4,
            "version": "1.9.3",
        }
        contract.validate(contract.other_response_schema(provider, "GET /info"), info)
        wm.stub_json(prefix + "/info", info, method="GET")
    if batched:
        bodies = {"default": ranked(provider, [1, 0]), "last": ranked(provider, [0])}
    elif scenario.top_k is not None and fmt.top_n_field is not None:
        bodies = {"default": ranked(provider, [4, 2])}
    else:
        bodies = {"default": ranked(provider, [4, 3, 2, 1, 0])}
    for body in bodies.values():
        contract.validate(contract.response_schema(provider), body)  # stubs follow it too
    wm.stub_json(path, bodies["default"])
    if "last" in bodies:  # the 1-text batch [t4]
        wm.stub(
            {
                "priority": 1,
                "request": {
                    "method": "POST",
                    "urlPath": path,
                    "bodyPatterns": [{"matchesJsonPath": f"$.{fmt.texts_field}[?(@ == 't4')]"}],
                },
                "response": {
                    "status": 200,
                    "headers": {"Content-Type": "application/json"},
                    "body": json.dumps(bodies["last"]),
                },
            }
        )


def _model_cases() -> list[tuple[str, str | None]]:
    cases = [(p, MODELS[p]) for p in DOCUMENTED]
    cases += [(p, None) for p in DOCUMENTED if not PROVIDERS[p].requires_model and MODELS[p]]
    return cases


@pytest.mark.parametrize(("provider", "model"), _model_cases())
def test_every_request_body_the_client_sends_validates_against_the_documented_request(
    wm: WireMock, provider: str, model: str | None
) -> None:
    fmt = PROVIDERS[provider]
    schema = contract.request_schema(provider)
    for scenario in SCENARIOS:
        prefix = f"/contract/{provider}/{scenario.name}"
        _stub_scenario(wm, provider, scenario, prefix)
        with RerankClient(
            wm.url + prefix,
            provider=provider,
            model=model,
            batch_size=scenario.batch_size,  # type: ignore[arg-type]
            max_retries=0,
        ) as client:
            result = client.rerank(QUERY, TEXTS, top_k=scenario.top_k)
        assert len(result) == (scenario.top_k or len(TEXTS)), scenario
        bodies = wm.bodies(prefix + fmt.path)
        batched = scenario.batch_size == 2 or (scenario.batch_size == "auto" and provider == "tei")
        for body in bodies:
            contract.validate(schema, body)
            assert set(body) <= set(schema["properties"]), (scenario, body)  # documented fields
            assert set(fmt.required_fields) <= set(body), (scenario, body)
        # Sub-batches go concurrently: in any order.
        assert sorted(len(b[fmt.texts_field]) for b in bodies) == ([1, 2, 2] if batched else [5])
        if scenario.top_k is not None and fmt.top_n_field is not None:
            for body in bodies:
                assert body[fmt.top_n_field] == min(2, len(body[fmt.texts_field]))


@pytest.mark.parametrize("provider", sorted(p for p in DOCUMENTED if PROVIDERS[p].requires_model))
def test_a_model_less_body_is_what_the_documented_request_rejects(provider: str) -> None:
    """The reason the client refuses to be built without a model: the documentation says no."""
    body = {"query": QUERY, PROVIDERS[provider].texts_field: TEXTS}
    with pytest.raises(Exception, match="'model' is a required property"):
        contract.validate(contract.request_schema(provider), body)


# -- 2. responses generated from the published response schema ------------------------------------


def _generation_schema(provider: str, n_results: int, n_texts: int) -> dict[str, Any]:
    """The documented 200 schema, with the results array sized to the results the request asked
    for, every entry carrying the index and score keys (Voyage leaves them optional) and the
    score bounded (a finite float the client can read)."""
    fmt = PROVIDERS[provider]
    schema = contract.response_schema(provider)
    array = schema if fmt.results_key is None else schema["properties"][fmt.results_key]
    if fmt.results_key is not None:
        schema["required"] = sorted({*schema.get("required", []), fmt.results_key})
    array["minItems"] = array["maxItems"] = n_results
    items = array.get("items") or {}
    props = items.setdefault("properties", {})
    props["index"] = {"type": "integer", "minimum": 0, "maximum": n_texts - 1}
    props[fmt.score_key] = {"type": "number", "minimum": -1e6, "maximum": 1e6}
    items["required"] = sorted({*items.get("required", []), "index", fmt.score_key})
    items["type"] = "object"
    array["items"] = items
    return schema


@cache
def _responses(provider: str, n_results: int, n_texts: int) -> st.SearchStrategy[Any]:
    return contract.strategy(_generation_schema(provider, n_results, n_texts))


@dataclass(frozen=True)
class Doc:
    """A caller's own item: the results must be these very objects."""

    text: str


def _serve(body: Any) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=body)

    return handler


@pytest.mark.parametrize("provider", DOCUMENTED)
@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_responses_generated_from_the_documented_schema_map_to_the_callers_items_by_index(
    provider: str, data: st.DataObject
) -> None:
    fmt = PROVIDERS[provider]
    n = data.draw(st.integers(1, 6), label="n")
    top_k = data.draw(st.one_of(st.none(), st.integers(1, 7)), label="top_k")
    n_results = n if fmt.top_n_field is None or top_k is None else min(top_k, n)
    body = data.draw(_responses(provider, n_results, n), label="body")
    order = data.draw(st.permutations(range(n)), label="indices")[:n_results]
    entries = body if fmt.results_key is None else body[fmt.results_key]
    for entry, index in zip(entries, order, strict=True):
        entry["index"] = index
    contract.validate(contract.response_schema(provider), body)
    items = [Doc(f"text {i}") for i in range(n)]
    http = httpx.Client(transport=httpx.MockTransport(_serve(body)))
    with RerankClient(
        "http://reranker.test",
        provider=provider,
        model=MODELS[provider],
        http_client=http,
        max_retries=0,
    ) as client:
        result = client.rerank(QUERY, items, text=lambda d: d.text, top_k=top_k)
    score_of = {e["index"]: float(e[fmt.score_key]) for e in entries}
    assert len(result) == min(top_k or n, n)
    for item, score in result:
        assert any(item is it for it in items)
        assert score == score_of[items.index(item)]
    assert [s for _, s in result] == sorted((s for _, s in result), reverse=True)
    want = sorted(score_of.values(), reverse=True)[: len(result)]
    assert sorted((s for _, s in result), reverse=True) == want


# -- 3. documented errors ----------------------------------------------------------------------


# The codes a documented range stands for in the tests.
RANGES = {"4XX": [400, 401, 403, 404, 422, 429], "5XX": [500, 502, 503]}


def _error_body(schema: dict[str, Any] | None, code: int) -> tuple[Any, str]:
    """A body of the documented shape and the message the client must read from it."""
    detail = (schema or {}).get("properties", {}).get("detail")
    if detail is not None and detail.get("type") == "array":
        # FastAPI's validation list, read as type, message and location (the client's
        # sanitiser drops any echoed "input").
        return {"detail": [{"loc": ["body", "top_n"], "msg": "bad", "type": "x"}]}, (
            "x: bad (at body.top_n)"
        )
    if detail is not None:  # Voyage {"detail": "..."}
        return {"detail": f"documented {code}"}, f"documented {code}"
    # Cohere {"message", "id"}; also what is sent where no body shape is documented (Voyage 5XX).
    return {"message": f"documented {code}", "id": "e-1"}, f"documented {code}"


def _documented_errors() -> list[tuple[str, int, Any, str]]:
    """(provider, status, body, message the client must report) for every documented error:
    the documented example where there is one (TEI), else a body valid against its schema."""
    cases: list[tuple[str, int, Any, str]] = []
    for provider in DOCUMENTED:
        for status in contract.error_statuses(provider):
            documented = contract.error(provider, status)
            schema = documented.get("body")
            for code in RANGES[status] if status in RANGES else [int(status)]:
                if "example" in documented:  # TEI: {"error", "error_type"} in lower case
                    body = documented["example"]
                    message = f"{body['error']} ({body['error_type']})"
                    # (Not validated: the examples break the enum, "empty" for "Empty".)
                else:
                    body, message = _error_body(schema, code)
                    if schema is not None:
                        contract.validate(schema, body)
                cases.append((provider, code, body, message))
    return cases


ERRORS = _documented_errors()


@pytest.mark.parametrize(
    ("provider", "status", "body", "message"),
    ERRORS,
    ids=[f"{p}-{s}" for p, s, _, _ in ERRORS],
)
def test_every_documented_error_raises_the_typed_error_with_its_status(
    provider: str, status: int, body: Any, message: str
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json=body)

    http = httpx.Client(transport=httpx.MockTransport(handler))
    with (
        RerankClient(
            "http://reranker.test",
            provider=provider,
            model=MODELS[provider],
            http_client=http,
            max_retries=0,
        ) as client,
        pytest.raises(RerankStatusError) as caught,
    ):
        client.rerank(QUERY, TEXTS)
    assert caught.value.status_code == status
    assert caught.value.provider == provider
    assert caught.value.server_message == message


@pytest.mark.parametrize("status", [413, 422], ids=["tei-1.6-413", "tei-1.9-422"])
def test_tei_batch_size_refusal_in_either_status_teaches_the_cap(status: int) -> None:
    """TEI refuses an over-size batch with 413 up to 1.8 and 422 from 1.9 (the documentation
    still says 413), and writes error_type in lower case as its own examples do."""
    seen: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        texts = json.loads(request.content)["texts"]
        seen.append(len(texts))
        if len(texts) > 2:
            refusal = f"batch size {len(texts)} > maximum allowed batch size 2"
            return httpx.Response(status, json={"error": refusal, "error_type": "validation"})
        return httpx.Response(200, json=ranked("tei", list(range(len(texts)))[::-1]))

    http = httpx.Client(transport=httpx.MockTransport(handler))
    # A model given: the client has no reason to ask /info, so every request is a batch.
    model = "BAAI/bge-reranker-base"
    with RerankClient(
        "http://reranker.test", model=model, http_client=http, max_retries=0
    ) as client:
        result = client.rerank(QUERY, TEXTS)
    assert seen[0] == 5
    assert all(n <= 2 for n in seen[1:])
    assert sorted(t for t, _ in result) == TEXTS
