"""`RerankStage`: one rerank call wrapped in an OpenInference RERANKER span, with fallback.

The stage checks what any reranker returns (every result must be one of the candidates it was
given, each at most once, with a finite score), degrades to recall order when the reranker
fails, and writes a span a person can open in Phoenix or Tempo to see what moved. The span is
written so that its identity (kind, query, model, top_k) survives any attribute-count limit.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal, NamedTuple

from openinference.instrumentation import TraceConfig
from openinference.semconv.trace import (
    OpenInferenceMimeTypeValues,
    RerankerAttributes,
    SpanAttributes,
)
from opentelemetry import trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import INVALID_SPAN, Span, Status, StatusCode, TracerProvider

from . import validate
from ._log import get_logger
from ._otel_private import tracing_suppressed
from ._version import __version__
from .errors import RerankError, RerankProtocolError
from .metrics import RerankMetrics
from .models import Candidate, Reranked, RerankResponse, Usage, recall_order
from .spans import (
    ATTR_BATCHES,
    ATTR_CANCELLED,
    ATTR_FALLBACK,
    ATTR_REQUESTS,
    ATTR_RETRIES,
    ATTR_TOP1_CHANGED,
    ATTR_USAGE_SEARCH_UNITS,
    ATTR_USAGE_TOTAL_TOKENS,
    DEFAULT_MAX_CONTENT_BYTES,
    cap_content,
    context_attributes,
    fallback_description,
    fit_head,
    identity_attributes,
    outcome_attributes,
    output_content_from_env,
    output_value,
)

__all__ = ["RerankStage"]

log = get_logger("retrieval_stage.stage")

OnError = Literal["fallback", "raise"]

_JSON_MIME = OpenInferenceMimeTypeValues.JSON.value


class Outcome(NamedTuple):
    """What one stage call returned, and why it fell back (None when it did not)."""

    outputs: list[Reranked]
    fallback_cause: str | None


def map_results(
    candidates: Sequence[Candidate],
    results: Sequence[tuple[Any, Any]],
    top_k: int | None = None,
) -> list[tuple[int, float]]:
    """(input position, score) for each result, checked against the candidates given.

    Any reranker's output passes through here: an item that is not one of the candidates (by
    identity), a candidate returned more often than given, a malformed pair, a score that is
    not a finite number, or fewer results than min(top_k, n) (a candidate silently dropped)
    raises `RerankProtocolError`. Sorted best first, ties in input order.
    """
    wanted = len(candidates) if top_k is None else min(top_k, len(candidates))
    if len(results) < wanted:
        raise RerankProtocolError(
            f"reranker returned {len(results)} results for {len(candidates)} candidates; "
            f"expected {wanted}"
        )
    positions: dict[int, list[int]] = {}
    for i, candidate in enumerate(candidates):
        positions.setdefault(id(candidate), []).append(i)
    mapped: list[tuple[int, float]] = []
    for n, pair in enumerate(results):
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise RerankProtocolError(f"reranker result {n} is not an (item, score) pair")
        item, score = pair
        free = positions.get(id(item))
        if not free:
            raise RerankProtocolError(
                f"reranker result {n} is not one of the candidates given, or is returned twice"
            )
        if type(score) is float:  # the common case; the ABC check below is slow
            value = score
        elif isinstance(score, bool) or not isinstance(score, numbers.Real):
            raise RerankProtocolError(f"reranker result {n}: score is a {type(score).__name__}")
        else:
            try:
                value = float(score)
            except OverflowError:
                value = math.inf
        if not math.isfinite(value):
            raise RerankProtocolError(f"reranker result {n}: score is not a finite number")
        mapped.append((free.pop(0), value))
    mapped.sort(key=lambda p: (-p[1], p[0]))
    return mapped


class RerankStage:
    """Rerank candidates with any `Reranker` (or `AsyncReranker`), traced and fail-safe.

    `top_k` keeps the best k (None or 0: all). `min_score` drops reranked outputs scoring below
    it; score scales are model-specific, so set it per model. `on_error="fallback"` returns the
    candidates in recall order when the reranker raises a `RerankError`; ``"raise"`` re-raises.
    `max_content_length` caps each document's content on the span, in UTF-8 bytes (default
    below Tempo's 2048-byte attribute limit). `trace_config` defaults to OpenInference's
    `TraceConfig()`, which reads ``OPENINFERENCE_HIDE_INPUTS``/``OPENINFERENCE_HIDE_OUTPUTS``.

    `output_content=False` (or ``RETRIEVAL_STAGE_OUTPUT_CONTENT=0`` when the keyword is not
    given) records each output document as its id and score only: the input documents already
    carry the text, and the span is about a third smaller and cheaper to export. Phoenix then
    shows the Output card's documents with their ids and scores but without text.

    The span is the current span while the reranker runs (a client's outgoing ``traceparent``
    names it), carries OpenInference's context attributes (`using_session`, `using_user`,
    `using_metadata`, `using_tags`, `using_attributes`), and is not made at all inside
    OpenTelemetry's instrumentation suppression or OpenInference's `suppress_tracing` (the
    rerank still runs). When the stage falls back, the reranker produced no output, so the span
    has no output documents (recall scores are never shown as rerank scores); ``output.value``
    lists the returned ids marked ``"order":"recall"``, ``retrieval_stage.fallback`` is true,
    and the status is ERROR with a description starting ``fell back to recall order: <cause>``.
    """

    def __init__(
        self,
        reranker: Any,
        *,
        top_k: int | None = None,
        model_name: str | None = None,
        on_error: OnError = "fallback",
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        min_score: float | None = None,
        max_content_length: int = DEFAULT_MAX_CONTENT_BYTES,
        trace_config: TraceConfig | None = None,
        output_content: bool | None = None,
    ) -> None:
        if not callable(getattr(reranker, "rerank", None)):
            raise TypeError(f"reranker must have a rerank() method, got {type(reranker).__name__}")
        if on_error not in ("fallback", "raise"):
            raise ValueError(f"on_error must be 'fallback' or 'raise', got {on_error!r}")
        top_k = validate.top_k(top_k)
        if min_score is not None and not math.isfinite(min_score):
            raise ValueError(f"min_score must be a finite number, got {min_score!r}")
        if max_content_length < 16:
            raise ValueError(f"max_content_length must be >= 16 bytes, got {max_content_length}")
        self.reranker = reranker
        self.top_k = top_k or None
        self.model_name = model_name
        self.on_error: OnError = on_error
        self.min_score = min_score
        self.max_content_length = max_content_length
        self.trace_config = trace_config or TraceConfig()
        self.output_content = (
            output_content_from_env() if output_content is None else output_content
        )
        self._tracer = trace.get_tracer(
            "retrieval_stage", __version__, tracer_provider=tracer_provider
        )
        self._metrics = _make_metrics(meter_provider)
        self._is_async = inspect.iscoroutinefunction(reranker.rerank)

    def __repr__(self) -> str:
        return (
            f"RerankStage({self.reranker!r}, top_k={self.top_k}, model_name={self.model_name!r}, "
            f"on_error={self.on_error!r})"
        )

    # -- public API --------------------------------------------------------------------------

    def run(self, query: str, candidates: Sequence[Candidate]) -> list[Reranked]:
        """Rerank `candidates` for `query`; best first. One RERANKER span per call."""
        return self._run(query, candidates).outputs

    async def arun(self, query: str, candidates: Sequence[Candidate]) -> list[Reranked]:
        """Async `run`; a sync reranker runs in a worker thread so the event loop stays free."""
        return (await self._arun(query, candidates)).outputs

    def _run(self, query: str, candidates: Sequence[Candidate]) -> Outcome:
        """`run`, also saying why it fell back (the `Pipeline` puts that on its CHAIN span)."""
        if self._is_async:
            raise TypeError("this stage wraps an async reranker: use `await stage.arun(...)`")
        cands = _checked(query, candidates)
        with self._span(query, cands) as span:
            started = time.perf_counter()
            try:
                response = self._call(query, cands)
            except RerankError as exc:
                return self._failed(span, cands, exc, started)
            return self._succeeded(span, cands, response, started)

    async def _arun(self, query: str, candidates: Sequence[Candidate]) -> Outcome:
        """`arun`, also saying why it fell back."""
        cands = _checked(query, candidates)
        with self._span(query, cands) as span:
            started = time.perf_counter()
            try:
                if self._is_async:
                    response = await self._acall(query, cands)
                else:
                    response = await asyncio.to_thread(self._call, query, cands)
            except RerankError as exc:
                return self._failed(span, cands, exc, started)
            except asyncio.CancelledError:
                # Not an Exception, so the span manager would end the span as if all went well.
                span.set_status(Status(StatusCode.ERROR, "cancelled"))
                span.set_attribute(ATTR_CANCELLED, True)
                raise
            return self._succeeded(span, cands, response, started)

    # -- the call ----------------------------------------------------------------------------

    def _call(self, query: str, cands: list[Candidate]) -> RerankResponse[Candidate]:
        if not cands:
            return RerankResponse(results=[])
        detailed = getattr(self.reranker, "rerank_response", None)
        if callable(detailed):
            result: RerankResponse[Candidate] = detailed(query, cands, text=_text, top_k=self.top_k)
            return result
        reranker = self.reranker  # sync here: checked by `run`
        return RerankResponse(results=reranker.rerank(query, cands, text=_text, top_k=self.top_k))

    async def _acall(self, query: str, cands: list[Candidate]) -> RerankResponse[Candidate]:
        if not cands:
            return RerankResponse(results=[])
        detailed = getattr(self.reranker, "rerank_response", None)
        if callable(detailed):
            result: RerankResponse[Candidate] = await detailed(
                query, cands, text=_text, top_k=self.top_k
            )
            return result
        reranker = self.reranker  # async here: checked by `arun`
        return RerankResponse(
            results=await reranker.rerank(query, cands, text=_text, top_k=self.top_k)
        )

    # -- outcomes ----------------------------------------------------------------------------

    def _succeeded(
        self,
        span: Span,
        cands: list[Candidate],
        response: RerankResponse[Candidate],
        started: float,
    ) -> Outcome:
        try:
            mapped = map_results(cands, response.results, self.top_k)
        except RerankProtocolError as exc:
            exc.requests, exc.retries = response.requests, response.retries
            exc.batches = response.batches
            return self._failed(span, cands, exc, started)
        if self.top_k is not None:
            mapped = mapped[: self.top_k]
        if self.min_score is not None:
            mapped = [(i, s) for i, s in mapped if s >= self.min_score]
        outputs = [Reranked(cands[i], s, i) for i, s in mapped]
        top1_changed = bool(outputs) and outputs[0].input_index != recall_order(cands)[0]
        model = self.model_name or response.model or _attr(self.reranker, "model_name")
        if span.is_recording():
            stats: dict[str, Any] = {
                ATTR_FALLBACK: False,
                ATTR_TOP1_CHANGED: top1_changed,
                ATTR_REQUESTS: response.requests,
                ATTR_RETRIES: response.retries,
                ATTR_BATCHES: response.batches,
            }
            stats.update(_usage_attributes(response.usage))
            self._finish_span(span, cands, outputs, stats, model, fell_back=False)
        self._record(started, cands, response, "ok", top1_changed, model)
        return Outcome(outputs, None)

    def _failed(
        self, span: Span, cands: list[Candidate], exc: RerankError, started: float
    ) -> Outcome:
        """Fall back to recall order, or re-raise (the span manager then records the error).

        The fallback span gets no output documents: the reranker produced none, and recall
        scores under the reranker's "score" label would pass them off as rerank scores.
        """
        model = self.model_name or _attr(self.reranker, "model_name")
        log.warning(
            "rerank.fallback" if self.on_error == "fallback" else "rerank.failed",
            caused_by=type(exc).__name__,
            error=str(exc),
            documents=len(cands),
            provider=_attr(self.reranker, "provider"),
            model=model,
        )
        outcome = "fallback" if self.on_error == "fallback" else "error"
        spent: RerankResponse[Candidate] = RerankResponse(
            results=[], requests=exc.requests, retries=exc.retries, batches=exc.batches
        )
        stats: dict[str, Any] = {
            "error.type": type(exc).__name__,
            ATTR_REQUESTS: exc.requests,
            ATTR_RETRIES: exc.retries,
            ATTR_BATCHES: exc.batches,
        }
        if self.on_error == "raise":
            if span.is_recording():
                stats[ATTR_FALLBACK] = False
                self._finish_span(span, cands, None, stats, model, fell_back=False)
            self._record(started, cands, spent, outcome, None, model)
            raise exc
        cause = fallback_description(exc, self.max_content_length)
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, cause))
        order = recall_order(cands)
        if self.top_k is not None:
            order = order[: self.top_k]
        outputs = [Reranked(cands[i], cands[i].score, i, reranked=False) for i in order]
        if span.is_recording():
            stats.update({ATTR_FALLBACK: True, ATTR_TOP1_CHANGED: False})
            self._finish_span(span, cands, outputs, stats, model, fell_back=True)
        self._record(started, cands, spent, outcome, False, model)
        return Outcome(outputs, cause)

    # -- telemetry ---------------------------------------------------------------------------

    @contextmanager
    def _span(self, query: str, cands: list[Candidate]) -> Iterator[Span]:
        """The RERANKER span, current while the reranker runs; its identity is set first, so
        no limit can evict it, then the context attributes that fit. Under suppression, no span:
        the invalid span, whose every method is a no-op."""
        if tracing_suppressed():
            yield INVALID_SPAN
            return
        attributes = identity_attributes(
            query=query,
            model_name=self.model_name or _attr(self.reranker, "model_name"),
            top_k=self.top_k,
            provider=_attr(self.reranker, "provider"),
            documents=len(cands),
            config=self.trace_config,
            max_bytes=self.max_content_length,
        )
        with self._tracer.start_as_current_span(
            "rerank",
            attributes=attributes,
            record_exception=True,
            set_status_on_exception=True,
        ) as span:
            if span.is_recording():
                extra = context_attributes()
                if extra:
                    span.set_attributes(fit_head(span, extra))
            yield span

    def _finish_span(
        self,
        span: Span,
        cands: list[Candidate],
        outputs: list[Reranked] | None,
        stats: dict[str, Any],
        model: str | None,
        *,
        fell_back: bool,
    ) -> None:
        """Outcome attributes, then as many documents as fit, in one call. `outputs` None: the
        call raised, so there is no output. Never raises: telemetry must not turn a good rerank
        into an error."""
        try:
            if model is not None:
                stats[RerankerAttributes.RERANKER_MODEL_NAME] = cap_content(
                    model, self.max_content_length
                )
            config = self.trace_config
            if outputs is not None:
                value = config.mask(
                    SpanAttributes.OUTPUT_VALUE,
                    output_value(outputs, fell_back=fell_back, max_bytes=self.max_content_length),
                )
                if value is not None:
                    stats[SpanAttributes.OUTPUT_VALUE] = value
                mime_type = config.mask(SpanAttributes.OUTPUT_MIME_TYPE, _JSON_MIME)
                if mime_type is not None:
                    stats[SpanAttributes.OUTPUT_MIME_TYPE] = mime_type
            span.set_attributes(
                outcome_attributes(
                    span,
                    stats,
                    cands,
                    () if outputs is None or fell_back else outputs,
                    config=config,
                    max_content_length=self.max_content_length,
                    output_content=self.output_content,
                )
            )
        except Exception as exc:  # pragma: no cover - defensive; see test_stage
            log.warning("rerank.span_attributes_failed", caused_by=type(exc).__name__)

    def _record(
        self,
        started: float,
        cands: list[Candidate],
        response: RerankResponse[Candidate],
        outcome: str,
        top1_changed: bool | None,
        model: str | None,
    ) -> None:
        self._metrics.record(
            duration_s=time.perf_counter() - started,
            documents=len(cands),
            batches=response.batches,
            requests=response.requests,
            retries=response.retries,
            outcome=outcome,
            fallback=outcome == "fallback",
            top1_changed=top1_changed,
            model=model,
            provider=_attr(self.reranker, "provider"),
        )


def _text(candidate: Candidate) -> str:
    return candidate.text


def _attr(obj: Any, name: str) -> str | None:
    value = getattr(obj, name, None)
    return value if isinstance(value, str) else None


def _usage_attributes(usage: Usage) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if usage.total_tokens is not None:
        out[ATTR_USAGE_TOTAL_TOKENS] = usage.total_tokens
    if usage.search_units is not None:
        out[ATTR_USAGE_SEARCH_UNITS] = usage.search_units
    return out


def _checked(query: str, candidates: Sequence[Candidate]) -> list[Candidate]:
    """Validate the stage's input before anything else happens; nothing is lost on error."""
    if not isinstance(query, str):
        raise TypeError(f"query must be a str, got {type(query).__name__}")
    cands = list(candidates)
    for i, candidate in enumerate(cands):
        if not isinstance(candidate, Candidate):
            raise TypeError(
                f"candidate {i} must be a retrieval_stage.Candidate, got {type(candidate).__name__}"
            )
    return cands


def _make_metrics(meter_provider: MeterProvider | None) -> RerankMetrics:
    return RerankMetrics(meter_provider)
