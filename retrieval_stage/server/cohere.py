"""Cohere's Rerank v2 shape for ``POST /v2/rerank``, so Cohere's own SDK and the clients built on
it (``cohere.ClientV2(base_url=...)``, LangChain's and Haystack's Cohere rerankers) work unchanged.

Request (docs.cohere.com/v2/reference/rerank): ``model`` (required, the served model's name),
``query``, ``documents`` (strings, in v2), ``top_n`` (at least 1; absent: every document),
``max_tokens_per_doc``, ``priority``. Response: ``{"id", "results": [{"index",
"relevance_score"}], "meta": {"api_version", "billed_units": {"search_units"}, "tokens"}}``,
best first, cut to ``top_n``. Errors: ``{"message"}``, with the statuses ``POST /rerank`` gives.
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

from .wire import (
    Answer,
    ApiError,
    ApiRequest,
    RerankApi,
    RerankJob,
    ServedModel,
    check_model,
    decode_object,
    json_kind,
    listed,
    query_of,
    string,
    top_n,
)

__all__ = ["COHERE", "DOCUMENTS_PER_SEARCH_UNIT", "error_body", "parse", "render"]

DOCUMENTS_PER_SEARCH_UNIT = 100
"""Cohere bills "one query with up to 100 documents to be ranked" as one search unit
(cohere.com/pricing): ``meta.billed_units.search_units`` counts the same way."""

API_VERSION = "2"


def _integer(body: dict[str, Any], name: str, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError("Validation", f"`{name}` must be an integer, got {json_kind(value)}")
    if value < low or (high is not None and value > high):
        bounds = f"at least {low}" if high is None else f"between {low} and {high}"
        raise ApiError("Validation", f"`{name}` must be {bounds}, got {value}")
    return value


def parse(raw: bytes, serving: ServedModel) -> ApiRequest:
    """Read and check a ``POST /v2/rerank`` body against what is served; `ApiError` says what
    was wrong (a model other than the served one: 404 naming both).

    ``max_tokens_per_doc`` below the model's input length is refused rather than ignored: the
    models here truncate at their own input length only, and a caller asking for less must
    not get scores computed on more.
    """
    body = decode_object(raw)
    model = check_model(body, serving.model)
    query = query_of(body)
    items = listed(body, "documents", serving.max_client_batch_size)
    texts = tuple(string(t, f"documents[{i}]") for i, t in enumerate(items))
    cut = _integer(body, "max_tokens_per_doc", 1)
    if cut is not None and cut < serving.max_input_length:
        raise ApiError(
            "Validation",
            f"`max_tokens_per_doc` {cut} is below the model's input length "
            f"({serving.max_input_length} tokens): this server truncates documents only there",
        )
    # Scheduling priority: every request here waits in one queue, so it is checked, not used.
    _integer(body, "priority", 0, 999)
    job = RerankJob(shape="cohere", query=query, texts=texts)
    return ApiRequest(job=job, model=model, top_n=top_n(body))


def render(answer: Answer) -> bytes:
    """The v2 response: results best first with each document's ``index``, cut to ``top_n``."""
    n = len(answer.request.job.texts)
    results = [{"index": i, "relevance_score": answer.scores[i]} for i in answer.order()]
    meta = {
        "api_version": {"version": API_VERSION},
        "billed_units": {"search_units": math.ceil(n / DOCUMENTS_PER_SEARCH_UNIT)},
        "tokens": {"input_tokens": answer.tokens, "output_tokens": 0},
    }
    return json.dumps({"id": str(uuid.uuid4()), "results": results, "meta": meta}).encode()


def error_body(error: ApiError) -> bytes:
    """Cohere's error body, ``{"message"}``, which the SDK's exceptions carry as ``.body``."""
    return json.dumps({"message": error.message}).encode()


COHERE = RerankApi(
    shape="cohere", path="/v2/rerank", parse=parse, render=render, error_body=error_body
)
