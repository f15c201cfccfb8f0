"""Every provider's required request fields, and the client refusing to exist without them.

A client that would send a request its API's documented contract rejects (Cohere v2, Voyage
and Jina list ``model`` as required) must fail at construction, before any I/O, with a message
naming the provider and a model it documents, not at the first call with the server's 4xx.
"""

from __future__ import annotations

import re

import httpx
import pytest

from retrieval_stage import PROVIDERS, AsyncRerankClient, RerankClient
from retrieval_stage.client.providers import check_required_fields

from . import contract

# What each API's documented request requires (the contracts in schemas/, checked below; vLLM
# and the sidecar document none: vLLM's FastAPI model defaults model to the served one).
REQUIRES_MODEL = {
    "tei": False,  # RerankRequest: required [query, texts]; no model field at all
    "cohere": True,  # /v2/rerank: required [query, documents, model]
    "jina": True,  # TextRankInput: required [documents, model, query]
    "voyage": True,  # /rerank: required [query, documents, model]
    "vllm": False,  # RerankRequest.model: Optional, the served model
    "infinity": False,  # RerankInput: required [query, documents]; model has a default
    "mixedbread": False,  # RerankParams: required [query, input]; model has a default
    "sidecar": False,  # the seed's contract has no model
}
EXAMPLES = {
    "cohere": "rerank-v3.5",
    "jina": "jina-reranker-v2-base-multilingual",
    "voyage": "rerank-2.5",
}
# No route answers here; any request would also hit the transport below and fail the test.
UNREACHABLE = "http://127.0.0.1:9"


def _no_io(request: httpx.Request) -> httpx.Response:
    raise AssertionError(f"construction must not send anything, sent {request.url}")


def test_the_table_covers_every_provider() -> None:
    assert sorted(REQUIRES_MODEL) == sorted(PROVIDERS)


@pytest.mark.parametrize("provider", contract.DOCUMENTED)
def test_the_table_is_what_the_documented_request_requires(provider: str) -> None:
    required = set(contract.request_schema(provider)["required"])
    texts = PROVIDERS[provider].texts_field
    assert required == {"query", texts, *(("model",) if REQUIRES_MODEL[provider] else ())}


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_required_fields_are_the_query_the_texts_and_the_model_where_required(
    provider: str,
) -> None:
    fmt = PROVIDERS[provider]
    assert fmt.requires_model is REQUIRES_MODEL[provider]
    model = ("model",) if REQUIRES_MODEL[provider] else ()
    assert fmt.required_fields == ("query", fmt.texts_field, *model)


@pytest.mark.parametrize("provider", sorted(p for p, needs in REQUIRES_MODEL.items() if needs))
@pytest.mark.parametrize("flavour", [RerankClient, AsyncRerankClient])
def test_a_provider_that_requires_a_model_refuses_a_client_without_one(
    provider: str, flavour: type[RerankClient] | type[AsyncRerankClient]
) -> None:
    message = f"model= is required by provider '{provider}' (e.g. '{EXAMPLES[provider]}')"
    http: httpx.Client | httpx.AsyncClient = (
        httpx.Client(transport=httpx.MockTransport(_no_io))
        if flavour is RerankClient
        else httpx.AsyncClient(transport=httpx.MockTransport(_no_io))
    )
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        flavour(UNREACHABLE, provider=provider, http_client=http)  # type: ignore[arg-type]
    assert str(caught.value) == message


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_every_provider_builds_a_client_with_a_model(provider: str) -> None:
    with RerankClient(UNREACHABLE, provider=provider, model="some-model") as client:
        assert client.model == "some-model"


@pytest.mark.parametrize("provider", sorted(p for p, needs in REQUIRES_MODEL.items() if not needs))
def test_a_provider_that_does_not_require_a_model_builds_a_client_without_one(
    provider: str,
) -> None:
    with RerankClient(UNREACHABLE, provider=provider) as client:
        assert client.model is None


@pytest.mark.parametrize("model", ["", "   ", 7])
@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_a_blank_or_non_string_model_is_refused_for_every_provider(
    provider: str, model: object
) -> None:
    with pytest.raises(ValueError, match="model= must be a non-empty str or None"):
        check_required_fields(PROVIDERS[provider], model=model)  # type: ignore[arg-type]
