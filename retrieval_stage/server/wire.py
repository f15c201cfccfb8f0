"""What goes over the wire: request bodies read and checked, responses and errors shaped.

Three request shapes reach ``POST /rerank``, told apart by their fields (`rerank_shape`):

- TEI's: ``{"query", "texts", "raw_scores"?, "return_text"?, "truncate"?,
  "truncation_direction"?}``, answered by a bare array ``[{"index", "score", "text"?}]`` sorted
  by score (ties keep input order), so every TEI client works unchanged;
- the seed's sidecar contract: ``{"query", "documents": [{"id", "text"}]}``, answered by
  ``{"scores": [{"id", "score"}]}`` in input order;
- Jina's and vLLM's (and Infinity's), which vLLM and Infinity take at ``/rerank``: ``{"model"?,
  "query", "documents": [str, ...], "top_n"?, "return_documents"?}``, answered as ``POST
  /v1/rerank`` answers (`retrieval_stage.server.jina`), so LiteLLM's ``infinity/`` and
  ``hosted_vllm/`` providers and LlamaIndex's ``JinaRerank`` work pointed at the root.

Errors take TEI's body ``{"error", "error_type"}`` and its status codes. A message names the
field that was wrong and never quotes the caller's query or texts: they may be private, and
they would end up in the caller's logs.

``POST /v2/rerank`` (Cohere's shape, `retrieval_stage.server.cohere`) and ``POST /v1/rerank``
(Jina's, `retrieval_stage.server.jina`) read their bodies with the helpers here into the same
`RerankJob`, with the API's own options beside it (`ApiRequest`), and say their errors in their
own body shapes with the same statuses (`RerankApi`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "Answer",
    "ApiError",
    "ApiRequest",
    "RerankApi",
    "RerankJob",
    "RerankShape",
    "ServedModel",
    "Shape",
    "batch_too_large",
    "check_model",
    "decode_object",
    "flag",
    "internal_error",
    "json_kind",
    "listed",
    "model_not_served",
    "overloaded",
    "parse_rerank_body",
    "query_of",
    "ranked",
    "read_rerank_body",
    "render_scores",
    "rerank_shape",
    "string",
    "too_much_work",
    "top_n",
    "unhealthy",
]

Shape = Literal["tei", "sidecar", "cohere", "jina"]

RerankShape = Literal["tei", "sidecar", "jina"]
"""The request shapes ``POST /rerank`` reads (`rerank_shape`)."""

# TEI's error types and the status each one answers with (router v1.9: Validation is 422,
# an empty `texts` is its own 400, a full queue 429, a failed model 424, not ready 503).
ERROR_STATUS = {
    "Empty": 400,
    "Validation": 422,
    "Tokenizer": 422,
    "Overloaded": 429,
    "Backend": 424,
    "Unhealthy": 503,
    "Internal": 500,
    "PayloadTooLarge": 413,
    "NotFound": 404,
    "MethodNotAllowed": 405,
    "UnsupportedMediaType": 415,
    "ModelNotFound": 404,
    "RequestTimeout": 408,
}


class ApiError(Exception):
    """An error answered as TEI answers it: ``{"error": message, "error_type": kind}``."""

    def __init__(self, kind: str, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status if status is not None else ERROR_STATUS[kind]

    def body(self) -> bytes:
        """The JSON error body."""
        return json.dumps({"error": self.message, "error_type": self.kind}).encode()


def batch_too_large(sent: int, cap: int) -> ApiError:
    """TEI's refusal of more texts than ``--max-client-batch-size``, in TEI's exact words: a
    client (ours, ``RerankClient``) reads the cap out of them and splits."""
    return ApiError("Validation", f"batch size {sent} > maximum allowed batch size {cap}")


def overloaded() -> ApiError:
    """The queue is full: 429, as TEI says it."""
    return ApiError("Overloaded", "Model is overloaded")


def internal_error(kind: str) -> ApiError:
    """An error nobody foresaw: 500 in TEI's shape, naming only the exception's type (its
    message may quote what the caller sent)."""
    return ApiError("Internal", f"Internal error ({kind}); the server logged it")


def too_much_work(cost: int, cap: int) -> ApiError:
    """More tokens in one request than ``--max-request-tokens``: TEI's 422, in the words of
    its token check (the numbers only, never the texts)."""
    return ApiError(
        "Validation",
        f"Input validation error: the request must have at most {cap} tokens "
        f"(its texts and query, as the model reads them). Given: {cost}",
    )


def body_too_slow(seconds: float, received: int) -> ApiError:
    """A request body not complete `seconds` after its head: 408 (RFC 9110), in TEI's shape.
    Only the byte count is said, never what the bytes were."""
    return ApiError(
        "RequestTimeout",
        f"the request body did not arrive within {seconds:g} s ({received} bytes received)",
    )


def unhealthy() -> ApiError:
    """The model is not loaded (yet, or it failed to load): 503, as TEI says it."""
    return ApiError("Unhealthy", "unhealthy")


QUOTED_MODEL_CHARS = 40
"""The most characters of a caller's model string a refusal repeats: enough to recognise the
name, never the caller's whole string (a 2 MB ``model`` must not come back as a 2 MB error)."""


def model_not_served(asked: str, served: str) -> ApiError:
    """A request naming a model this server does not run: 404, naming the served one (as vLLM
    answers an unknown model), so the caller sees at once what to ask for instead. The asked
    name is repeated up to `QUOTED_MODEL_CHARS` characters, a longer one cut and marked ``…``."""
    shown = asked if len(asked) <= QUOTED_MODEL_CHARS else asked[:QUOTED_MODEL_CHARS] + "…"
    return ApiError(
        "ModelNotFound",
        f"the model `{shown}` is not served here: this server serves `{served}`",
    )


@dataclass(frozen=True, slots=True)
class RerankJob:
    """One checked ``POST /rerank``: the query, the texts in input order, and how to answer.

    `ids` are the sidecar's document ids (None for TEI's shape).
    """

    shape: Shape
    query: str
    texts: tuple[str, ...]
    ids: tuple[str, ...] | None = None
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool | None = None


def json_kind(value: Any) -> str:
    """A JSON value's type name, for messages (never the value itself)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def flag(body: dict[str, Any], name: str, default: bool | None) -> bool | None:
    """The optional boolean `name` (null counts as absent where `default` is None)."""
    value = body.get(name, default)
    if value is None or isinstance(value, bool):
        return value
    raise ApiError("Validation", f"`{name}` must be a boolean, got {json_kind(value)}")


def string(value: Any, where: str) -> str:
    """`value`, which must be a string; the error names the field at `where`."""
    if not isinstance(value, str):
        raise ApiError("Validation", f"`{where}` must be a string, got {json_kind(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # valid JSON ("\ud800"), but no text a model can read
        raise ApiError(
            "Validation", f"`{where}` is not valid Unicode: it holds a lone surrogate"
        ) from None
    return value


def decode_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object: not JSON is a 400, another JSON value a 422."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise ApiError("Validation", "the body is nested too deeply", status=400) from None
    except json.JSONDecodeError as exc:
        where = f" (line {exc.lineno}, column {exc.colno})"
        raise ApiError("Validation", f"the body is not valid JSON{where}", status=400) from None
    except UnicodeDecodeError:
        where = " (not UTF-8)"
        raise ApiError("Validation", f"the body is not valid JSON{where}", status=400) from None
    except ValueError:  # an integer past Python's digit limit (4,300 by default)
        raise ApiError(
            "Validation", "the body holds a number with too many digits", status=400
        ) from None
    if not isinstance(body, dict):
        raise ApiError("Validation", f"the body must be a JSON object, got {json_kind(body)}")
    return body


def listed(body: dict[str, Any], field: str, cap: int) -> list[Any]:
    """`body[field]` as a non-empty list of at most `cap` items; TEI's errors otherwise (the
    over-cap refusal in TEI's words, which clients read the cap from)."""
    if field not in body:
        raise ApiError("Validation", f"missing field `{field}`")
    items = body[field]
    if not isinstance(items, list):
        raise ApiError("Validation", f"`{field}` must be an array, got {json_kind(items)}")
    if not items:
        raise ApiError("Empty", f"`{field}` cannot be empty")
    if len(items) > cap:
        raise batch_too_large(len(items), cap)
    return items


def top_n(body: dict[str, Any], *, zero_is_all: bool = False) -> int | None:
    """The optional ``top_n``: a positive integer, or None when absent or null (all results);
    with `zero_is_all`, 0 means all too (vLLM's default)."""
    value = body.get("top_n")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError("Validation", f"`top_n` must be an integer, got {json_kind(value)}")
    if zero_is_all and value == 0:
        return None
    if value < 1:
        least = 0 if zero_is_all else 1
        raise ApiError("Validation", f"`top_n` must be at least {least}, got {value}")
    return value


def query_of(body: dict[str, Any]) -> str:
    """The required string ``query``."""
    if "query" not in body:
        raise ApiError("Validation", "missing field `query`")
    return string(body["query"], "query")


def check_model(body: dict[str, Any], served: str) -> str:
    """The request's required ``model``, which must name the served model."""
    if "model" not in body:
        raise ApiError("Validation", "missing field `model`")
    asked = string(body["model"], "model")
    if asked != served:
        raise model_not_served(asked, served)
    return asked


EXPECTED_SHAPES = (
    "expected `texts` (TEI), `documents` as strings (Jina/vLLM) or as {id, text} objects (sidecar)"
)

_AS_ONE = "give every document as a string (Jina/vLLM) or every one as {id, text} (sidecar)"


def rerank_shape(body: dict[str, Any]) -> RerankShape:
    """Which of ``POST /rerank``'s three shapes `body` is, from its fields: ``texts`` is TEI's,
    ``documents`` of strings Jina's/vLLM's, of objects the sidecar's. A body with neither field
    or both is refused naming the three; a ``documents`` list mixing strings and objects is
    refused naming the first position that differs from ``documents[0]``. A ``documents`` that
    is not a non-empty list is left to `listed` to refuse (in the sidecar's words, as before)."""
    has_texts, has_documents = "texts" in body, "documents" in body
    if has_texts and has_documents:
        raise ApiError("Validation", f"{EXPECTED_SHAPES}: give one, not both")
    if has_texts:
        return "tei"
    if not has_documents:
        raise ApiError(
            "Validation", f"{EXPECTED_SHAPES}: the body has neither `texts` nor `documents`"
        )
    items = body["documents"]
    if not isinstance(items, list) or not items:
        return "sidecar"
    first = items[0]
    kind: type
    shape: RerankShape
    if isinstance(first, str):
        kind, shape, like = str, "jina", "a string like `documents[0]`"
    elif isinstance(first, dict):
        kind, shape, like = dict, "sidecar", "an object like `documents[0]`"
    else:
        raise ApiError(
            "Validation",
            f"`documents[0]` must be a string (Jina/vLLM) or an {{id, text}} object (sidecar), "
            f"got {json_kind(first)}",
        )
    for i, item in enumerate(items):
        if not isinstance(item, kind):
            raise ApiError(
                "Validation", f"`documents[{i}]` must be {like}, got {json_kind(item)}: {_AS_ONE}"
            )
    return shape


def parse_rerank_body(raw: bytes, *, max_client_batch_size: int) -> RerankJob:
    """Read and check a ``POST /rerank`` body; `ApiError` says what was wrong.

    Malformed JSON is a 400, a body of the wrong form a 422, an empty list of texts TEI's 400
    ``Empty``, more texts than `max_client_batch_size` TEI's 422 refusal that states the cap.
    A Jina/vLLM body gives its query and texts only: its options (``model``, ``top_n``) are
    read by `retrieval_stage.server.jina.read_plain`, which the app calls instead.
    """
    body = decode_object(raw)
    return read_rerank_body(body, rerank_shape(body), max_client_batch_size=max_client_batch_size)


def read_rerank_body(
    body: dict[str, Any], shape: RerankShape, *, max_client_batch_size: int
) -> RerankJob:
    """`parse_rerank_body` of a decoded body whose `shape` `rerank_shape` told."""
    query = query_of(body)
    items = listed(body, "texts" if shape == "tei" else "documents", max_client_batch_size)
    if shape == "jina":
        texts = tuple(string(t, f"documents[{i}]") for i, t in enumerate(items))
        return RerankJob(shape="jina", query=query, texts=texts)
    if shape == "tei":
        texts = tuple(string(t, f"texts[{i}]") for i, t in enumerate(items))
        direction = body.get("truncation_direction", "Right")
        if direction not in ("Right", "right"):
            # The models truncate on the right; cutting the start instead is not offered.
            raise ApiError(
                "Validation",
                '`truncation_direction` must be "Right": this server truncates on the right',
            )
        return RerankJob(
            shape="tei",
            query=query,
            texts=texts,
            raw_scores=bool(flag(body, "raw_scores", False)),
            return_text=bool(flag(body, "return_text", False)),
            truncate=flag(body, "truncate", None),
        )
    ids: list[str] = []
    texts_list: list[str] = []
    seen: dict[str, int] = {}
    for i, document in enumerate(items):
        if not isinstance(document, dict):
            raise ApiError(
                "Validation", f"`documents[{i}]` must be an object, got {json_kind(document)}"
            )
        for key in ("id", "text"):
            if key not in document:
                hint = ""
                if key == "id" and "text" in document:
                    hint = " (the sidecar's {id, text}; Jina's {text} objects go to /v1/rerank)"
                raise ApiError("Validation", f"`documents[{i}]` has no `{key}`{hint}")
        doc_id = string(document["id"], f"documents[{i}].id")
        if doc_id in seen:
            # Scores are answered by id: two documents with one id could not be told apart.
            raise ApiError(
                "Validation", f"`documents[{i}].id` repeats the id of `documents[{seen[doc_id]}]`"
            )
        seen[doc_id] = i
        ids.append(doc_id)
        texts_list.append(string(document["text"], f"documents[{i}].text"))
    return RerankJob(shape="sidecar", query=query, texts=tuple(texts_list), ids=tuple(ids))


def ranked(job: RerankJob, scores: Sequence[float]) -> list[int]:
    """The texts' indices best first (ties in input order), once the scores are checked: one
    per text, every one finite. A bad score is a model failure (TEI: ``score is NaN``, 424),
    never sent."""
    if len(scores) != len(job.texts):
        raise ApiError("Backend", f"the model returned {len(scores)} scores for {len(job.texts)}")
    for score in scores:
        if not math.isfinite(score):
            raise ApiError("Backend", "score is NaN" if math.isnan(score) else "score is infinite")
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


def render_scores(job: RerankJob, scores: Sequence[float]) -> bytes:
    """The response body for `job` given one score per text, in input order.

    TEI's shape is sorted best first, ties in input order; the sidecar's stays in input order.
    A score that is not finite is a model failure (TEI: ``score is NaN``, 424), never sent.
    """
    order = ranked(job, scores)
    if job.shape == "sidecar":
        assert job.ids is not None
        return json.dumps(
            {"scores": [{"id": i, "score": s} for i, s in zip(job.ids, scores, strict=True)]}
        ).encode()
    if job.return_text:
        ranks: list[dict[str, Any]] = [
            {"index": i, "text": job.texts[i], "score": scores[i]} for i in order
        ]
    else:
        ranks = [{"index": i, "score": scores[i]} for i in order]
    return json.dumps(ranks).encode()


@dataclass(frozen=True, slots=True)
class ServedModel:
    """What a request is checked against: the served model's name, the texts one request may
    hold, and the longest input in tokens the model reads."""

    model: str
    max_client_batch_size: int
    max_input_length: int


@dataclass(frozen=True, slots=True)
class ApiRequest:
    """One checked request of a hosted rerank API's shape: the job, and the options beside it.

    `top_n` None answers every text. `return_documents` adds each text to its result (Jina's).
    """

    job: RerankJob
    model: str
    top_n: int | None = None
    return_documents: bool = False


@dataclass(frozen=True, slots=True)
class Answer:
    """What a response body is made of: the request (whose model is the served one), one score
    per text in input order, and the tokens the model read."""

    request: ApiRequest
    scores: Sequence[float]
    tokens: int

    def order(self) -> list[int]:
        """The indices to answer, best first (ties in input order), cut to ``top_n``."""
        return ranked(self.request.job, self.scores)[: self.request.top_n]


@dataclass(frozen=True, slots=True)
class RerankApi:
    """One hosted rerank API the server speaks: its path, how it reads a body (checking the
    model against the served one), renders an answer, and says an error."""

    shape: Shape
    path: str
    parse: Callable[[bytes, ServedModel], ApiRequest]
    """The checked request from a body, or `ApiError` saying what was wrong."""
    render: Callable[[Answer], bytes]
    error_body: Callable[[ApiError], bytes]
