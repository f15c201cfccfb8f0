"""The ASGI application: ``POST /rerank``, ``GET /info``, ``GET /health``, TEI-compatible (its
``/rerank`` also reads the sidecar's body and Jina's/vLLM's), and ``POST /v2/rerank`` and
``POST /v1/rerank`` in Cohere's and Jina's shapes.

`create_app` builds a Starlette app that any ASGI server can run (``retrieval-stage serve``
runs it on uvicorn). The model loads in the background once the app starts, so ``/health``
answers 503 until it is ready, as TEI's does. Starlette's own pattern: the lifespan yields the
app's state (`Serving`: settings, model, threads, batcher, instruments) and the module-level
endpoints read it from ``request.state``; every failure is answered by `_failure`, in the
route's wire format (TEI's, or the hosted API's: `retrieval_stage.server.cohere`, `.jina`),
with the same status either way. The ASGI instrumentation makes one SERVER span per request,
continuing the caller's ``traceparent``/``tracestate``/``baggage``; the batcher's model
batches become child spans of it, and each request's attributes, metric point and log line
are written in one place (`retrieval_stage.server.telemetry`). A rerank request whose caller has
no RERANKER span of its own makes its request span the rerank's RERANKER span
(`retrieval_stage.server.reranker_span`). The app never sets a global tracer or meter provider:
pass the ones to use, or the globals are asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypedDict

import anyio
from openinference.instrumentation import TraceConfig
from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from .._log import get_logger
from .._version import __version__
from .batcher import Batch, Batcher, ClientGone
from .cohere import COHERE
from .jina import JINA, PLAIN, read_plain
from .reranker_span import request_kind, reranker_outcome
from .scorers import Group, Scorer, make_scorer, set_threads
from .settings import ServerSettings
from .telemetry import (
    OkOnSuccess,
    RequestRecord,
    ServerInstruments,
    record_batch,
    record_request,
    route_not_target,
)
from .wire import (
    Answer,
    ApiError,
    ApiRequest,
    RerankApi,
    RerankJob,
    ServedModel,
    body_too_slow,
    decode_object,
    internal_error,
    read_rerank_body,
    render_scores,
    rerank_shape,
    unhealthy,
)

__all__ = ["APIS", "RERANK_ROUTES", "ROUTES", "create_app"]

APIS: dict[str, RerankApi] = {api.path: api for api in (COHERE, JINA)}
"""The hosted rerank APIs answered beside TEI's ``/rerank``, by path."""

RERANK_ROUTES = ("/rerank", *APIS)
"""The paths that rerank: a ``POST`` to one is a RERANKER span unless its caller has one."""

ROUTES = (*RERANK_ROUTES, "/info", "/health")

_MODEL_DTYPES = {"fp32": "float32", "int8": "int8", "bf16": "bfloat16"}
"""A scorer's `precision` as TEI's ``/info`` names it (``model_dtype``)."""
"""The paths served; a span is named after one of these, or only by its method."""

_log = get_logger("retrieval_stage.server")


def _span_details(scope: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``POST /rerank`` for the served routes, the bare method for anything else (a scanner's
    random paths must not become span names)."""
    method = str(scope.get("method", "HTTP"))
    path = str(scope.get("path", ""))
    if path in ROUTES:
        return f"{method} {path}", {"http.route": path}
    return method, {}


@dataclass(frozen=True)
class _Parts:
    """What `create_app` was given (or chose): the app's lifespan builds its state from it."""

    settings: ServerSettings
    scorer: Scorer
    tracer: trace.Tracer
    meter_provider: metrics.MeterProvider | None
    on_load_failure: Callable[[BaseException], None] | None

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[State]:
        """The app's state while it serves: threads and batcher started, the model loading in
        the background; on the way out, the batcher drained and the threads stopped."""
        serving = Serving(self)
        serving.batcher.start()
        loading = asyncio.get_running_loop().create_task(
            _load(serving, self.on_load_failure), name="rerank-model-load"
        )
        try:
            yield {"server": serving}
        finally:
            loading.cancel()
            await serving.batcher.stop()
            serving.model_thread.shutdown(wait=True, cancel_futures=True)
            serving.count_thread.shutdown(wait=True, cancel_futures=True)
            serving.ready = False
            _log.info("server.stopped")


class Serving:
    """What the endpoints share while the app runs: settings, the model, its two threads (one
    runs the model, one counts tokens), the batcher, the instruments, and whether it is ready."""

    def __init__(self, parts: _Parts) -> None:
        settings = parts.settings
        self.settings = settings
        self.scorer = parts.scorer
        self.ready = False
        self.load_error: BaseException | None = None
        self._tracer = parts.tracer
        self.model_thread = ThreadPoolExecutor(1, thread_name_prefix="rerank-model")
        self.count_thread = ThreadPoolExecutor(1, thread_name_prefix="rerank-tokens")
        self.batcher = Batcher(
            self.scorer,
            self.model_thread,
            max_batch_pairs=settings.max_batch_pairs,
            max_batch_tokens=settings.max_batch_tokens,
            max_queue=settings.max_queue,
            batch_wait=settings.batch_wait_ms / 1000,
            max_request_tokens=settings.max_request_tokens,
            on_batch=self._on_batch,
        )
        self.instruments = ServerInstruments(parts.meter_provider, lambda: self.batcher.depth)
        # OPENINFERENCE_HIDE_INPUTS/_OUTPUTS, read once, for the RERANKER spans it writes.
        self.trace_config = TraceConfig()

    def _on_batch(self, batch: Batch) -> None:
        record_batch(
            self._tracer,
            self.instruments,
            batch,
            self.scorer.model_id,
            self.scorer.kind,
            precision=getattr(self.scorer, "precision", None),
        )


class State(TypedDict):
    """The lifespan's state, as each request sees it (``request.state["server"]``)."""

    server: Serving


async def _load(serving: Serving, on_load_failure: Callable[[BaseException], None] | None) -> None:
    """Load the model on its thread; on success the app is ready, on failure it stays
    unhealthy, says so once, and tells `on_load_failure`."""
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    scorer = serving.scorer
    try:
        if scorer.kind != "lexical":
            await loop.run_in_executor(
                serving.model_thread, set_threads, serving.settings.model_threads
            )
        await loop.run_in_executor(serving.model_thread, scorer.load)
    except Exception as exc:  # any loader error: said once, and the app stays unhealthy
        serving.load_error = exc
        _log.warning(
            "server.load_failed",
            model=scorer.model_id,
            error=f"{type(exc).__name__}: {exc}"[:500],
        )
        if on_load_failure is not None:
            on_load_failure(exc)
        return
    serving.ready = True
    _log.info(
        "server.ready",
        reranker=scorer.kind,
        model=scorer.model_id,
        load_s=round(time.monotonic() - started, 2),
        max_client_batch_size=serving.settings.max_client_batch_size,
    )


# Every failure is answered here, in TEI's wire format, with the status that is logged and
# metered. An unexpected error is answered 500 in that format too, its traceback logged.


def _error(exc: ApiError, api: RerankApi | None = None) -> Response:
    """TEI's ``{"error", "error_type"}`` body, or `api`'s own error body, with the error's
    status (the same status whichever API is spoken)."""
    body = exc.body() if api is None else api.error_body(exc)
    return Response(body, status_code=exc.status, media_type="application/json")


def _failure(exc: Exception, api: RerankApi | None = None) -> tuple[Response, int, str]:
    """The answer to a rerank request that failed with `exc` (in `api`'s shape, TEI's when
    None), and the status and error type recorded for it (a caller that hung up is recorded
    as 499)."""
    if isinstance(exc, ApiError):
        return _error(exc, api), exc.status, exc.kind
    if isinstance(exc, (ClientDisconnect, ClientGone)):
        return Response(status_code=400), 499, "ClientDisconnect"
    kind = type(exc).__name__
    _log.warning(
        "server.unexpected_error",
        error_type=kind,
        traceback="".join(traceback.format_exception(exc)),
    )
    return _error(internal_error(kind), api), 500, kind


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (unknown path, wrong method) in TEI's wire format, or in the
    hosted API's on its path."""
    assert isinstance(exc, HTTPException)
    kinds = {404: "NotFound", 405: "MethodNotAllowed"}
    kind = kinds.get(exc.status_code, "Validation")
    api = APIS.get(request.url.path)
    return _error(ApiError(kind, str(exc.detail), status=exc.status_code), api)


# POST /rerank: parse, hand to the batcher, render.


@dataclass(frozen=True)
class _Scored:
    """A job's scores and what getting them took."""

    scores: list[float]
    tokens: int
    batches: int
    queue_wait: float


async def _body(request: Request[State], serving: Serving) -> bytes:
    """The request's JSON body, or the refusal: not ready, not JSON, too large."""
    if not serving.ready:
        raise unhealthy()
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json":
        raise ApiError(
            "UnsupportedMediaType", "Expected request with `Content-Type: application/json`"
        )
    settings = serving.settings
    return await _read_body(request, settings.payload_limit, settings.body_timeout)


async def _read_body(request: Request[State], limit: int, timeout: float) -> bytes:
    """The request body, or TEI's 413 once it passes `limit` bytes (read no further), or 408
    when it is not all there `timeout` seconds after the head (the connection then closes:
    h11 cannot reuse one whose body was not read to its end)."""
    too_large = ApiError(
        "PayloadTooLarge", f"the request body is larger than the {limit}-byte limit"
    )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    try:
        with anyio.fail_after(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large
                chunks.append(chunk)
    except TimeoutError:
        raise body_too_slow(timeout, size) from None
    return b"".join(chunks)


def _effective(
    job: RerankJob, tokens: list[int], max_length: int, auto_truncate: bool
) -> list[int]:
    """Tokens each text costs as the model reads it; TEI's 422 for one over the model's
    length when the caller asked for no truncation."""
    truncate = auto_truncate if job.truncate is None else job.truncate
    out = []
    for i, n in enumerate(tokens):
        if n > max_length and not truncate:
            field_name = f"texts[{i}]" if job.shape == "tei" else f"documents[{i}].text"
            raise ApiError(
                "Validation",
                f"Input validation error: `inputs` must have less than {max_length} tokens. "
                f"Given: {n} (`{field_name}` with the query; `truncate` is false)",
            )
        out.append(min(n, max_length))
    return out


async def _hung_up(request: Request[State]) -> None:
    """Returns once the client has gone away: after the body, the ASGI receive channel says
    nothing more until ``http.disconnect``."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _score(
    request: Request[State], serving: Serving, job: RerankJob, context: otel_context.Context
) -> _Scored:
    """Count the job's tokens (on the counting thread), hand it to the batcher under the
    request's trace `context`, and wait for its scores; a full queue is refused before any
    thread work, and a client that hangs up takes its work out of the queue."""
    scorer = serving.scorer
    loop = asyncio.get_running_loop()
    with serving.batcher.admission():
        query_tokens, counted = await loop.run_in_executor(
            serving.count_thread, scorer.count, job.query, job.texts
        )
        limit = scorer.max_input_length
        tokens = _effective(job, counted, limit, auto_truncate=True)
        ticket = serving.batcher.submit(
            Group(job.query, job.texts, job.raw_scores), tokens, min(query_tokens, limit), context
        )
    scores = await serving.batcher.wait(ticket, _hung_up(request))
    total = sum(tokens) + (query_tokens if scorer.kind == "embedding" else 0)
    return _Scored(scores, total, ticket.batches, ticket.queue_wait)


def _render(
    serving: Serving, job: RerankJob, scored: _Scored, started: float, body: bytes | None = None
) -> Response:
    """The scores in the job's shape (or `body`, already rendered in a hosted API's), with
    TEI's compute and timing headers."""
    if body is None:
        body = render_scores(job, scored.scores)
    total = time.monotonic() - started
    inference = max(total - scored.queue_wait, 0.0)
    chars = len(job.query) * len(job.texts) + sum(len(t) for t in job.texts)
    headers = {
        "x-compute-type": "cpu",
        "x-compute-characters": str(chars),
        "x-compute-tokens": str(scored.tokens),
        "x-total-time": str(int(total * 1000)),
        "x-queue-time": str(int(scored.queue_wait * 1000)),
        "x-inference-time": str(int(inference * 1000)),
        "x-model-id": serving.scorer.model_id,
    }
    return Response(body, media_type="application/json", headers=headers)


def _reranked(
    span: trace.Span, serving: Serving, job: RerankJob, scored: _Scored, top_n: int | None
) -> None:
    """The answered rerank on the request `span`, when that span is the rerank's RERANKER
    span (`retrieval_stage.server.reranker_span`): the results as answered, cut to `top_n`."""
    reranker_outcome(
        span,
        query=job.query,
        texts=job.texts,
        scores=scored.scores,
        top_n=top_n,
        model=serving.scorer.model_id,
        content=serving.settings.trace_content,
        config=serving.trace_config,
    )


def _served(serving: Serving) -> ServedModel:
    """What a hosted API's request is checked against."""
    return ServedModel(
        serving.scorer.model_id,
        serving.settings.max_client_batch_size,
        serving.scorer.max_input_length,
    )


async def rerank(request: Request[State]) -> Response:
    """``POST /rerank``: TEI's body answered in TEI's shape, the sidecar's in the sidecar's, and
    Jina's/vLLM's (``documents`` as strings, `wire.rerank_shape` tells them apart) as
    ``/v1/rerank`` answers it (`jina.PLAIN`, its errors in that shape too); or the refusal.
    Either way one span, one metric point and one access-log line (`record_request`)."""
    serving = request.state["server"]
    record = RequestRecord(started=time.monotonic())
    span = trace.get_current_span()
    api: RerankApi | None = None  # TEI's error shape until the body is Jina's/vLLM's
    try:
        body = decode_object(await _body(request, serving))
        shape = rerank_shape(body)
        if shape == "jina":
            api = PLAIN
            record.shape = api.shape
            asked = read_plain(body, _served(serving))
            return await _answer(request, serving, record, span, api, asked)
        cap = serving.settings.max_client_batch_size
        job = read_rerank_body(body, shape, max_client_batch_size=cap)
        record.shape, record.texts = job.shape, len(job.texts)
        scored = await _score(request, serving, job, otel_context.get_current())
        response = _render(serving, job, scored, record.started)
        record.tokens, record.batches = scored.tokens, scored.batches
        record.queue_wait = scored.queue_wait
        _reranked(span, serving, job, scored, top_n=None)
        return response
    except Exception as exc:
        response, record.status, record.error_type = _failure(exc, api)
        return response
    finally:
        record_request(span, serving.instruments, record, serving.scorer.model_id)


async def _answer(
    request: Request[State],
    serving: Serving,
    record: RequestRecord,
    span: trace.Span,
    api: RerankApi,
    asked: ApiRequest,
) -> Response:
    """A checked hosted-API request scored and rendered in `api`'s shape, with what it took
    kept in `record` and the answer on the request `span`."""
    record.texts = len(asked.job.texts)
    scored = await _score(request, serving, asked.job, otel_context.get_current())
    body = api.render(Answer(asked, scored.scores, scored.tokens))
    response = _render(serving, asked.job, scored, record.started, body)
    record.tokens, record.batches = scored.tokens, scored.batches
    record.queue_wait = scored.queue_wait
    _reranked(span, serving, asked.job, scored, top_n=asked.top_n)
    return response


def _hosted(api: RerankApi) -> Callable[[Request[State]], Awaitable[Response]]:
    """The endpoint for `api`'s path: ``/rerank``'s steps with `api`'s parsing, rendering and
    error shape, recorded under its shape (known from the path, so a refused body counts too)."""

    async def endpoint(request: Request[State]) -> Response:
        serving = request.state["server"]
        record = RequestRecord(started=time.monotonic(), shape=api.shape)
        span = trace.get_current_span()
        try:
            asked = api.parse(await _body(request, serving), _served(serving))
            return await _answer(request, serving, record, span, api, asked)
        except Exception as exc:
            response, record.status, record.error_type = _failure(exc, api)
            return response
        finally:
            record_request(span, serving.instruments, record, serving.scorer.model_id)

    endpoint.__name__ = endpoint.__qualname__ = f"{api.shape}_rerank"
    endpoint.__doc__ = f"``POST {api.path}``: {api.shape}'s rerank shape (`_hosted`)."
    return endpoint


cohere_rerank = _hosted(COHERE)
jina_rerank = _hosted(JINA)


async def info(request: Request[State]) -> Response:
    """``GET /info``: TEI's fields, and ours (reranker, ready, queue depth)."""
    serving = request.state["server"]
    settings, scorer = serving.settings, serving.scorer
    body = {
        "model_id": scorer.model_id,
        "model_sha": None,
        "model_dtype": _MODEL_DTYPES.get(getattr(scorer, "precision", "fp32"), "float32"),
        "model_type": {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}},
        "max_concurrent_requests": settings.max_queue,
        "max_input_length": scorer.max_input_length,
        "max_batch_tokens": settings.max_batch_tokens,
        "max_batch_requests": settings.max_batch_pairs,
        "max_client_batch_size": settings.max_client_batch_size,
        "auto_truncate": True,
        "tokenization_workers": 1,
        "version": __version__,
        "sha": None,
        "docker_label": None,
        "server": "retrieval-stage",
        "reranker": scorer.kind,
        "ready": serving.ready,
        "queue_depth": serving.batcher.depth,
    }
    return Response(json.dumps(body).encode(), media_type="application/json")


async def health(request: Request[State]) -> Response:
    """``GET /health``: 200 once the model is loaded, TEI's 503 until then (or after a failed
    load)."""
    if not request.state["server"].ready:
        return _error(unhealthy())
    return Response(b"", status_code=200)


def create_app(
    settings: ServerSettings | None = None,
    *,
    scorer: Scorer | None = None,
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    on_load_failure: Callable[[BaseException], None] | None = None,
) -> Starlette:
    """The rerank server as an ASGI app (run it with uvicorn, or any ASGI server).

    `settings` say which model and how to batch (`ServerSettings`); `scorer` replaces the model
    they name. Spans go to `tracer_provider` and metrics to `meter_provider` (None: the
    global ones). The model is loaded when the app starts; if that fails, ``/health`` stays
    503, requests are refused as unhealthy, and `on_load_failure` is called with the error.
    """
    settings = settings or ServerSettings()
    parts = _Parts(
        settings=settings,
        scorer=scorer
        or make_scorer(
            settings.reranker,
            settings.model,
            batch_size=settings.model_batch_size,
            cache_size=settings.embedding_cache,
            threads=settings.model_threads,
            precision=settings.precision,
        ),
        tracer=trace.get_tracer("retrieval_stage.server", __version__, tracer_provider),
        meter_provider=meter_provider,
        on_load_failure=on_load_failure,
    )
    targets = route_not_target(ROUTES)
    model = parts.scorer.model_id

    def request_hook(span: trace.Span, scope: dict[str, Any]) -> None:
        targets(span, scope)
        request_kind(span, scope, RERANK_ROUTES, model)

    return Starlette(
        routes=[
            Route("/rerank", rerank, methods=["POST"]),
            Route(COHERE.path, cohere_rerank, methods=["POST"]),
            Route(JINA.path, jina_rerank, methods=["POST"]),
            Route("/info", info, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ],
        middleware=[
            Middleware(
                OpenTelemetryMiddleware,
                tracer_provider=tracer_provider,
                meter_provider=meter_provider,
                default_span_details=_span_details,
                server_request_hook=request_hook,
                excluded_urls="/health",
                exclude_spans=["receive", "send"],
            ),
            Middleware(OkOnSuccess),
        ],
        exception_handlers={HTTPException: _http_error},
        lifespan=parts.lifespan,
    )
