"""OpenTelemetry's GenAI conventions for a rerank call, written beside OpenInference's, opt-in.

OpenInference stays the primary convention: every RERANKER span carries its keys whatever is
set here. OpenTelemetry's GenAI conventions are experimental, and their rerank operation is
still a proposal (semantic-conventions-genai#253), so, as OpenTelemetry's own GenAI
instrumentations do, the names are written only when ``OTEL_SEMCONV_STABILITY_OPT_IN`` (a
comma-separated list) contains ``gen_ai_latest_experimental``. The stage reads that once, when
it is built (`genai_opted_in`); its ``genai_conventions=`` keyword overrides it. What each
call then adds is built here:

- `start_attributes`: on the span at start (so no attribute limit can evict them) and, minus
  the rerank counts, on the ``gen_ai.client.operation.duration`` point;
- `error_type`: ``error.type`` of a failed call, as OpenTelemetry's rules want it;
- `server_of`: ``server.address``/``server.port`` from a client's base URL, never its
  credentials, path or query;
- `provider_name`: our provider names as ``gen_ai.provider.name`` values (`PROVIDER_NAMES`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import MappingProxyType
from urllib.parse import urlsplit

from opentelemetry.util.types import AttributeValue

from ..errors import RerankStatusError
from .keys import (
    ATTR_GEN_AI_OPERATION_NAME,
    ATTR_GEN_AI_PROVIDER_NAME,
    ATTR_GEN_AI_REQUEST_MODEL,
    ATTR_GEN_AI_RERANK_CANDIDATE_COUNT,
    ATTR_GEN_AI_RERANK_TOP_N,
    ATTR_SERVER_ADDRESS,
    ATTR_SERVER_PORT,
)

__all__ = [
    "GENAI_OPT_IN",
    "OPERATION_RERANK",
    "PROVIDER_NAMES",
    "STABILITY_OPT_IN_ENV",
    "error_type",
    "genai_opted_in",
    "provider_name",
    "server_of",
    "start_attributes",
]

STABILITY_OPT_IN_ENV = "OTEL_SEMCONV_STABILITY_OPT_IN"
"""OpenTelemetry's variable for opting in to semantic conventions that are not stable yet."""

GENAI_OPT_IN = "gen_ai_latest_experimental"
"""The value in `STABILITY_OPT_IN_ENV` that turns the GenAI names on."""

OPERATION_RERANK = "rerank"
"""``gen_ai.operation.name`` of a rerank call (semantic-conventions-genai#253)."""

PROVIDER_NAMES: Mapping[str, str] = MappingProxyType({"cohere": "cohere"})
"""Our provider names that map to an OpenTelemetry well-known ``gen_ai.provider.name`` value
other than themselves would go here; today only Cohere has one, and it is spelled as ours.
Every other provider (``tei``, ``jina``, ``voyage``, ``vllm``, ``infinity``, ``mixedbread``,
``sidecar``, ``local``, ``lexical``, a user's own) has no well-known value, and the
conventions ask for a custom one then: our own name, as on ``retrieval_stage.provider``."""

_DEFAULT_PORTS = MappingProxyType({"http": 80, "https": 443})


def genai_opted_in(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``OTEL_SEMCONV_STABILITY_OPT_IN`` lists ``gen_ai_latest_experimental``.

    Parsed as OpenTelemetry's instrumentations parse it: split on commas, each entry stripped,
    exact match (``gen_ai_latest_experimental/dup`` or another case is not it)."""
    raw = (os.environ if environ is None else environ).get(STABILITY_OPT_IN_ENV, "")
    return GENAI_OPT_IN in (entry.strip() for entry in raw.split(","))


def provider_name(provider: str) -> str:
    """``gen_ai.provider.name`` for one of our provider names (see `PROVIDER_NAMES`)."""
    return PROVIDER_NAMES.get(provider, provider)


def server_of(base_url: str | None) -> tuple[str, int] | None:
    """``(server.address, server.port)`` of a reranker's base URL, or None when it has none
    or it cannot be parsed.

    Only the host and the port: the ``user:password@`` part, the path prefix and any query
    never leave here. The port is the URL's, else the scheme's default (80, 443), since the
    conventions want ``server.port`` whenever ``server.address`` is set; an IPv6 address is
    given without its brackets."""
    if not base_url:
        return None
    try:
        parts = urlsplit(base_url)
        host = parts.hostname
        port = parts.port
    except ValueError:  # a port that is not a number
        return None
    if not host:
        return None
    if port is None:
        port = _DEFAULT_PORTS.get(parts.scheme.lower())
        if port is None:
            return None
    return host, port


def start_attributes(
    *,
    provider: str | None,
    request_model: str | None,
    server: tuple[str, int] | None,
    candidates: int | None = None,
    top_n: int | None = None,
) -> dict[str, AttributeValue]:
    """The GenAI names a call knows before it runs: the operation, provider, requested model
    and server, and (for the span) how many candidates it reranks and the cut it asked for.

    `candidates` and `top_n` None leave their keys out (the duration point takes neither:
    counts per call would split its series); `top_n` is None when every result is kept."""
    attributes: dict[str, AttributeValue] = {ATTR_GEN_AI_OPERATION_NAME: OPERATION_RERANK}
    if provider is not None:
        attributes[ATTR_GEN_AI_PROVIDER_NAME] = provider_name(provider)
    if request_model is not None:
        attributes[ATTR_GEN_AI_REQUEST_MODEL] = request_model
    if server is not None:
        attributes[ATTR_SERVER_ADDRESS], attributes[ATTR_SERVER_PORT] = server
    if candidates is not None:
        attributes[ATTR_GEN_AI_RERANK_CANDIDATE_COUNT] = candidates
    if top_n is not None:
        attributes[ATTR_GEN_AI_RERANK_TOP_N] = top_n
    return attributes


def error_type(exc: BaseException) -> str:
    """``error.type`` of a failed call, by OpenTelemetry's rules: an HTTP error's status code
    as a string (``"503"``, as its HTTP conventions write it), else the exception's qualified
    class name (``RerankTransportError``; a nested class as ``Vendor.Error``), the class name
    within its package, as OpenTelemetry's Python GenAI instrumentations write it. Both are
    low-cardinality, as a metric attribute must be."""
    if isinstance(exc, RerankStatusError):
        return str(exc.status_code)
    return type(exc).__qualname__
