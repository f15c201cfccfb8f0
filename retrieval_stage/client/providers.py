"""Wire formats of the rerank APIs people run, as data plus two small functions.

A `WireFormat` says where to POST, how the request names its fields, where the results sit in
the response and what their score is called. `build_request` and `parse_response` are shared by
every provider, so validation (the part that keeps a score on the right document) is written
once. Shapes come from each API's documentation; `docs/providers.md` has the table.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import RerankProtocolError
from ..jsonl import json_type
from ..models import Usage
from ..validate import InvalidSetting, did_you_mean

__all__ = [
    "PROVIDERS",
    "ParsedBatch",
    "WireFormat",
    "build_request",
    "check_required_fields",
    "checked_pairs",
    "get_format",
    "parse_response",
    "plain_pairs",
]

UsageReader = Callable[[Any, Mapping[str, str]], Usage]


def _no_usage(body: Any, headers: Mapping[str, str]) -> Usage:
    return Usage()


MAX_USAGE = 2**53
"""The largest usage count believed (and exported): beyond, a server is lying or broken, and a
huge count would wreck every sum it joins."""


def _tei_usage(body: Any, headers: Mapping[str, str]) -> Usage:
    raw = headers.get("x-compute-tokens", "").strip()
    if not raw.isascii() or not raw.isdigit() or len(raw) > 16:  # no int() of 5,000 digits
        return Usage()
    return Usage(total_tokens=_nonneg_int(int(raw)))


def _nonneg_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_USAGE:
        return value
    return None


def _usage_total_tokens(body: Any, headers: Mapping[str, str]) -> Usage:
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return Usage()
    return Usage(total_tokens=_nonneg_int(usage.get("total_tokens")))


def _cohere_usage(body: Any, headers: Mapping[str, str]) -> Usage:
    meta = body.get("meta") if isinstance(body, dict) else None
    billed = meta.get("billed_units") if isinstance(meta, dict) else None
    units = billed.get("search_units") if isinstance(billed, dict) else None
    value = _finite(units)
    if value is None or not 0 <= value <= MAX_USAGE:
        return Usage()
    return Usage(search_units=value)


def _finite(value: Any) -> float | None:
    """`value` as a finite float, or None: not a number, a bool, NaN, infinite, or an integer
    too large for a float (JSON allows it; ``math.isfinite`` would raise OverflowError)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


@dataclass(frozen=True, slots=True)
class WireFormat:
    """One rerank API's request and response shape.

    `results_key` None means the response is a bare JSON array (TEI). `top_n_field` None means
    the API always scores every text and the client cuts to top_k itself. `id_mapped` marks the
    sidecar contract, whose results carry the submitted ids instead of indices.
    """

    name: str
    path: str
    texts_field: str
    results_key: str | None
    score_key: str
    batch_size: int
    top_n_field: str | None = None
    send_model: bool = True
    extra: Mapping[str, Any] = field(default_factory=dict)
    usage: UsageReader = _no_usage
    id_mapped: bool = False
    auth_header: str = "Authorization"
    """The header the service's own auth expects (`Authorization: Bearer`), or ``apikey`` for
    services usually reached through a gateway. Used by `config` when no header is set; the
    client's own default stays ``apikey``."""
    requires_model: bool = False
    """The API's published request schema lists ``model`` as required: a request without one
    is refused by the server, so `check_required_fields` refuses the client instead."""
    example_model: str | None = None
    """A model the provider documents, named in the error when `requires_model` is unmet."""

    @property
    def required_fields(self) -> tuple[str, ...]:
        """The request fields the API's published spec requires (see docs/providers.md)."""
        return ("query", self.texts_field, *(("model",) if self.requires_model else ()))


PROVIDERS: Mapping[str, WireFormat] = {
    f.name: f
    for f in (
        # Hugging Face text-embeddings-inference: bare array of {index, score}; usage in the
        # x-compute-tokens header; 32 = the server's default --max-client-batch-size, used until
        # GET /info, read once by the first call that needs it, reports the real one
        # (plan.Learned).
        WireFormat(
            name="tei",
            auth_header="apikey",
            path="/rerank",
            texts_field="texts",
            results_key=None,
            score_key="score",
            batch_size=32,
            send_model=False,
            usage=_tei_usage,
        ),
        # Cohere v2 (docs.cohere.com/v2/reference/rerank): top_n defaults to all; no model in
        # the response; "we recommend against sending more than 1,000 documents".
        WireFormat(
            name="cohere",
            path="/v2/rerank",
            texts_field="documents",
            results_key="results",
            score_key="relevance_score",
            batch_size=1000,
            top_n_field="top_n",
            usage=_cohere_usage,
            # cohere-openapi.yaml, /v2/rerank: required [query, documents, model].
            requires_model=True,
            example_model="rerank-v3.5",
        ),
        # Jina (api.jina.ai/v1/rerank): top_n defaults to all; return_documents defaults to true,
        # so it is turned off. No per-request document cap is documented: 1000, as Cohere's.
        WireFormat(
            name="jina",
            path="/v1/rerank",
            texts_field="documents",
            results_key="results",
            score_key="relevance_score",
            batch_size=1000,
            top_n_field="top_n",
            extra={"return_documents": False},
            usage=_usage_total_tokens,
            # Jina's OpenAPI (api.jina.ai/openapi.json, TextRankInput): required
            # [documents, model, query].
            requires_model=True,
            example_model="jina-reranker-v2-base-multilingual",
        ),
        # Voyage (docs.voyageai.com, /v1/rerank): top_k defaults to all; "the number of
        # documents cannot exceed 1000"; results under "data".
        WireFormat(
            name="voyage",
            path="/v1/rerank",
            texts_field="documents",
            results_key="data",
            score_key="relevance_score",
            batch_size=1000,
            top_n_field="top_k",
            usage=_usage_total_tokens,
            # Voyage's OpenAPI, /rerank: required [query, documents, model].
            requires_model=True,
            example_model="rerank-2.5",
        ),
        # vLLM's Jina/Cohere-compatible endpoint (also served at /rerank and /v2/rerank):
        # top_n defaults to 0, meaning all. vLLM documents no per-request document cap: 1000.
        WireFormat(
            name="vllm",
            path="/v1/rerank",
            texts_field="documents",
            results_key="results",
            score_key="relevance_score",
            batch_size=1000,
            top_n_field="top_n",
            usage=_usage_total_tokens,
        ),
        # Infinity (michaelfeil/infinity): top_n must be > 0 when sent (omitted = all);
        # documents are capped by INFINITY_MAX_CLIENT_BATCH_SIZE, default 2048.
        WireFormat(
            name="infinity",
            path="/rerank",
            texts_field="documents",
            results_key="results",
            score_key="relevance_score",
            batch_size=2048,
            top_n_field="top_n",
            usage=_usage_total_tokens,
        ),
        # Mixedbread (/v1/reranking): texts under "input" (1 to 1000 items); top_k defaults
        # to -1, meaning all, and must lie between 1 and the number of inputs when sent.
        # Its OpenAPI (RerankParams) requires only query and input: model defaults to
        # mixedbread-ai/mxbai-rerank-large-v2. vLLM and Infinity default to the served model.
        WireFormat(
            name="mixedbread",
            path="/v1/reranking",
            texts_field="input",
            results_key="data",
            score_key="score",
            batch_size=1000,
            top_n_field="top_k",
            usage=_usage_total_tokens,
        ),
        # The seed's sidecar contract: {"query", "documents": [{"id", "text"}]} answered by
        # {"scores": [{"id", "score"}]} in input order, mapped by id; RERANKER_MAX_DOCUMENTS
        # defaults to 128.
        WireFormat(
            name="sidecar",
            auth_header="apikey",
            path="/rerank",
            texts_field="documents",
            results_key="scores",
            score_key="score",
            batch_size=128,
            send_model=False,
            id_mapped=True,
        ),
    )
}
"""Every provider the client speaks, by the name given as ``provider=``."""


def get_format(provider: str) -> WireFormat:
    """The wire format named `provider`; otherwise `InvalidSetting` (a ValueError) for the
    ``provider`` field, naming the known ones and the closest."""
    try:
        return PROVIDERS[provider]
    except (KeyError, TypeError):  # TypeError: not hashable, so no provider's name
        known = sorted(PROVIDERS)
        close = did_you_mean(provider, known) if isinstance(provider, str) else ""
        raise InvalidSetting(
            "provider", f"{provider!r}{close}; known: {', '.join(known)}", "unknown rerank provider"
        ) from None


def check_required_fields(fmt: WireFormat, *, model: str | None, label: str = "model=") -> None:
    """Refuse, before any I/O, a client whose requests `fmt`'s API would reject for a missing
    required field. The client always sends the query and the texts, so only the model can be
    missing: `validate.InvalidSetting` (a ValueError) with ``field == "model"``, naming the
    provider and a model it documents; `label` is what the user called the value (``model=``,
    ``RERANK_MODEL``, ``--model``). A model that is given must be a non-empty string (``""`` is
    as good as none, and Mixedbread's spec refuses it).
    """
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise InvalidSetting("model", f"must be a non-empty str or None, got {model!r}", label)
    if fmt.requires_model and model is None:
        example = f" (e.g. {fmt.example_model!r})" if fmt.example_model else ""
        raise InvalidSetting("model", f"is required by provider {fmt.name!r}{example}", label)


@dataclass(frozen=True, slots=True)
class ParsedBatch:
    """A validated response: (index within the batch, score) pairs, usage and model."""

    pairs: list[tuple[int, float]]
    usage: Usage
    model: str | None


def build_request(
    fmt: WireFormat,
    query: str,
    texts: Sequence[str],
    *,
    model: str | None,
    top_n: int | None,
) -> dict[str, Any]:
    """The JSON body for one batch. `top_n` is sent only where the API takes one.

    `top_n` None leaves the field out, which every API documents as "all" (vLLM's 0 and
    Mixedbread's -1 are never sent: Infinity and Cohere reject values below 1).
    """
    if top_n is not None and (isinstance(top_n, bool) or top_n < 1):
        raise ValueError(f"top_n must be a positive int or None, got {top_n!r}")
    body: dict[str, Any] = {"query": query}
    if fmt.send_model and model is not None:
        body["model"] = model
    if fmt.id_mapped:
        body[fmt.texts_field] = [{"id": str(i), "text": t} for i, t in enumerate(texts)]
    else:
        body[fmt.texts_field] = list(texts)
    if fmt.top_n_field is not None and top_n is not None:
        body[fmt.top_n_field] = top_n
    body.update(fmt.extra)
    return body


def expected_results(fmt: WireFormat, n_texts: int, top_n: int | None) -> int:
    """How many results a valid response holds: min(top_n, n) where sent, else n."""
    if fmt.top_n_field is not None and top_n is not None:
        return min(top_n, n_texts)
    return n_texts


def _keys(entry: Mapping[str, Any]) -> str:
    """An entry's keys only: its values may be document text, which must not reach logs."""
    shown = sorted(entry)[:8]
    return f"keys {shown}" if shown else "an empty object"


def _describe(value: Any) -> str:
    """`value` as short JSON for a message; never raises (deep nesting, huge integers)."""
    try:
        text = json.dumps(value, default=repr)
    except (ValueError, RecursionError):
        text = f"a deeply nested {json_type(value)}"
    return text if len(text) <= 80 else text[:77] + "..."


def _score(entry: Mapping[str, Any], key: str, position: int) -> float:
    if key not in entry:
        raise RerankProtocolError(f"result {position} has no {key!r}: {_keys(entry)}")
    score = entry[key]
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        raise RerankProtocolError(
            f"result {position}: {key!r} must be a number, got {_describe(score)}"
        )
    value = _finite(score)
    if value is None:
        raise RerankProtocolError(f"result {position}: {key!r} is not finite ({_describe(score)})")
    return value


def _entries(fmt: WireFormat, body: Any) -> list[Any]:
    if fmt.results_key is None:
        if isinstance(body, list):
            return body
        keys = f" with keys {sorted(body)[:5]}" if isinstance(body, dict) else ""
        raise RerankProtocolError(
            f"{fmt.name}: expected a bare JSON array of results, got {type(body).__name__}{keys}"
        )
    if not isinstance(body, dict):
        raise RerankProtocolError(
            f"{fmt.name}: expected a JSON object with {fmt.results_key!r}, "
            f"got {type(body).__name__}"
        )
    entries = body.get(fmt.results_key)
    if not isinstance(entries, list):
        raise RerankProtocolError(
            f"{fmt.name}: expected {fmt.results_key!r} to be an array, "
            f"got {type(entries).__name__ if fmt.results_key in body else 'nothing'}"
        )
    return entries


def _key_of(fmt: WireFormat, entry: Mapping[str, Any], position: int, n_texts: int) -> int:
    if fmt.id_mapped:
        raw_id = entry.get("id")
        if (
            not isinstance(raw_id, str)
            or not (raw_id.isascii() and raw_id.isdigit())
            or len(raw_id) > 18  # no int() of 5,000 digits: no batch has 10**18 texts
            or str(int(raw_id)) != raw_id
            or int(raw_id) >= n_texts
        ):
            raise RerankProtocolError(
                f"result {position}: unknown id {_describe(raw_id)} (not one of the "
                f"{n_texts} submitted ids)"
            )
        return int(raw_id)
    if "index" not in entry:
        raise RerankProtocolError(f"result {position} has no 'index': {_keys(entry)}")
    index = entry["index"]
    if isinstance(index, bool) or not isinstance(index, int):
        raise RerankProtocolError(
            f"result {position}: 'index' must be an integer, got {_describe(index)}"
        )
    if not 0 <= index < n_texts:
        raise RerankProtocolError(
            f"result {position}: index {index} out of range for {n_texts} texts"
        )
    return index


def parse_response(
    fmt: WireFormat,
    body: Any,
    headers: Mapping[str, str],
    *,
    n_texts: int,
    expected: int,
) -> ParsedBatch:
    """Validate a decoded response body and return its (index, score) pairs.

    Raises `RerankProtocolError` for anything off-contract: the wrong envelope, an entry that
    is not an object, a missing, non-integer, out-of-range or duplicate index (or sidecar id), a
    score that is not a finite number, or a result count other than `expected`. Linear in the
    number of results. The plain case (`plain_pairs`) is taken without building a message; any
    other response is checked result by result (`checked_pairs`).
    """
    entries = _entries(fmt, body)
    if len(entries) > expected:  # before any per-result work: a flood is refused at once
        raise RerankProtocolError(
            f"{fmt.name}: expected {expected} results for {n_texts} texts, got {len(entries)}"
        )
    pairs = None
    if not fmt.id_mapped and len(entries) == expected:
        pairs = plain_pairs(entries, fmt.score_key, n_texts)
    if pairs is None:
        pairs = checked_pairs(fmt, entries, n_texts=n_texts, expected=expected)
    model = body.get("model") if isinstance(body, dict) else None
    return ParsedBatch(
        pairs=pairs,
        usage=fmt.usage(body, headers),
        model=model if isinstance(model, str) else None,
    )


def checked_pairs(
    fmt: WireFormat, entries: list[Any], *, n_texts: int, expected: int
) -> list[tuple[int, float]]:
    """The (index, score) pairs of `entries`, each result checked and the first fault named
    (`RerankProtocolError`): the reference `plain_pairs` must agree with."""
    seen: set[int] = set()
    pairs: list[tuple[int, float]] = []
    for position, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise RerankProtocolError(
                f"result {position} must be a JSON object, got {json_type(entry)}"
            )
        index = _key_of(fmt, entry, position, n_texts)
        if index in seen:
            what = f"id {str(index)!r}" if fmt.id_mapped else f"index {index}"
            raise RerankProtocolError(f"result {position}: duplicate {what}")
        seen.add(index)
        pairs.append((index, _score(entry, fmt.score_key, position)))
    if len(pairs) != expected:
        missing = sorted(set(range(n_texts)) - seen)[:10]
        raise RerankProtocolError(
            f"{fmt.name}: expected {expected} results for {n_texts} texts, got {len(pairs)}"
            + (f"; unscored indices include {missing}" if expected == n_texts else "")
        )
    return pairs


def plain_pairs(entries: list[Any], score_key: str, n_texts: int) -> list[tuple[int, float]] | None:
    """The pairs of a response whose every result is the plain case, else None.

    The plain case is what servers send: each result a JSON object whose index is an int in
    range, not seen before, and whose score is a finite float. Anything else (a missing key,
    an int or bool score, a duplicate, NaN) returns None, and `checked_pairs` then names what
    is wrong; for a plain response both give the same pairs. Exact type checks (``type(x) is
    int`` refuses a bool) and no message building make it several times cheaper per result
    than the checks that explain (they were a tenth of the async client's CPU per call at 64
    concurrent callers, issue 26).
    """
    seen = [False] * n_texts
    pairs: list[tuple[int, float]] = []
    append, finite = pairs.append, math.isfinite
    for entry in entries:
        if type(entry) is not dict:
            return None
        index = entry.get("index")
        score = entry.get(score_key)
        if (
            type(index) is not int
            or type(score) is not float
            or not 0 <= index < n_texts
            or seen[index]
            or not finite(score)
        ):
            return None
        seen[index] = True
        append((index, score))
    return pairs
