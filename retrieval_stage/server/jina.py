"""Jina's rerank shape for ``POST /v1/rerank``, so clients written for Jina's API (LiteLLM's and
Haystack's Jina rerankers, LangChain's ``JinaRerank``) work unchanged.

Request (Jina's OpenAPI, api.jina.ai/openapi.json): ``model`` (required, the served model's
name), ``query``, ``documents`` (strings, or objects with a ``text``), ``top_n`` (absent: every
document), ``return_documents`` (default true). Response: ``{"model", "usage": {"total_tokens",
"prompt_tokens"}, "results": [{"index", "relevance_score", "document"?: {"text"}}]}``, best
first, cut to ``top_n``. Errors: FastAPI's ``{"detail"}`` (a list of ``{"loc", "msg", "type"}``
for a 422, a string otherwise), with the statuses ``POST /rerank`` gives.

The same body with ``documents`` as strings, posted to ``POST /rerank`` as vLLM and Infinity
take it there (LiteLLM's ``infinity/`` and ``hosted_vllm/`` providers, LlamaIndex's
``JinaRerank`` with a root ``base_url``), is read by `read_plain` and answered the same way
(`PLAIN`), with two differences that follow vLLM and Infinity: ``model`` may be left out (the
served one), and ``top_n`` 0 means every document. Its results never carry ``document``: vLLM
answers it as ``{"text"}``, Infinity as a bare string, and LiteLLM's client for each fails on
the other's form (both ask ``return_documents: true``), while every client maps by ``index``.
"""

from __future__ import annotations

import json
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
    flag,
    json_kind,
    listed,
    model_not_served,
    query_of,
    read_rerank_body,
    string,
    top_n,
)

__all__ = ["JINA", "PLAIN", "error_body", "parse", "read_plain", "render"]


def _text(document: Any, i: int) -> str:
    """A document's text: the string itself, or an object's ``text`` (images are not read)."""
    if isinstance(document, str):
        return document
    if not isinstance(document, dict):
        raise ApiError(
            "Validation",
            f"`documents[{i}]` must be a string or an object with `text`, "
            f"got {json_kind(document)}",
        )
    if "text" not in document:
        what = "an image: this server reranks text only" if "image" in document else "no `text`"
        raise ApiError("Validation", f"`documents[{i}]` has {what}")
    return string(document["text"], f"documents[{i}].text")


def parse(raw: bytes, serving: ServedModel) -> ApiRequest:
    """Read and check a ``POST /v1/rerank`` body against what is served; `ApiError` says what
    was wrong (a model other than the served one: 404 naming both)."""
    body = decode_object(raw)
    model = check_model(body, serving.model)
    query = query_of(body)
    items = listed(body, "documents", serving.max_client_batch_size)
    texts = tuple(_text(d, i) for i, d in enumerate(items))
    job = RerankJob(shape="jina", query=query, texts=texts)
    return ApiRequest(
        job=job,
        model=model,
        top_n=top_n(body),
        return_documents=bool(flag(body, "return_documents", True)),
    )


def read_plain(body: dict[str, Any], serving: ServedModel) -> ApiRequest:
    """Read and check a decoded Jina/vLLM body posted to ``POST /rerank`` (``documents`` all
    strings, as `rerank_shape` told) against what is served: ``model`` optional but, when given,
    the served one (else 404); ``top_n`` 0 or absent is every document; ``return_documents``
    checked and not answered (the module's docstring says why)."""
    model = serving.model
    if body.get("model") is not None:
        asked = string(body["model"], "model")
        if asked != serving.model:
            raise model_not_served(asked, serving.model)
    job = read_rerank_body(body, "jina", max_client_batch_size=serving.max_client_batch_size)
    top = top_n(body, zero_is_all=True)
    flag(body, "return_documents", None)
    return ApiRequest(job=job, model=model, top_n=top, return_documents=False)


def render(answer: Answer) -> bytes:
    """Jina's response: results best first with each document's ``index`` (and its text when
    ``return_documents``), cut to ``top_n``; the tokens the model read as ``usage``."""
    request = answer.request
    texts = request.job.texts
    results: list[dict[str, Any]] = []
    for i in answer.order():
        result: dict[str, Any] = {"index": i, "relevance_score": answer.scores[i]}
        if request.return_documents:
            result["document"] = {"text": texts[i]}
        results.append(result)
    usage = {"total_tokens": answer.tokens, "prompt_tokens": answer.tokens}
    return json.dumps({"model": request.model, "usage": usage, "results": results}).encode()


def error_body(error: ApiError) -> bytes:
    """FastAPI's error body, as Jina's API answers: a validation list for a 422, else text."""
    if error.status == 422:
        entry = {"loc": ["body"], "msg": error.message, "type": error.kind.lower()}
        return json.dumps({"detail": [entry]}).encode()
    return json.dumps({"detail": error.message}).encode()


JINA = RerankApi(shape="jina", path="/v1/rerank", parse=parse, render=render, error_body=error_body)


def _parse_plain(raw: bytes, serving: ServedModel) -> ApiRequest:
    return read_plain(decode_object(raw), serving)


PLAIN = RerankApi(
    shape="jina", path="/rerank", parse=_parse_plain, render=render, error_body=error_body
)
"""Jina's answer to the Jina/vLLM body on ``POST /rerank`` (the app tells it from TEI's and the
sidecar's by `retrieval_stage.server.wire.rerank_shape`)."""
