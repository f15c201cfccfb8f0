"""`RerankStage`: one rerank call wrapped in an OpenInference RERANKER span, with fallback.

The stage checks what any reranker returns (every result must be one of the candidates it was
given, each at most once, with a finite score), degrades to recall order when the reranker
fails, and writes a span a person can open in Phoenix or Tempo to see what moved. The span is
written so that its identity (kind, query, model, top_k) survives any attribute-count limit.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Sequence
from operator import attrgetter, itemgetter
from typing import Any, Literal, NamedTuple

from openinference.instrumentation import TraceConfig
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from . import validate
from ._log import get_logger
from .errors import RerankError, RerankProtocolError
from .metrics import RerankMetrics
from .models import (
    Candidate,
    ClientResponse,
    Reranked,
    RerankResponse,
    recall_order,
    reranked_outputs,
    trusted_indices,
)
from .protocols import acall_reranker, call_reranker, map_results, str_attr
from .quality import RerankQuality, rerank_quality
from .spans.content import DEFAULT_MAX_CONTENT_BYTES, cap_content
from .spans.genai import error_type, server_of, start_attributes
from .spans.keys import ATTR_ERROR_TYPE, ATTR_GEN_AI_RESPONSE_MODEL
from .spans.reranker import RerankerSpan, RerankerSpans, output_content_from_env

__all__ = ["RerankStage", "StageOutcome"]

log = get_logger("retrieval_stage.stage")

OnError = Literal["fallback", "raise"]


class StageOutcome(NamedTuple):
    """What one stage call returned, and why it fell back (None when it did not)."""

    outputs: list[Reranked]
    fallback_cause: str | None


_CANDIDATE = frozenset((Candidate,))
_SCORE = itemgetter(1)


def _indexed(
    candidates: list[Candidate], response: RerankResponse[Candidate]
) -> list[tuple[int, float]] | None:
    """(position, score) straight from an answer's checked indices (`models.trusted_indices`),
    or None: then each result is checked against the candidates (`map_results`). Rebuilding
    positions from identities was the largest piece of the stage's own work around a
    sampled-out call (issue 26)."""
    indices = trusted_indices(candidates, response)
    if indices is None:
        return None
    return list(zip(indices, map(_SCORE, response.results), strict=True))


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

    `genai_conventions=True` (or, when the keyword is not given,
    ``OTEL_SEMCONV_STABILITY_OPT_IN`` listing ``gen_ai_latest_experimental`` when the stage is
    built) adds OpenTelemetry's experimental GenAI names to the same span (``gen_ai.*``,
    ``server.address``/``server.port`` from the reranker's ``base_url``, ``error.type`` on
    failure) and, when metrics are configured, records ``gen_ai.client.operation.duration``
    (`retrieval_stage.spans.genai`, docs/observability.md). OpenInference's names stay as they
    are either way.
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
        genai_conventions: bool | None = None,
    ) -> None:
        if not callable(getattr(reranker, "rerank", None)):
            raise TypeError(f"reranker must have a rerank() method, got {type(reranker).__name__}")
        validate.on_error(on_error)
        top_k = validate.top_k(top_k)
        validate.min_score(min_score)
        validate.max_content_length(max_content_length)
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
        self._spans = RerankerSpans(
            tracer_provider,
            trace_config=self.trace_config,
            max_content_length=max_content_length,
            output_content=self.output_content,
            genai=genai_conventions,
        )
        self.genai_conventions = self._spans.genai
        # The server a client sends to is fixed when it is built: worked out once, here.
        self._server = server_of(str_attr(reranker, "base_url")) if self.genai_conventions else None
        self._metrics = RerankMetrics(meter_provider, genai=self.genai_conventions)
        self._is_async = inspect.iscoroutinefunction(reranker.rerank)

    def __repr__(self) -> str:
        return (
            f"RerankStage({self.reranker!r}, top_k={self.top_k}, model_name={self.model_name!r}, "
            f"on_error={self.on_error!r})"
        )

    # -- public API --------------------------------------------------------------------------

    def run(
        self, query: str, candidates: Sequence[Candidate], *, top_k: int | None = None
    ) -> list[Reranked]:
        """Rerank `candidates` for `query`; best first. One RERANKER span per call.

        `top_k` overrides the stage's for this call (0: all); None keeps the stage's."""
        return self.run_outcome(query, candidates, top_k=top_k).outputs

    async def arun(
        self, query: str, candidates: Sequence[Candidate], *, top_k: int | None = None
    ) -> list[Reranked]:
        """Async `run`; a sync reranker runs in a worker thread so the event loop stays free."""
        return (await self.arun_outcome(query, candidates, top_k=top_k)).outputs

    def run_outcome(
        self, query: str, candidates: Sequence[Candidate], *, top_k: int | None = None
    ) -> StageOutcome:
        """`run`, also saying why it fell back (the `Pipeline` puts that on its CHAIN span)."""
        if self._is_async:
            raise TypeError("this stage wraps an async reranker: use `await stage.arun(...)`")
        cands = _checked(query, candidates)
        k = self._top_k(top_k)
        with self._start(query, cands, k) as span:
            started = time.perf_counter()
            try:
                response = self._call(query, cands, k)
            except RerankError as exc:
                return self._failed(span, cands, exc, started, k)
            except Exception as exc:  # a reranker's own error type (a vendor SDK's)
                if self.on_error == "raise":
                    raise
                return self._failed(span, cands, _untyped(exc), started, k)
            return self._succeeded(span, cands, response, started, k)

    async def arun_outcome(
        self, query: str, candidates: Sequence[Candidate], *, top_k: int | None = None
    ) -> StageOutcome:
        """`arun`, also saying why it fell back."""
        cands = _checked(query, candidates)
        k = self._top_k(top_k)
        with self._start(query, cands, k) as span:
            started = time.perf_counter()
            try:
                if self._is_async:
                    response = await self._acall(query, cands, k)
                else:
                    response = await asyncio.to_thread(self._call, query, cands, k)
            except RerankError as exc:
                return self._failed(span, cands, exc, started, k)
            except asyncio.CancelledError:
                span.cancelled()
                raise
            except Exception as exc:  # a reranker's own error type (a vendor SDK's)
                if self.on_error == "raise":
                    raise
                return self._failed(span, cands, _untyped(exc), started, k)
            return self._succeeded(span, cands, response, started, k)

    # -- the call ----------------------------------------------------------------------------

    def _top_k(self, given: int | None) -> int | None:
        """The call's cut: `given` when set (0: all), else the stage's."""
        if given is None:
            return self.top_k
        return validate.top_k(given) or None

    def _start(self, query: str, cands: list[Candidate], top_k: int | None) -> Any:
        model_name = self.model_name or str_attr(self.reranker, "model_name")
        provider = str_attr(self.reranker, "provider")
        return self._spans.start(
            query,
            cands,
            model_name=model_name,
            top_k=top_k,
            provider=provider,
            precision=str_attr(self.reranker, "precision"),
            genai=start_attributes(
                provider=provider,
                request_model=model_name,
                server=self._server,
                candidates=len(cands),
                top_n=top_k,
            )
            if self.genai_conventions
            else None,
        )

    def _call(
        self, query: str, cands: list[Candidate], top_k: int | None
    ) -> RerankResponse[Candidate]:
        if not cands:
            return RerankResponse(results=[])
        # Sync here: checked by `run`.
        return call_reranker(self.reranker, query, cands, text=_text, top_k=top_k)

    async def _acall(
        self, query: str, cands: list[Candidate], top_k: int | None
    ) -> RerankResponse[Candidate]:
        if not cands:
            return RerankResponse(results=[])
        # Async here: checked by `arun`.
        return await acall_reranker(self.reranker, query, cands, text=_text, top_k=top_k)

    # -- outcomes ----------------------------------------------------------------------------

    def _succeeded(
        self,
        span: RerankerSpan,
        cands: list[Candidate],
        response: RerankResponse[Candidate],
        started: float,
        top_k: int | None,
    ) -> StageOutcome:
        mapped = _indexed(cands, response)
        if mapped is None:
            try:
                mapped = map_results(cands, response.results, top_k)
            except RerankProtocolError as exc:
                exc.requests, exc.retries = response.requests, response.retries
                exc.batches = response.batches
                return self._failed(span, cands, exc, started, top_k)
        scored = mapped  # everything the reranker scored: what the quality signals compare
        if top_k is not None:
            mapped = mapped[:top_k]
        if self.min_score is not None:
            mapped = [(i, s) for i, s in mapped if s >= self.min_score]
        outputs = reranked_outputs(cands, mapped)
        metered = self._metrics.enabled
        # Sampled out, no metrics: nothing reads what follows.
        if not (span.is_recording or metered):
            return StageOutcome(outputs, None)
        recall = recall_order(cands)
        top1_changed = bool(outputs) and outputs[0].input_index != recall[0]
        model = self.model_name or response.model or str_attr(self.reranker, "model_name")
        quality = self._quality(cands, scored, recall, top_k)
        extra = None if quality is None else quality.attributes()
        if self.genai_conventions:
            extra = self._response_model(response, extra)
        span.succeeded(
            outputs,
            model=model,
            top1_changed=top1_changed,
            requests=response.requests,
            retries=response.retries,
            batches=response.batches,
            usage=response.usage,
            extra=extra,
        )
        self._record(started, cands, response, "ok", top1_changed, model)
        if metered and quality is not None:
            self._metrics.record_quality(
                quality,
                model=self.model_name or str_attr(self.reranker, "model_name"),
                provider=str_attr(self.reranker, "provider"),
            )
        return StageOutcome(outputs, None)

    def _response_model(
        self, response: RerankResponse[Candidate], extra: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        """`extra` with ``gen_ai.response.model`` when the answer says which model answered:
        a client's when the server's body named one (`ClientResponse.served_model`, never the
        configured model), any other reranker's own `model`."""
        served = response.served_model if isinstance(response, ClientResponse) else response.model
        if served is None:
            return extra
        out = {} if extra is None else dict(extra)
        out[ATTR_GEN_AI_RESPONSE_MODEL] = cap_content(served, self.max_content_length)
        return out

    def _quality(
        self,
        cands: list[Candidate],
        scored: list[tuple[int, float]],
        recall: list[int],
        top_k: int | None,
    ) -> RerankQuality | None:
        """The call's label-free quality signals (`retrieval_stage.quality`), or None if
        computing them failed: telemetry must not turn a good rerank into an error."""
        try:
            return rerank_quality(cands, scored, top_k, recall=recall)
        except Exception as exc:  # pragma: no cover - defensive; the inputs are checked
            log.warning("rerank.quality_failed", caused_by=type(exc).__name__)
            return None

    def _failed(
        self,
        span: RerankerSpan,
        cands: list[Candidate],
        exc: RerankError,
        started: float,
        top_k: int | None,
    ) -> StageOutcome:
        """Fall back to recall order, or re-raise (the span manager then records the error)."""
        model = self.model_name or str_attr(self.reranker, "model_name")
        log.warning(
            "rerank.fallback" if self.on_error == "fallback" else "rerank.failed",
            caused_by=type(exc).__name__,
            error=str(exc),
            documents=len(cands),
            provider=str_attr(self.reranker, "provider"),
            model=model,
        )
        spent: RerankResponse[Candidate] = RerankResponse(
            results=[], requests=exc.requests, retries=exc.retries, batches=exc.batches
        )
        if self.on_error == "raise":
            span.raised(exc, model=model)
            self._record(started, cands, spent, "error", None, model, exc)
            raise exc
        order = recall_order(cands)
        if top_k is not None:
            order = order[:top_k]
        outputs = [Reranked(cands[i], cands[i].score, i, reranked=False) for i in order]
        cause = span.fell_back(exc, outputs, model=model)
        self._record(started, cands, spent, "fallback", False, model, exc)
        return StageOutcome(outputs, cause)

    def _record(
        self,
        started: float,
        cands: list[Candidate],
        response: RerankResponse[Candidate],
        outcome: str,
        top1_changed: bool | None,
        model: str | None,
        exc: RerankError | None = None,
    ) -> None:
        # Points given to the API's placeholder instruments (no MeterProvider set) or to a
        # no-op one reach nothing: skip building them. `enabled` is asked per call, so a
        # provider installed later is used from its first call on.
        if not self._metrics.enabled:
            return
        duration_s = time.perf_counter() - started
        provider = str_attr(self.reranker, "provider")
        metric_model = self._metric_model()
        self._metrics.record(
            duration_s=duration_s,
            documents=len(cands),
            batches=response.batches,
            requests=response.requests,
            retries=response.retries,
            outcome=outcome,
            fallback=outcome == "fallback",
            top1_changed=top1_changed,
            model=metric_model,
            provider=provider,
        )
        if self.genai_conventions:
            attributes = start_attributes(
                provider=provider, request_model=metric_model, server=self._server
            )
            if exc is not None:
                attributes[ATTR_ERROR_TYPE] = error_type(exc)
            self._metrics.record_operation_duration(duration_s, attributes)

    def _metric_model(self) -> str | None:
        """The model label of metric points: from configuration (the stage's `model_name`, an
        HTTP client's configured model, a local model's name), never a server's string, whose
        every new value would be a new series."""
        if self.model_name:
            return self.model_name
        if hasattr(self.reranker, "configured_model"):
            return str_attr(self.reranker, "configured_model")
        return str_attr(self.reranker, "model_name")


_text = attrgetter("text")
"""A candidate's text, for the reranker's ``text=``: at C speed (a `Candidate`'s text is a str,
checked when it was made)."""


def _checked(query: str, candidates: Sequence[Candidate]) -> list[Candidate]:
    """Validate the stage's input before anything else happens; nothing is lost on error."""
    if not isinstance(query, str):
        raise TypeError(f"query must be a str, got {type(query).__name__}")
    cands = list(candidates)
    if set(map(type, cands)) <= _CANDIDATE:  # the usual case, at C speed
        return cands
    for i, candidate in enumerate(cands):
        if not isinstance(candidate, Candidate):
            raise TypeError(
                f"candidate {i} must be a retrieval_stage.Candidate, got {type(candidate).__name__}"
            )
    return cands


def _untyped(exc: Exception) -> RerankError:
    """A reranker's error of a type of its own, as the `RerankError` the fallback handles: it
    names only the type, and does not chain `exc` (its message and traceback, which the span
    would record, may quote the query or a document)."""
    return RerankError(f"the reranker raised {type(exc).__name__}")
