"""The ASGI application: ``POST /rerank``, ``GET /info``, ``GET /health``, TEI-compatible.

`create_app` builds a Starlette app that any ASGI server can run (``retrieval-stage serve``
runs it on uvicorn). The model loads in the background once the app starts, so ``/health``
answers 503 until it is ready, as TEI's does. The ASGI instrumentation makes one SERVER span
per request, continuing the caller's ``traceparent``/``tracestate``/``baggage``; the batcher's
model batches become child spans of it (`retrieval_stage.server.telemetry`). The app never
sets a global tracer or meter provider: pass the ones to use, or the globals are asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

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
from .batcher import Batch, Batcher
from .scorers import Group, Scorer, make_scorer, set_threads
from .settings import ServerSettings
from .telemetry import ATTR_MODEL, ServerInstruments, record_batch_spans
from .wire import ApiError, RerankJob, parse_rerank_body, render_scores, unhealthy

__all__ = ["ROUTES", "create_app"]

ROUTES = ("/rerank", "/info", "/health")
"""The paths served; a span is named after one of these, or only by its method."""

ATTR_SHAPE = "retrieval_stage.shape"
ATTR_DOCUMENTS = "retrieval_stage.documents"
ATTR_TOKENS = "retrieval_stage.server.tokens"
ATTR_BATCHES = "retrieval_stage.server.batches"

_log = get_logger("retrieval_stage.server")


def _span_details(scope: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``POST /rerank`` for the served routes, the bare method for anything else (a scanner's
    random paths must not become span names)."""
    method = str(scope.get("method", "HTTP"))
    path = str(scope.get("path", ""))
    if path in ROUTES:
        return f"{method} {path}", {"http.route": path}
    return method, {}


@dataclass
class _State:
    """What the routes share: settings, the model, the batcher, and whether it is ready."""

    settings: ServerSettings
    scorer: Scorer
    tracer: trace.Tracer
    meter_provider: metrics.MeterProvider | None
    on_load_failure: Callable[[BaseException], None] | None
    ready: bool = False
    load_error: BaseException | None = None
    batcher: Batcher | None = None
    instruments: ServerInstruments | None = None
    model_thread: ThreadPoolExecutor | None = None
    count_thread: ThreadPoolExecutor | None = None
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    def on_batch(self, batch: Batch) -> None:
        record_batch_spans(self.tracer, batch, self.scorer.model_id, self.scorer.kind)
        if self.instruments is not None:
            self.instruments.batch(batch, self.scorer.model_id)
        _log.debug(
            "server.batch",
            number=batch.number,
            requests=len(batch.shares),
            pairs=batch.pairs,
            tokens=batch.tokens,
            duration_ms=round((batch.ended - batch.started) * 1000, 2),
            error=type(batch.error).__name__ if batch.error else None,
        )


def _error(exc: ApiError) -> Response:
    return Response(exc.body(), status_code=exc.status, media_type="application/json")


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, or TEI's 413 once it passes `limit` bytes (read no further)."""
    too_large = ApiError(
        "PayloadTooLarge", f"the request body is larger than the {limit}-byte limit"
    )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
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
    chosen = scorer or make_scorer(
        settings.reranker,
        settings.model,
        batch_size=settings.model_batch_size,
        cache_size=settings.embedding_cache,
        threads=settings.model_threads,
    )
    state = _State(
        settings=settings,
        scorer=chosen,
        tracer=trace.get_tracer("retrieval_stage.server", __version__, tracer_provider),
        meter_provider=meter_provider,
        on_load_failure=on_load_failure,
    )

    async def load() -> None:
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        try:
            if state.scorer.kind != "lexical":
                await loop.run_in_executor(state.model_thread, set_threads, settings.model_threads)
            await loop.run_in_executor(state.model_thread, state.scorer.load)
        except Exception as exc:  # any loader error: said once, and the app stays unhealthy
            state.load_error = exc
            _log.warning(
                "server.load_failed",
                model=state.scorer.model_id,
                error=f"{type(exc).__name__}: {exc}"[:500],
            )
            if state.on_load_failure is not None:
                state.on_load_failure(exc)
            return
        state.ready = True
        _log.info(
            "server.ready",
            reranker=state.scorer.kind,
            model=state.scorer.model_id,
            load_s=round(time.monotonic() - started, 2),
            max_client_batch_size=settings.max_client_batch_size,
        )

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        state.model_thread = ThreadPoolExecutor(1, thread_name_prefix="rerank-model")
        state.count_thread = ThreadPoolExecutor(1, thread_name_prefix="rerank-tokens")
        state.batcher = Batcher(
            state.scorer,
            state.model_thread,
            max_batch_pairs=settings.max_batch_pairs,
            max_batch_tokens=settings.max_batch_tokens,
            max_queue=settings.max_queue,
            batch_wait=settings.batch_wait_ms / 1000,
            on_batch=state.on_batch,
        )
        state.instruments = ServerInstruments(
            meter_provider, lambda: state.batcher.depth if state.batcher else 0
        )
        state.batcher.start()
        task = asyncio.get_running_loop().create_task(load(), name="rerank-model-load")
        state.tasks.add(task)
        task.add_done_callback(state.tasks.discard)
        try:
            yield
        finally:
            task.cancel()
            await state.batcher.stop()
            state.model_thread.shutdown(wait=True, cancel_futures=True)
            state.count_thread.shutdown(wait=True, cancel_futures=True)
            state.ready = False
            _log.info("server.stopped")

    async def rerank(request: Request) -> Response:
        started = time.monotonic()
        span = trace.get_current_span()
        context = otel_context.get_current()
        shape, texts, tokens_total, batches, queue_wait = "unknown", 0, 0, 0, 0.0
        status, error_type = 200, None
        try:
            if not state.ready or state.batcher is None:
                raise unhealthy()
            media = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if media != "application/json":
                raise ApiError(
                    "UnsupportedMediaType",
                    "Expected request with `Content-Type: application/json`",
                )
            raw = await _read_body(request, settings.payload_limit)
            job = parse_rerank_body(raw, max_client_batch_size=settings.max_client_batch_size)
            shape, texts = job.shape, len(job.texts)
            loop = asyncio.get_running_loop()
            query_tokens, counted = await loop.run_in_executor(
                state.count_thread, state.scorer.count, job.query, job.texts
            )
            limit = state.scorer.max_input_length
            tokens = _effective(job, counted, limit, auto_truncate=True)
            ticket = state.batcher.submit(
                Group(job.query, job.texts, job.raw_scores),
                tokens,
                min(query_tokens, limit),
                context,
            )
            scores = await ticket.future
            batches, queue_wait = ticket.batches, ticket.queue_wait
            body = render_scores(job, scores)
            tokens_total = sum(tokens) + (query_tokens if state.scorer.kind == "embedding" else 0)
            total = time.monotonic() - started
            inference = max(total - queue_wait, 0.0)
            chars = len(job.query) * len(job.texts) + sum(len(t) for t in job.texts)
            headers = {
                "x-compute-type": "cpu",
                "x-compute-characters": str(chars),
                "x-compute-tokens": str(tokens_total),
                "x-total-time": str(int(total * 1000)),
                "x-queue-time": str(int(queue_wait * 1000)),
                "x-inference-time": str(int(inference * 1000)),
                "x-model-id": state.scorer.model_id,
            }
            return Response(body, media_type="application/json", headers=headers)
        except ApiError as exc:
            status, error_type = exc.status, exc.kind
            return _error(exc)
        except ClientDisconnect:
            status, error_type = 499, "ClientDisconnect"
            return Response(status_code=400)
        finally:
            duration = time.monotonic() - started
            if span.is_recording():
                span.set_attribute(ATTR_SHAPE, shape)
                span.set_attribute(ATTR_DOCUMENTS, texts)
                span.set_attribute(ATTR_MODEL, state.scorer.model_id)
                span.set_attribute(ATTR_TOKENS, tokens_total)
                span.set_attribute(ATTR_BATCHES, batches)
                if error_type is not None:
                    span.set_attribute("error.type", error_type)
            if state.instruments is not None:
                state.instruments.request(duration, status=status, shape=shape)
            _log.info(
                "server.request",
                status=status,
                shape=shape,
                texts=texts,
                tokens=tokens_total,
                batches=batches,
                queue_wait_ms=round(queue_wait * 1000, 2),
                duration_ms=round(duration * 1000, 2),
                error_type=error_type,
            )

    async def info(_request: Request) -> Response:
        import json

        body = {
            "model_id": state.scorer.model_id,
            "model_sha": None,
            "model_dtype": "float32",
            "model_type": {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}},
            "max_concurrent_requests": settings.max_queue,
            "max_input_length": state.scorer.max_input_length,
            "max_batch_tokens": settings.max_batch_tokens,
            "max_batch_requests": settings.max_batch_pairs,
            "max_client_batch_size": settings.max_client_batch_size,
            "auto_truncate": True,
            "tokenization_workers": 1,
            "version": __version__,
            "sha": None,
            "docker_label": None,
            "server": "retrieval-stage",
            "reranker": state.scorer.kind,
            "ready": state.ready,
            "queue_depth": state.batcher.depth if state.batcher is not None else 0,
        }
        return Response(json.dumps(body).encode(), media_type="application/json")

    async def health(_request: Request) -> Response:
        if not state.ready:
            return _error(unhealthy())
        return Response(b"", status_code=200)

    async def http_error(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kinds = {404: "NotFound", 405: "MethodNotAllowed"}
        kind = kinds.get(exc.status_code, "Validation")
        return _error(ApiError(kind, str(exc.detail), status=exc.status_code))

    app = Starlette(
        routes=[
            Route("/rerank", rerank, methods=["POST"]),
            Route("/info", info, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ],
        middleware=[
            Middleware(
                OpenTelemetryMiddleware,
                tracer_provider=tracer_provider,
                meter_provider=meter_provider,
                default_span_details=_span_details,
                excluded_urls="/health",
                exclude_spans=["receive", "send"],
            )
        ],
        exception_handlers={HTTPException: http_error},
        lifespan=lifespan,
    )
    app.state.server = state
    return app
