"""The pipeline's CHAIN and RETRIEVER spans, around the stage's RERANKER span.

One `Pipeline.run` is one trace: a CHAIN span ``pipeline`` with the query and the result ids,
holding a RETRIEVER span ``recall`` with the recalled documents (head first, as many as the
attribute limit allows) and the stage's RERANKER span. Every value is capped exactly like the
RERANKER span's (`content.cap_content`, `content.metadata_json`) and masked by the same
`TraceConfig`, so ``OPENINFERENCE_HIDE_*`` applies to every span of the call alike.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Literal

from openinference.instrumentation import (
    TraceConfig,
    get_input_attributes,
    get_output_attributes,
    get_retriever_attributes,
    get_span_kind_attributes,
)
from openinference.semconv.trace import OpenInferenceSpanKindValues
from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span, Status, StatusCode, TracerProvider
from opentelemetry.util.types import AttributeValue

from .._version import __version__
from ..models import Candidate, Reranked
from .content import cap_content, metadata_json
from .keys import (
    ATTR_CANCELLED,
    ATTR_DOCUMENTS,
    ATTR_FALLBACK,
    ATTR_RECALL,
    ATTR_RECALL_K,
    ATTR_RETRIEVAL_OMITTED,
)
from .otel_private import attribute_limit, tracing_suppressed
from .reranker import context_attributes
from .status import mark_ok

__all__ = ["PipelineSpans"]


class PipelineSpans:
    """Writes a pipeline's CHAIN and RETRIEVER spans with one tracer, cap and `TraceConfig`."""

    def __init__(
        self,
        tracer_provider: TracerProvider | None,
        *,
        trace_config: TraceConfig,
        max_content_length: int,
        recall_name: str,
        recall_k: int,
    ) -> None:
        self.trace_config = trace_config
        self.max_content_length = max_content_length
        self.recall_name = recall_name
        self.recall_k = recall_k
        self._tracer = trace.get_tracer(
            "retrieval_stage", __version__, tracer_provider=tracer_provider
        )

    def chain(self, query: str) -> Any:
        """The CHAIN span ``pipeline``, current for the whole call."""
        return self._started("pipeline", OpenInferenceSpanKindValues.CHAIN, query)

    def retriever(self, query: str) -> Any:
        """The RETRIEVER span ``recall``, current while recall runs."""
        return self._started("recall", OpenInferenceSpanKindValues.RETRIEVER, query)

    @contextmanager
    def _started(self, name: str, kind: OpenInferenceSpanKindValues, query: str) -> Iterator[Span]:
        """A current span of `kind` with the query, then the context attributes; none (the
        invalid span) under suppression."""
        if tracing_suppressed():
            yield INVALID_SPAN
            return
        attributes = {
            **self._masked({**get_span_kind_attributes(kind), **self._input(query)}),
            **context_attributes(),
        }
        with (
            self._tracer.start_as_current_span(name, attributes=attributes) as span,
            _cancellation_marked(span),
        ):
            yield span
            mark_ok(span)  # not reached on an exception; a fallback has set ERROR already

    def _input(self, query: str) -> dict[str, Any]:
        """The query and the recall's name, capped at the stage's `max_content_length`."""
        cap = self.max_content_length
        return {
            **get_input_attributes(cap_content(query, cap), mime_type="text/plain"),
            ATTR_RECALL: cap_content(self.recall_name, cap),
            ATTR_RECALL_K: self.recall_k,
        }

    def record_documents(self, span: Span, recalled: list[Candidate]) -> None:
        """The recalled documents, head first, as many as the span's attribute limit allows."""
        if not span.is_recording():
            return
        span.set_attribute(ATTR_DOCUMENTS, len(recalled))
        limit = attribute_limit(span)
        used = len(getattr(span, "attributes", None) or {})
        budget = None if limit is None else limit - used - 1  # one slot for the omitted count
        documents = [_document(c, self.max_content_length) for c in recalled]
        kept = 0
        if budget is None:
            kept = len(documents)
        else:
            for document in documents:
                size = len(get_retriever_attributes(documents=[document]))
                if size > budget:
                    break
                budget -= size
                kept += 1
        attributes = self._masked(get_retriever_attributes(documents=documents[:kept]))
        if kept < len(recalled):
            attributes[ATTR_RETRIEVAL_OMITTED] = len(recalled) - kept
        span.set_attributes(attributes)

    def finish_chain(self, span: Span, results: list[Reranked], fallback_cause: str | None) -> None:
        """The CHAIN span's output (the result ids) and, on a fallback, its ERROR status."""
        if not span.is_recording():
            return
        cap = self.max_content_length
        value, mime_type = _output_value([cap_content(r.candidate.id, cap) for r in results], cap)
        attributes = self._masked(get_output_attributes(value, mime_type=mime_type))
        attributes[ATTR_FALLBACK] = fallback_cause is not None
        span.set_attributes(attributes)
        if fallback_cause is not None:
            span.set_status(Status(StatusCode.ERROR, fallback_cause))

    def _masked(self, attributes: Mapping[str, Any]) -> dict[str, AttributeValue]:
        """The attributes after ``OPENINFERENCE_HIDE_*`` masking; hidden ones are dropped."""
        out: dict[str, AttributeValue] = {}
        for key, value in attributes.items():
            masked = self.trace_config.mask(key, value)
            if masked is not None:
                out[key] = masked
        return out


@contextmanager
def _cancellation_marked(span: Span) -> Iterator[None]:
    """End `span` as ERROR "cancelled" when an `arun` is cancelled inside it.

    `CancelledError` is not an `Exception`, so the span manager would end the span as if all
    went well (as `RerankStage.arun` does for its own span).
    """
    try:
        yield
    except asyncio.CancelledError:
        span.set_status(Status(StatusCode.ERROR, "cancelled"))
        span.set_attribute(ATTR_CANCELLED, True)
        raise


def _document(candidate: Candidate, max_content_length: int) -> Any:
    """An OpenInference `Document` for the RETRIEVER span, capped and sanitised exactly like
    the RERANKER span's documents (`spans.cap_content`, `spans.metadata_json`)."""
    document: dict[str, Any] = {
        "id": cap_content(candidate.id, max_content_length),
        "content": cap_content(candidate.text, max_content_length),
    }
    if candidate.score is not None:
        document["score"] = candidate.score
    if candidate.metadata:
        document["metadata"] = metadata_json(candidate.metadata, max_content_length)
    return document


def _output_value(
    ids: Sequence[str], max_bytes: int
) -> tuple[str, Literal["application/json", "text/plain"]]:
    """(value, mime type) for the CHAIN span's output: the result ids as a JSON list, or, when
    that is longer than `max_bytes`, its capped text (no longer JSON, so ``text/plain``)."""
    text = json.dumps(list(ids), ensure_ascii=False)
    capped = cap_content(text, max_bytes)
    return (text, "application/json") if capped == text else (capped, "text/plain")
