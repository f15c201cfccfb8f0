"""``retrieval-stage serve``: the TEI-compatible rerank server for the in-process models.

Needs the ``[server]`` extra (uvicorn, Starlette, the ASGI instrumentation) and, for the
embedding model, ``[local]`` (no torch); a cross-encoder needs ``[torch]``. Defaults are TEI's
where TEI has the knob, so a TEI client pointed here works unchanged;
``--max-client-batch-size`` is refused with TEI's wording, so ours learns it.
"""

from __future__ import annotations

import enum
import sys
from importlib.util import find_spec
from typing import Annotated

import typer
from rich.text import Text

from .._install import install_hint
from ..errors import RerankError
from .console import EXIT_FAILURE, EXIT_USAGE, err, fail
from .options import Precision

__all__ = ["SERVER_INSTALL_HINT", "ServeReranker", "missing_server_module", "serve"]

SERVER_INSTALL_HINT = install_hint("server,local")
"""How to get the server's extras, as a command that works from the clone."""
_SERVER_MODULES = ("starlette", "uvicorn", "opentelemetry.instrumentation.asgi")


def missing_server_module(exc: ImportError) -> str:
    """The module of the ``[server]`` extra that is missing: the error's own name, else its
    cause's (the server package re-raises without one), else the first that cannot be found."""
    for error in (exc, exc.__cause__):
        name = getattr(error, "name", None)
        if isinstance(name, str) and name:
            return name
    for module in _SERVER_MODULES:
        try:
            if find_spec(module) is None:
                return module
        except ModuleNotFoundError:  # a parent package is missing
            return module.split(".", 1)[0]
    return "a module it imports"


def _check_model(reranker: str, model: str | None) -> None:
    """Refuse, before the port is bound, a model that is in no directory, model package or
    cache and cannot be downloaded: `ModelUnavailableError` says what was looked for."""
    if reranker == "lexical":
        return
    from ..local import DEFAULT_EMBEDDING_MODEL, DEFAULT_LOCAL_MODEL
    from ..local.model_source import resolve_model

    default = DEFAULT_EMBEDDING_MODEL if reranker == "embedding" else DEFAULT_LOCAL_MODEL
    resolve_model(model, default=default)


def _listening(url: str) -> None:
    err().print(Text("listening on ", style="bold") + Text(url), soft_wrap=True)


class ServeReranker(str, enum.Enum):
    """What the server runs."""

    embedding = "embedding"
    local = "local"
    lexical = "lexical"


def serve(
    host: Annotated[
        str | None,
        typer.Option(
            "--host",
            help="Address to bind. Default 127.0.0.1: only this machine. Any other address "
            "opens an unauthenticated server to the network, so it must be given here.",
            show_default=False,
        ),
    ] = None,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to bind.")] = 8080,
    reranker: Annotated[
        ServeReranker,
        typer.Option(
            "--reranker",
            help="embedding: the packaged all-MiniLM-L6-v2 (or --model), cosine of "
            "embeddings; local: a cross-encoder; lexical: no model (a bag-of-words heuristic).",
        ),
    ] = ServeReranker.embedding,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="A model directory or hub id (offline: one on disk). Default: the packaged "
            "MiniLM for embedding, cross-encoder/ms-marco-MiniLM-L-6-v2 for local.",
            show_default=False,
        ),
    ] = None,
    max_client_batch_size: Annotated[
        int,
        typer.Option(
            "--max-client-batch-size",
            min=1,
            help="Texts one request may hold (TEI's is 32; 128 serves a 50-100-candidate "
            "request in one call, for clients that cannot split).",
        ),
    ] = 128,
    max_batch_tokens: Annotated[
        int, typer.Option("--max-batch-tokens", min=1, help="Tokens in one model batch.")
    ] = 16384,
    max_batch_pairs: Annotated[
        int,
        typer.Option("--max-batch-pairs", min=1, help="(query, text) pairs in one model batch."),
    ] = 256,
    max_request_tokens: Annotated[
        int,
        typer.Option(
            "--max-request-tokens",
            min=1,
            help="Tokens one request may cost the model (its texts and query; lexical: words); "
            "more are refused with 422, so no request holds the model for long.",
        ),
    ] = 131_072,
    max_queue: Annotated[
        int,
        typer.Option(
            "--max-queue", min=1, help="Requests that may wait; one more is refused with 429."
        ),
    ] = 512,
    batch_wait_ms: Annotated[
        float,
        typer.Option(
            "--batch-wait-ms",
            min=0.0,
            max=1000.0,
            help="How long an idle model waits for more requests to share its batch.",
        ),
    ] = 2.0,
    payload_limit: Annotated[
        int,
        typer.Option("--payload-limit", min=1, help="Largest request body, in bytes (TEI's)."),
    ] = 2_000_000,
    precision: Annotated[
        Precision,
        typer.Option(
            "--precision",
            help="The embedding model's precision: fp32 (numpy), int8 (onnxruntime, the [int8] "
            "extra, a CPU with VNNI) or bf16 (OpenVINO, the [bf16] extra, AVX512_BF16). "
            "Where it cannot run, fp32 runs, a line says why, and /info's model_dtype says "
            "what runs.",
            case_sensitive=False,
        ),
    ] = Precision.fp32,
    model_threads: Annotated[
        int | None,
        typer.Option(
            "--model-threads",
            min=1,
            help="torch threads (default: one per core); the numpy embedding backend's threads, "
            "each embedding a batch of texts (default: one per core, up to 8). On a machine busy "
            "with other work, 1 can be faster.",
            show_default=False,
        ),
    ] = None,
    header_timeout: Annotated[
        float,
        typer.Option(
            "--header-timeout",
            min=0.1,
            help="Seconds a connection may take to send its request head (after connecting "
            "or after its last response); then it is closed.",
        ),
    ] = 10.0,
    body_timeout: Annotated[
        float,
        typer.Option(
            "--body-timeout",
            min=0.1,
            help="Seconds a request body may take to arrive after its head; then 408 and the "
            "connection is closed.",
        ),
    ] = 30.0,
    max_connections: Annotated[
        int | None,
        typer.Option(
            "--max-connections",
            min=1,
            help="Connections open at once (default: the open-file limit less a reserve); at "
            "the cap the longest-idle one is closed for a newcomer.",
            show_default=False,
        ),
    ] = None,
    drain_timeout: Annotated[
        int,
        typer.Option(
            "--drain-timeout",
            min=1,
            help="Seconds SIGTERM or Ctrl-C waits for the requests in flight; those still "
            "unanswered then get TEI's 503.",
        ),
    ] = 30,
    project: Annotated[
        str | None,
        typer.Option(
            "--project",
            envvar="RETRIEVAL_STAGE_PROJECT",
            help="Phoenix project for the server's spans (default: the command's, "
            "retrieval-stage, so one trace stays in one project).",
            show_default=False,
        ),
    ] = None,
    trace_content: Annotated[
        bool,
        typer.Option(
            "--trace-content",
            help="Put the query and the texts on the RERANKER span the server writes for "
            "callers without one (curl, TEI clients); off: input positions and scores only.",
        ),
    ] = False,
    log_level: Annotated[
        str,
        typer.Option(
            "--log-level",
            help="Level of the log lines on stderr: JSON, or for people on a terminal.",
        ),
    ] = "INFO",
) -> None:
    """Serve a reranker over HTTP: TEI's POST /rerank (and the sidecar's), Cohere's POST
    /v2/rerank, Jina's POST /v1/rerank, GET /info and /health.

    Requests from many clients share model batches; spans continue the caller's trace and go
    to OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set. SIGTERM or Ctrl-C drains and stops.
    Exit 2: bad usage, a --model that is nowhere, the port taken; 1: the model failed to load.
    """
    try:
        from ..server import ServerSettings
        from ..server.run import BindError, NotLoopbackError
        from ..server.run import serve as run
    except ImportError as exc:
        fail(
            EXIT_USAGE,
            f"serve needs the [server] extra ({missing_server_module(exc)} is missing)",
            SERVER_INSTALL_HINT,
        )
    try:
        settings = ServerSettings(
            reranker=reranker.value,
            model=model,
            max_client_batch_size=max_client_batch_size,
            max_batch_tokens=max_batch_tokens,
            max_batch_pairs=max_batch_pairs,
            max_request_tokens=max_request_tokens,
            max_queue=max_queue,
            batch_wait_ms=batch_wait_ms,
            payload_limit=payload_limit,
            body_timeout=body_timeout,
            model_threads=model_threads,
            trace_content=trace_content,
            precision=precision.value,
        )
        from ..server.scorers import make_scorer

        make_scorer(settings.reranker, settings.model)  # refuses a bad model before binding
        _check_model(settings.reranker, settings.model)
    except (ValueError, ImportError) as exc:
        fail(EXIT_USAGE, str(exc))
    except RerankError as exc:  # the model is nowhere to be loaded from
        if model is not None:
            fail(EXIT_USAGE, f"--model: {exc}")
        from .._install import model_install_hint

        packaged = reranker is ServeReranker.embedding
        fail(EXIT_USAGE, str(exc), *([f"{model_install_hint()} brings it"] if packaged else []))
    terminal = sys.stderr.isatty()  # else every line on stderr is JSON, for a log collector
    try:
        code = run(
            settings,
            host=host or "127.0.0.1",
            port=port,
            allow_remote=host is not None,
            project=project,
            log_level=log_level,
            json_logs=not terminal,
            on_listening=_listening if terminal else None,  # else server.starting has the URL
            drain_timeout=drain_timeout,
            header_timeout=header_timeout,
            max_connections=max_connections,
        )
    except NotLoopbackError as exc:
        fail(EXIT_USAGE, str(exc))
    except BindError as exc:
        fail(EXIT_USAGE, str(exc), "pass another --port, or stop the process that holds it")
    if code:
        raise typer.Exit(EXIT_FAILURE)
