"""What kind each server span is, and the request span as a RERANKER span for callers that
have none of their own.

Phoenix shows a span without ``openinference.span.kind`` as "unknown", and a trace that began
in a client without OpenInference (curl, LlamaIndex's ``TextEmbeddingInference``, Haystack's TEI
ranker) would show no reranker at all. So:

- a ``POST`` to a rerank route whose direct caller did not say it holds the RERANKER span
  (`retrieval_stage.spans.handoff`: an ``x-rstage-reranker`` header naming a span of the
  request's own trace) makes the request span
  the rerank's RERANKER span: kind and model when the request starts (`request_kind`), then
  ``reranker.top_k`` and the output documents once it is answered (`reranker_outcome`), each
  document's id its input position (the ``index`` TEI answers) and its score the one answered;
- every other request span (``GET /info``, a request whose traced caller has its own RERANKER
  span, a path not served) and every ``rerank.batch`` span is a CHAIN: OpenInference's kind
  for a link between steps, which a server hop and a model batch under a RERANKER are (none of
  LLM, EMBEDDING, RETRIEVER, TOOL, AGENT, GUARDRAIL, EVALUATOR or PROMPT describes them, and the
  RERANKER is the one step that holds the documents).

The query and the texts reach the span only when the server was started with
``--trace-content`` (`ServerSettings.trace_content`): the texts as input documents and on the
output documents, the query as ``reranker.query`` and ``input.value``. Without it the span holds
positions and scores only: the input documents by position alone (so Phoenix shows "N
documents" on both sides, not an empty Input box that reads as a failure) and
``retrieval_stage.content`` saying that the content is off and how to turn it on.
``OPENINFERENCE_HIDE_INPUTS``/``_OUTPUTS`` mask as on the client's span. The documents are
flattened and fitted under the span's attribute limit by the client's own code
(`retrieval_stage.spans.fit.outcome_attributes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from openinference.instrumentation import TraceConfig
from openinference.semconv.trace import (
    OpenInferenceSpanKindValues,
    RerankerAttributes,
    SpanAttributes,
)
from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from .._log import get_logger
from ..models import Candidate, reranked_outputs
from ..spans.content import DEFAULT_MAX_CONTENT_BYTES, cap_content
from ..spans.fit import outcome_attributes, room
from ..spans.handoff import handed_off
from ..spans.keys import ATTR_CONTENT, ATTR_INPUT_OMITTED
from ..spans.otel_private import set_span_attributes
from ..spans.reranker import identity_attributes
from .wire import RerankJob, ranked

__all__ = [
    "CHAIN",
    "RERANKER",
    "is_reranker_span",
    "ranked_positions",
    "request_kind",
    "reranker_outcome",
]

RERANKER = OpenInferenceSpanKindValues.RERANKER.value
CHAIN = OpenInferenceSpanKindValues.CHAIN.value
_KIND = SpanAttributes.OPENINFERENCE_SPAN_KIND
_INPUT_ID = RerankerAttributes.RERANKER_INPUT_DOCUMENTS + ".{}.document.id"

CONTENT_OFF = "off: start serve with --trace-content to record the query and the texts"
"""`ATTR_CONTENT` on a RERANKER span written without the query and the texts."""

_log = get_logger("retrieval_stage.server")


def request_kind(
    span: trace.Span, scope: dict[str, Any], rerank_paths: Sequence[str], model: str
) -> None:
    """Set the request `span`'s OpenInference kind as it starts (so no attribute limit can
    evict it): RERANKER with the served `model` for a ``POST`` to one of `rerank_paths` whose
    caller has no RERANKER span of its own, else CHAIN."""
    if not span.is_recording():
        return
    rerank = (
        scope.get("method") == "POST"
        and scope.get("path") in rerank_paths
        and not handed_off(scope.get("headers") or (), span.get_span_context())
    )
    if rerank:
        span.set_attributes({_KIND: RERANKER, RerankerAttributes.RERANKER_MODEL_NAME: model})
    else:
        span.set_attribute(_KIND, CHAIN)


def is_reranker_span(span: trace.Span) -> bool:
    """True when `request_kind` made `span` this request's RERANKER span."""
    attributes = getattr(span, "attributes", None) or {}
    return bool(span.is_recording() and attributes.get(_KIND) == RERANKER)


def reranker_outcome(
    span: trace.Span,
    *,
    query: str,
    texts: Sequence[str],
    scores: Sequence[float],
    top_n: int | None,
    model: str,
    content: bool,
    config: TraceConfig | None = None,
    max_bytes: int = DEFAULT_MAX_CONTENT_BYTES,
) -> None:
    """The answered rerank on its RERANKER `span`: ``reranker.top_k`` (the results answered),
    the output documents best first (id: the input position; score: the one answered), and
    with `content` the query and the texts. A no-op on any other span; never raises (telemetry
    must not turn an answered rerank into an error)."""
    if not is_reranker_span(span):
        return
    try:
        order = ranked_positions(texts, scores, top_n)
        config = config if config is not None else TraceConfig()
        stats: dict[str, AttributeValue]
        if content:
            stats = identity_attributes(
                query=query,
                model_name=cap_content(model, max_bytes),
                top_k=len(order),
                provider=None,
                documents=len(texts),
                config=config,
                max_bytes=max_bytes,
            )
            del stats[_KIND]  # set at start; rewriting it would move it to the end
        else:
            stats = {RerankerAttributes.RERANKER_TOP_K: len(order), ATTR_CONTENT: CONTENT_OFF}
        candidates = [Candidate(str(i), t if content else "") for i, t in enumerate(texts)]
        outputs = reranked_outputs(candidates, [(i, float(scores[i])) for i in order])
        attributes = outcome_attributes(
            span,
            stats,
            candidates if content else (),
            outputs,
            config=config,
            max_content_length=max_bytes,
            output_content=content,
        )
        if not content and not config.hide_inputs:
            attributes.update(_input_positions(span, len(texts), len(attributes)))
        set_span_attributes(span, attributes)
    except Exception as exc:  # pragma: no cover - defensive, as the client's span writer
        _log.warning("server.span_attributes_failed", caused_by=type(exc).__name__)


def _input_positions(span: trace.Span, n: int, taken: int) -> dict[str, AttributeValue]:
    """The input documents as their positions alone (``reranker.input_documents.<i>.document.id``
    ``= "<i>"``, no text), so Phoenix lists "n documents" on the Input side too; as many as the
    span's attribute limit leaves room for after the `taken` outcome attributes (the output
    documents, which carry the scores, come first), with the omitted count when cut."""
    space = room(span)
    kept = n if space is None else max(min(n, space - taken - 1), 0)
    out: dict[str, AttributeValue] = {_INPUT_ID.format(i): str(i) for i in range(kept)}
    if kept < n:
        out[ATTR_INPUT_OMITTED] = n - kept
    return out


def ranked_positions(texts: Sequence[str], scores: Sequence[float], top_n: int | None) -> list[int]:
    """The input positions answered, best first (ties in input order), cut to `top_n`: the
    order the response lists them in (`retrieval_stage.server.wire.ranked`)."""
    job = RerankJob(shape="tei", query="", texts=tuple(texts))
    return ranked(job, scores)[:top_n]
