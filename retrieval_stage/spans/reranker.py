"""The RERANKER span: one writer that owns it whole, from identity to outcome.

`RerankerSpans` is made once per stage with its tracing settings; `start` opens one call's span
(current while the reranker runs) with its identity set at start, so no attribute limit can
evict it (`fit`), then OpenInference's context attributes that fit. The `RerankerSpan` it yields
takes the call's outcome in one step: `succeeded`, `fell_back`, `raised` or `cancelled`, which
write the outcome, the output value and the documents (`fit.outcome_plan`; the documents as a
record the span flattens when it is read, `deferred`), masked by the
stage's `TraceConfig` (``OPENINFERENCE_HIDE_INPUTS``/``_OUTPUTS``). Under OpenTelemetry's
suppression key or OpenInference's `suppress_tracing` no span is made and every method is a
no-op. Keys come from `openinference-semantic-conventions`, never typed by hand.

With OpenTelemetry's GenAI opt-in (`genai.genai_opted_in`, read when the writer is built, or
``genai=`` given), the same span also carries OpenTelemetry's experimental GenAI names: the
stage hands them to `start` as ``genai=`` (`genai.start_attributes`), `succeeded` takes
``gen_ai.response.model`` in its ``extra``, and a failure's ``error.type`` is written by
OpenTelemetry's rules (`genai.error_type`) instead of the bare class name. Without it the span
is what it always was, for a None test at start and a boolean test on a failure.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

from openinference.instrumentation import TraceConfig, get_attributes_from_context
from openinference.semconv.trace import (
    OpenInferenceMimeTypeValues,
    OpenInferenceSpanKindValues,
    RerankerAttributes,
    SpanAttributes,
)
from opentelemetry import context, trace
from opentelemetry.trace import INVALID_SPAN, Span, Status, StatusCode, TracerProvider
from opentelemetry.util.types import AttributeValue

from .._log import get_logger
from .._version import __version__
from ..models import Candidate, Reranked, Usage
from ..validate import InvalidSetting, env_flag
from .content import DEFAULT_MAX_CONTENT_BYTES, cap_content, output_value
from .deferred import defer_from_env, write_outcome
from .fit import fit_head, outcome_plan
from .genai import error_type, genai_opted_in
from .keys import (
    ATTR_BATCHES,
    ATTR_CANCELLED,
    ATTR_DOCUMENTS,
    ATTR_ERROR_TYPE,
    ATTR_FALLBACK,
    ATTR_MODEL_PRECISION,
    ATTR_PROVIDER,
    ATTR_REQUESTS,
    ATTR_RETRIES,
    ATTR_TOP1_CHANGED,
    ATTR_USAGE_SEARCH_UNITS,
    ATTR_USAGE_TOTAL_TOKENS,
)
from .otel_private import plain_attributes, tracing_suppressed
from .status import mark_ok

__all__ = [
    "FALLBACK_STATUS_PREFIX",
    "OUTPUT_CONTENT_ENV",
    "RerankerSpan",
    "RerankerSpans",
    "context_attributes",
    "fallback_description",
    "identity_attributes",
    "masks_nothing",
    "output_content_from_env",
]

log = get_logger("retrieval_stage.spans")

FALLBACK_STATUS_PREFIX = "fell back to recall order: "
"""How the status description of a span whose rerank fell back begins."""

OUTPUT_CONTENT_ENV = "RETRIEVAL_STAGE_OUTPUT_CONTENT"
"""``0``/``false``/``no``/``off``: output documents carry id and score only (see `RerankStage`)."""

_TEXT = OpenInferenceMimeTypeValues.TEXT.value
_RERANKER = OpenInferenceSpanKindValues.RERANKER.value
_JSON = OpenInferenceMimeTypeValues.JSON.value


def identity_attributes(
    *,
    query: str,
    model_name: str | None,
    top_k: int | None,
    provider: str | None,
    documents: int,
    config: TraceConfig,
    max_bytes: int = DEFAULT_MAX_CONTENT_BYTES,
    precision: str | None = None,
) -> dict[str, AttributeValue]:
    """What makes the span a RERANKER span: set at start, before anything can evict it.
    `precision` is an in-process model's (``fp32``, ``int8``), None for a remote one.

    The query goes on the span twice: as ``reranker.query`` (Phoenix's reranker view) and as
    ``input.value`` (what Phoenix's span list shows), masked alike by ``OPENINFERENCE_HIDE_INPUTS``.
    """
    attributes: dict[str, AttributeValue] = {SpanAttributes.OPENINFERENCE_SPAN_KIND: _RERANKER}
    capped = cap_content(query, max_bytes)
    unmasked = masks_nothing(config)
    masked = capped if unmasked else config.mask(RerankerAttributes.RERANKER_QUERY, capped)
    if masked is not None:
        attributes[RerankerAttributes.RERANKER_QUERY] = masked
    if model_name is not None:
        attributes[RerankerAttributes.RERANKER_MODEL_NAME] = model_name
    if top_k is not None:
        attributes[RerankerAttributes.RERANKER_TOP_K] = top_k
    if provider is not None:
        attributes[ATTR_PROVIDER] = provider
    if precision is not None:
        attributes[ATTR_MODEL_PRECISION] = precision
    attributes[ATTR_DOCUMENTS] = documents
    value = capped if unmasked else config.mask(SpanAttributes.INPUT_VALUE, capped)
    if value is not None:
        attributes[SpanAttributes.INPUT_VALUE] = value
    mime_type = _TEXT if unmasked else config.mask(SpanAttributes.INPUT_MIME_TYPE, _TEXT)
    if mime_type is not None:
        attributes[SpanAttributes.INPUT_MIME_TYPE] = mime_type
    return attributes


def masks_nothing(config: TraceConfig) -> bool:
    """True when ``config.mask`` returns every value of the RERANKER span's own keys (query,
    input and output value and mime type) as given: OpenInference's own `TraceConfig` (a
    subclass may mask as it likes) hiding neither inputs nor outputs, whatever its other
    settings (they mask keys of other span kinds). Then the span skips its five ``mask`` calls,
    each a walk through two dozen settings (issue 26)."""
    return type(config) is TraceConfig and not config.hide_inputs and not config.hide_outputs


def context_attributes() -> dict[str, AttributeValue]:
    """OpenInference's context attributes (`using_session`, `using_user`, `using_metadata`,
    `using_tags`, `using_attributes`) attached to the current OpenTelemetry context."""
    return dict(get_attributes_from_context())


def fallback_description(exc: BaseException, max_bytes: int = DEFAULT_MAX_CONTENT_BYTES) -> str:
    """The status description of a span whose rerank fell back: what happened, then why."""
    return cap_content(f"{FALLBACK_STATUS_PREFIX}{type(exc).__name__}: {exc}", max_bytes)


def output_content_from_env() -> bool:
    """Whether output documents carry their content, from `OUTPUT_CONTENT_ENV` (default yes).

    An unparseable value is logged once per call site's stage and the default kept, as
    OpenInference's `TraceConfig` does with its own variables.
    """
    try:
        value = env_flag(OUTPUT_CONTENT_ENV)
    except InvalidSetting:
        raw = os.environ.get(OUTPUT_CONTENT_ENV, "")
        log.warning("rerank.config_invalid", variable=OUTPUT_CONTENT_ENV, value=raw, kept=True)
        return True
    return True if value is None else value


class RerankerSpans:
    """Writes the RERANKER spans of one stage, with its tracer and its span settings."""

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        *,
        trace_config: TraceConfig,
        max_content_length: int = DEFAULT_MAX_CONTENT_BYTES,
        output_content: bool = True,
        genai: bool | None = None,
    ) -> None:
        self.trace_config = trace_config
        self.max_content_length = max_content_length
        self.output_content = output_content
        self.genai = genai_opted_in() if genai is None else genai
        """Whether spans carry OpenTelemetry's GenAI names (`genai`): given, else the
        environment's ``OTEL_SEMCONV_STABILITY_OPT_IN`` as it was when this was built."""
        self.defer_documents = defer_from_env()
        """Whether a span's documents stay a record until the span is read (`deferred`):
        ``RETRIEVAL_STAGE_DEFER_DOCUMENTS`` as it was when this was built, default yes."""
        self._tracer = trace.get_tracer(
            "retrieval_stage", __version__, tracer_provider=tracer_provider
        )

    def start(
        self,
        query: str,
        candidates: list[Candidate],
        *,
        model_name: str | None,
        top_k: int | None,
        provider: str | None,
        genai: Mapping[str, AttributeValue] | None = None,
        precision: str | None = None,
    ) -> AbstractContextManager[RerankerSpan]:
        """The call's span, current while the block runs; an exception escaping the block is
        recorded and sets ERROR. Under suppression, a span whose every method is a no-op.

        `genai`: OpenTelemetry's GenAI names to set at start beside the identity (given only
        when `genai` is on); an exception escaping the block then also sets ``error.type``."""
        return _Started(self, query, candidates, model_name, top_k, provider, genai, precision)


class _Started:
    """What `RerankerSpans.start` returns: ``start_as_current_span`` for one RERANKER span.

    On entering: the span is started with its identity (unless tracing is suppressed) and made
    current, then OpenInference's context attributes that fit are added. On leaving, however
    the block ends: detach, record an escaping `Exception` with its ERROR status, end; the
    exception goes on. A class rather than a ``@contextmanager`` generator, which cost as much
    as the rest of a sampled-out call's span (issue 26).
    """

    __slots__ = (
        "_candidates",
        "_genai",
        "_model_name",
        "_precision",
        "_provider",
        "_query",
        "_span",
        "_token",
        "_top_k",
        "_writer",
    )

    def __init__(
        self,
        writer: RerankerSpans,
        query: str,
        candidates: list[Candidate],
        model_name: str | None,
        top_k: int | None,
        provider: str | None,
        genai: Mapping[str, AttributeValue] | None,
        precision: str | None = None,
    ) -> None:
        self._writer = writer
        self._precision = precision
        self._query = query
        self._candidates = candidates
        self._model_name = model_name
        self._top_k = top_k
        self._provider = provider
        self._genai = genai
        self._span: Span | None = None
        self._token: object = None

    def __enter__(self) -> RerankerSpan:
        writer = self._writer
        if tracing_suppressed():
            return RerankerSpan(writer, INVALID_SPAN, self._candidates)
        attributes = identity_attributes(
            query=self._query,
            model_name=self._model_name,
            top_k=self._top_k,
            provider=self._provider,
            documents=len(self._candidates),
            config=writer.trace_config,
            max_bytes=writer.max_content_length,
            precision=self._precision,
        )
        if self._genai is not None:
            attributes.update(self._genai)
        span = writer._tracer.start_span(
            "rerank",
            attributes=attributes,
            record_exception=True,
            set_status_on_exception=True,
        )
        self._span = span
        try:
            self._token = context.attach(trace.set_span_in_context(span))
        except BaseException as exc:
            self._leave(exc, attached=False)
            raise
        try:
            if span.is_recording():
                extra = context_attributes()
                if extra:
                    span.set_attributes(fit_head(span, extra))
        except BaseException as exc:
            self._leave(exc, attached=True)
            raise
        return RerankerSpan(writer, span, self._candidates)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._span is not None:  # None: suppressed, no span
            self._leave(exc, attached=True)

    def _leave(self, exc: BaseException | None, *, attached: bool) -> None:
        span = self._span
        assert span is not None
        try:
            if attached:
                context.detach(self._token)  # type: ignore[arg-type]
            if isinstance(exc, Exception) and span.is_recording():
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                if self._genai is not None:
                    span.set_attribute(ATTR_ERROR_TYPE, error_type(exc))
            elif exc is None:
                mark_ok(span)  # a fallback or a cancellation has already set ERROR
        finally:
            span.end()


class RerankerSpan:
    """One call's RERANKER span; its outcome is written once, by one of the four methods."""

    def __init__(self, writer: RerankerSpans, span: Span, candidates: list[Candidate]) -> None:
        self._writer = writer
        self.span = span
        self._candidates = candidates

    @property
    def is_recording(self) -> bool:
        return self.span.is_recording()

    def succeeded(
        self,
        outputs: list[Reranked],
        *,
        model: str | None,
        top1_changed: bool,
        requests: int,
        retries: int,
        batches: int,
        usage: Usage,
        extra: Mapping[str, AttributeValue] | None = None,
    ) -> None:
        """The reranker answered: its outputs with their scores."""
        if not self.span.is_recording():
            return
        stats: dict[str, Any] = {
            ATTR_FALLBACK: False,
            ATTR_TOP1_CHANGED: top1_changed,
            ATTR_REQUESTS: requests,
            ATTR_RETRIES: retries,
            ATTR_BATCHES: batches,
        }
        stats.update(_usage_attributes(usage))
        if extra:
            stats.update(extra)
        self._finish(outputs, stats, model, fell_back=False)

    def fell_back(self, exc: BaseException, outputs: list[Reranked], *, model: str | None) -> str:
        """The reranker failed and `outputs` are in recall order: ERROR with the cause, and no
        output documents (the reranker produced none, and recall scores under the reranker's
        "score" label would pass them off as rerank scores). Returns the status description."""
        cause = fallback_description(exc, self._writer.max_content_length)
        self.span.record_exception(exc)
        self.span.set_status(Status(StatusCode.ERROR, cause))
        if self.span.is_recording():
            stats = _failure_stats(exc, genai=self._writer.genai)
            stats.update({ATTR_FALLBACK: True, ATTR_TOP1_CHANGED: False})
            self._finish(outputs, stats, model, fell_back=True)
        return cause

    def raised(self, exc: BaseException, *, model: str | None) -> None:
        """The reranker failed and the stage re-raises: what it spent, no output (the span's
        context manager records the exception and the ERROR status)."""
        if self.span.is_recording():
            stats = _failure_stats(exc, genai=self._writer.genai)
            stats[ATTR_FALLBACK] = False
            self._finish(None, stats, model, fell_back=False)

    def cancelled(self) -> None:
        """The call was cancelled: `CancelledError` is not an `Exception`, so the span manager
        would end the span as if all went well."""
        self.span.set_status(Status(StatusCode.ERROR, "cancelled"))
        self.span.set_attribute(ATTR_CANCELLED, True)

    def _finish(
        self,
        outputs: list[Reranked] | None,
        stats: dict[str, Any],
        model: str | None,
        *,
        fell_back: bool,
    ) -> None:
        """Outcome attributes, then as many documents as fit, in one call. `outputs` None: the
        call raised, so there is no output. Never raises: telemetry must not turn a good rerank
        into an error."""
        writer = self._writer
        try:
            if model is not None:
                stats[RerankerAttributes.RERANKER_MODEL_NAME] = cap_content(
                    model, writer.max_content_length
                )
            config = writer.trace_config
            if outputs is not None and masks_nothing(config):
                stats[SpanAttributes.OUTPUT_VALUE] = output_value(
                    outputs, fell_back=fell_back, max_bytes=writer.max_content_length
                )
                stats[SpanAttributes.OUTPUT_MIME_TYPE] = _JSON
            elif outputs is not None:
                kept = outputs

                def build() -> str:
                    return output_value(
                        kept, fell_back=fell_back, max_bytes=writer.max_content_length
                    )

                # OpenInference's own `mask` takes a callable and calls it only for a value it
                # keeps (hidden outputs are replaced whole), so a span hiding its outputs does
                # not build a value to drop; a subclass's `mask` gets the value, as always.
                value = config.mask(
                    SpanAttributes.OUTPUT_VALUE, build if type(config) is TraceConfig else build()
                )
                if value is not None:
                    stats[SpanAttributes.OUTPUT_VALUE] = value
                mime_type = config.mask(SpanAttributes.OUTPUT_MIME_TYPE, _JSON)
                if mime_type is not None:
                    stats[SpanAttributes.OUTPUT_MIME_TYPE] = mime_type
            head, documents = outcome_plan(
                self.span,
                stats,
                self._candidates,
                () if outputs is None or fell_back else outputs,
                config=config,
                max_content_length=writer.max_content_length,
                output_content=writer.output_content,
            )
            # The documents stay a record until the span is read (`deferred`), or are written
            # after the outcome; either way they are plain by construction (`fit`).
            write_outcome(
                self.span,
                head,
                documents,
                vouched=plain_attributes(stats),
                deferring=writer.defer_documents,
            )
        except Exception as exc:  # pragma: no cover - defensive; see test_stage
            log.warning("rerank.span_attributes_failed", caused_by=type(exc).__name__)


def _failure_stats(exc: BaseException, *, genai: bool) -> dict[str, Any]:
    return {
        ATTR_ERROR_TYPE: error_type(exc) if genai else type(exc).__name__,
        ATTR_REQUESTS: getattr(exc, "requests", 0),
        ATTR_RETRIES: getattr(exc, "retries", 0),
        ATTR_BATCHES: getattr(exc, "batches", 0),
    }


def _usage_attributes(usage: Usage) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if usage.total_tokens is not None:
        out[ATTR_USAGE_TOTAL_TOKENS] = usage.total_tokens
    if usage.search_units is not None:
        out[ATTR_USAGE_SEARCH_UNITS] = usage.search_units
    return out
