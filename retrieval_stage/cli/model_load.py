"""Loading the command's in-process model, timed, and in a span of its own where asked.

The command loads its model when it chooses the reranker (`cli.reranker`), before any rerank,
so no rerank span times the load. ``demo`` also traces it (`traced_loads`): each load runs
under a ``model.load`` span (its own trace; an OpenInference CHAIN, so Phoenix shows a kind)
on which the library's load event (`retrieval_stage.model.load`: duration, model, backend)
lands, so a trace viewer shows where the seconds before the pipeline went. The other commands
load untraced, as before.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from openinference.semconv.trace import OpenInferenceSpanKindValues, SpanAttributes
from rich.text import Text

from ..spans.keys import ATTR_MODEL, ATTR_PROVIDER
from ..spans.status import mark_ok
from .console import err

__all__ = ["LOAD_SPAN", "load_model", "traced_loads"]

LOAD_SPAN = "model.load"
"""The name of the span a traced load runs under."""

_TRACER: ContextVar[Any] = ContextVar("retrieval_stage_cli_model_load_tracer", default=None)


@contextmanager
def traced_loads(tracer_provider: Any) -> Iterator[None]:
    """Within the block, `load_model` loads under a `LOAD_SPAN` span of `tracer_provider`."""
    token = _TRACER.set(tracer_provider.get_tracer("retrieval_stage.cli"))
    try:
        yield
    finally:
        _TRACER.reset(token)


def load_model(reranker: Any, name: str) -> float:
    """Load `reranker`'s model now (a spinner on stderr meanwhile); the seconds it took.

    `RerankError` when it cannot load; a traced load's span records it as the span's error.
    """
    tracer = _TRACER.get()
    started = time.perf_counter()
    with err().status(Text(f"loading {name}…")):
        if tracer is None:
            reranker.load()
        else:
            attributes = {
                SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.CHAIN.value,
                ATTR_MODEL: str(getattr(reranker, "model_name", name)),
                ATTR_PROVIDER: str(getattr(reranker, "provider", "local")),
            }
            with tracer.start_as_current_span(LOAD_SPAN, attributes=attributes) as span:
                reranker.load()
                mark_ok(span)
    return time.perf_counter() - started
