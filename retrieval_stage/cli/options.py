"""The options the three commands share, declared once, and the values they carry.

`with_rerank_options` adds the reranker, telemetry and logging options to a command's
signature (Typer reads it) and hands the command one `RerankOptions`; each command declares
only its own options.
"""

from __future__ import annotations

import enum
import functools
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from ..client.providers import PROVIDERS
from ..config import LOCAL
from ..telemetry.otlp import DEFAULT_SERVICE_NAME
from .help import HelpCommand, HelpGroup, help_all_parameter

__all__ = [
    "DEFAULT_TELEMETRY_TIMEOUT_S",
    "OPTION_OF_FIELD",
    "Command",
    "Group",
    "OutputFormat",
    "RecallChoice",
    "RerankOptions",
    "RerankerChoice",
    "with_rerank_options",
]


DEFAULT_TELEMETRY_TIMEOUT_S = 0.5
"""How long a command may wait at exit for spans and metrics to leave (--telemetry-timeout).

A collector that answers delivers a command's few spans in milliseconds, even across a network;
the wait matters only when it is down or stuck, where every command pays all of it (plus ~0.1 s
of importing the exporters): 0.5 s keeps that cost under ~1 s. Slow links can raise it."""


class RerankerChoice(str, enum.Enum):
    """Which reranker runs: the endpoint's, or one in this process."""

    auto = "auto"
    endpoint = "endpoint"
    local = "local"
    embedding = "embedding"
    lexical = "lexical"


class RecallChoice(str, enum.Enum):
    """How `demo` and `eval` find candidates: words, embeddings, or both fused."""

    bm25 = "bm25"
    dense = "dense"
    hybrid = "hybrid"


class Precision(str, enum.Enum):
    """The embedding model's precision (`retrieval_stage.local.embedding.PRECISIONS`)."""

    fp32 = "fp32"
    int8 = "int8"
    bf16 = "bf16"


class OutputFormat(str, enum.Enum):
    """How `rerank` prints its results."""

    jsonl = "jsonl"
    table = "table"


OPTION_OF_FIELD = {
    "endpoint": "--endpoint",
    "provider": "--provider",
    "model": "--model",
    "api_key": "--api-key",
    "api_key_header": "--api-key-header",
    "timeout": "--timeout",
    "batch_size": "--batch-size",
}
"""The option that sets each `RerankSettings` field (a refusal's ``.field``)."""


@dataclass(frozen=True)
class RerankOptions:
    """What the shared options say: the reranker's settings, the choice without an endpoint,
    where spans go and how much to log. Settings are checked by `RerankSettings`, not here."""

    endpoint: list[str] | None = None
    """Every --endpoint given, in order: the first is the primary, the rest its fallbacks."""
    provider: list[str] | None = None
    model: list[str] | None = None
    api_key: str | None = None
    api_key_header: str | None = None
    timeout: float = 30.0
    batch_size: str | None = None
    reranker: RerankerChoice = RerankerChoice.auto
    precision: Precision = Precision.fp32
    trace_file: Path | None = None
    project: str | None = None
    telemetry_timeout: float = DEFAULT_TELEMETRY_TIMEOUT_S
    log_level: str = "warning"
    from_env: frozenset[str] = frozenset()
    """The fields read from their variable (`ENV_OF_FIELD`), to be named so in a refusal."""


_SHARED: dict[str, Any] = {
    "endpoint": Annotated[
        list[str] | None,
        typer.Option(
            "--endpoint",
            help="Base URL of a rerank service, e.g. TEI at http://localhost:8080. "
            "Repeat it for fallbacks, tried in order when one fails, each behind a circuit "
            "breaker. Without it the reranker runs in this process (see --reranker). "
            "[env var: RERANK_ENDPOINT, one URL]",
            show_default=False,
        ),
    ],
    "provider": Annotated[
        list[str] | None,
        typer.Option(
            "--provider",
            help=f"Wire format of --endpoint: {', '.join(PROVIDERS)}; or '{LOCAL}' (no "
            "--endpoint): the cross-encoder in process, like --reranker local. With several "
            "--endpoint: once for all, or once per --endpoint, in their order. [env var: "
            "RERANK_PROVIDER] [default: tei]",
            show_default=False,
        ),
    ],
    "model": Annotated[
        list[str] | None,
        typer.Option(
            "--model",
            help="With --endpoint: the model name sent to the service (with several: once "
            "for all, or once per --endpoint). Without: the "
            "in-process model, a Hugging Face id, an installed model package or a model "
            "directory (default: cross-encoder/ms-marco-MiniLM-L-6-v2 for --reranker local, "
            "sentence-transformers/all-MiniLM-L6-v2 for embedding). [env var: RERANK_MODEL]",
            show_default=False,
        ),
    ],
    "precision": Annotated[
        Precision,
        typer.Option(
            "--precision",
            help="The embedding model's precision (without --endpoint): fp32 (numpy), int8 "
            "(onnxruntime, the [int8] extra, a CPU with VNNI) or bf16 (OpenVINO, the [bf16] "
            "extra, a CPU with AVX512_BF16). Where it cannot run, fp32 runs and a line says "
            "why. docs/benchmarks.md has their speed and ranking quality.",
            case_sensitive=False,
        ),
    ],
    "api_key": Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="RERANK_API_KEY",
            help="Credential for the first --endpoint (see --api-key-header); the n-th "
            "fallback's is read from RERANK_API_KEY_<n> only. Prefer the variable.",
            show_default=False,
        ),
    ],
    "api_key_header": Annotated[
        str | None,
        typer.Option(
            "--api-key-header",
            envvar="RERANK_API_KEY_HEADER",
            help="Header that carries the key; 'Authorization' sends 'Bearer <key>'. Default: "
            "the provider's convention, 'Authorization' for the hosted APIs, vLLM and "
            "Infinity, 'apikey' (the gateway convention) for tei and sidecar.",
            show_default=False,
        ),
    ],
    "timeout": Annotated[
        float,
        typer.Option(
            "--timeout",
            envvar="RERANK_TIMEOUT",
            min=0.1,
            help="Seconds for one rerank call, retries included.",
        ),
    ],
    "batch_size": Annotated[
        str | None,
        typer.Option(
            "--batch-size",
            envvar="RERANK_BATCH_SIZE",
            help="Texts per request to --endpoint: a positive integer, or 'auto' (ask TEI's "
            "/info). Default: the provider's documented cap.",
            show_default=False,
        ),
    ],
    "reranker": Annotated[
        RerankerChoice,
        typer.Option(
            "--reranker",
            help="'endpoint': the service at --endpoint; 'local': a cross-encoder in process "
            "(--model; needs the [torch] extra); 'embedding': cosine of embeddings from "
            "--model (default: the packaged all-MiniLM-L6-v2, offline; needs the [local] "
            "extra); 'lexical': a "
            "bag-of-words fallback, not a model; 'auto': the endpoint when given, else a "
            "cross-encoder that loads (offline: one already on disk), else the embedding "
            "model, else lexical.",
        ),
    ],
    "trace_file": Annotated[
        Path | None,
        typer.Option(
            "--trace-file",
            help="Also write the spans to this file as OTLP/JSON lines (appended).",
            dir_okay=False,
            show_default=False,
        ),
    ],
    "project": Annotated[
        str | None,
        typer.Option(
            "--project",
            envvar="RETRIEVAL_STAGE_PROJECT",
            help="The Arize Phoenix / OpenInference project the spans land in (resource "
            "attribute openinference.project.name). Default: its key in "
            f"OTEL_RESOURCE_ATTRIBUTES, else the service name ({DEFAULT_SERVICE_NAME}).",
            show_default=False,
        ),
    ],
    "telemetry_timeout": Annotated[
        float,
        typer.Option(
            "--telemetry-timeout",
            envvar="RETRIEVAL_STAGE_TELEMETRY_TIMEOUT",
            min=0.0,
            help="Seconds the command may wait at exit for spans and metrics to reach the "
            "collector, both together; what is left then is dropped and counted.",
        ),
    ],
    "log_level": Annotated[
        str,
        typer.Option("--log-level", help="Log level for stderr: debug, info, warning, error."),
    ],
}


ENV_OF_FIELD = {
    "endpoint": "RERANK_ENDPOINT",
    "provider": "RERANK_PROVIDER",
    "model": "RERANK_MODEL",
}
"""The repeatable options' variables, read here as one value each when the option is absent."""


def with_rerank_options(command: Callable[..., None]) -> Callable[..., None]:
    """`command` (which takes ``options: RerankOptions``) with the shared options appended to
    its signature, so Typer offers them on every command that uses this."""
    signature = inspect.signature(command, eval_str=True)
    own = [p for p in signature.parameters.values() if p.name != "options"]
    defaults = RerankOptions()
    shared = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=getattr(defaults, name),
            annotation=annotation,
        )
        for name, annotation in _SHARED.items()
    ]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        kwargs.pop("help_all", None)  # Typer passes an eager flag's value even unexposed
        values = {name: kwargs.pop(name) for name in _SHARED}
        from_env = set()
        for name, variable in ENV_OF_FIELD.items():
            # A repeatable option's variable is one value, never split at spaces (click's
            # rule for lists): a model directory may hold one.
            if not values[name] and os.environ.get(variable, "").strip():
                values[name] = [os.environ[variable]]
                from_env.add(name)
        command(options=RerankOptions(**values, from_env=frozenset(from_env)), **kwargs)

    parameters = [*own, *shared, help_all_parameter()]
    wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": None}
    return wrapper


class Command(HelpCommand):
    """A command whose --help shows its own options and examples; --help-all every option."""

    shared = frozenset(_SHARED)


class Group(HelpGroup):
    """The application's group: its commands and examples. Every command runs under
    `interrupt.handled`: Ctrl-C and SIGTERM end it with one line and exit code 130 or 143."""

    def invoke(self, ctx: Any) -> Any:
        from .interrupt import handled

        with handled():
            return super().invoke(ctx)
