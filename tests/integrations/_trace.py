"""Reading the spans a framework run exported: the RERANKER span(s), their documents, their place.

Shared by the three framework test files. Every helper asserts on the finished spans of an
`InMemorySpanExporter`; none depends on a framework.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from openinference.semconv.trace import (
    DocumentAttributes,
    OpenInferenceSpanKindValues,
    RerankerAttributes,
    SpanAttributes,
)
from opentelemetry.sdk.trace import ReadableSpan

OUR_SCOPE = "retrieval_stage"
RERANKER = OpenInferenceSpanKindValues.RERANKER.value


def kind(span: ReadableSpan) -> Any:
    return (span.attributes or {}).get(SpanAttributes.OPENINFERENCE_SPAN_KIND)


def the_reranker_span(spans: Sequence[ReadableSpan]) -> ReadableSpan:
    """The one RERANKER span of the run, which must be ours (the stage's tracer)."""
    found = [s for s in spans if kind(s) == RERANKER]
    assert [(s.name, s.instrumentation_scope.name) for s in found] == [("rerank", OUR_SCOPE)], (
        "expected exactly one RERANKER span, the stage's"
    )
    return found[0]


def ancestors(span: ReadableSpan, spans: Sequence[ReadableSpan]) -> list[ReadableSpan]:
    """The exported spans from `span`'s parent up to its trace's root, nearest first."""
    by_id = {s.context.span_id: s for s in spans}
    chain: list[ReadableSpan] = []
    parent = span.parent
    while parent is not None:
        assert parent.span_id in by_id, "a parent span was never exported"
        node = by_id[parent.span_id]
        chain.append(node)
        parent = node.parent
    return chain


def assert_inside_framework(span: ReadableSpan, spans: Sequence[ReadableSpan], root: str) -> None:
    """`span` sits in the framework's trace: same trace id, its parents lead up to the
    framework's own root span named `root`, and its direct parent is the framework's too."""
    chain = ancestors(span, spans)
    assert chain, "our RERANKER span is a root: it landed in a trace of its own"
    assert {s.context.trace_id for s in chain} == {span.context.trace_id}
    assert chain[0].instrumentation_scope.name != OUR_SCOPE
    assert chain[-1].name == root
    assert chain[-1].instrumentation_scope.name != OUR_SCOPE


def documents(span: ReadableSpan, which: str = "input") -> list[dict[str, Any]]:
    """The span's input or output documents as dicts (id, score, content, metadata)."""
    prefix = (
        RerankerAttributes.RERANKER_INPUT_DOCUMENTS
        if which == "input"
        else RerankerAttributes.RERANKER_OUTPUT_DOCUMENTS
    )
    attributes = dict(span.attributes or {})
    fields = {
        DocumentAttributes.DOCUMENT_ID: "id",
        DocumentAttributes.DOCUMENT_SCORE: "score",
        DocumentAttributes.DOCUMENT_CONTENT: "content",
        DocumentAttributes.DOCUMENT_METADATA: "metadata",
    }
    out: list[dict[str, Any]] = []
    i = 0
    while f"{prefix}.{i}.{DocumentAttributes.DOCUMENT_ID}" in attributes:
        doc: dict[str, Any] = {}
        for key, name in fields.items():
            value = attributes.get(f"{prefix}.{i}.{key}")
            if value is not None:
                doc[name] = json.loads(value) if name == "metadata" else value
        out.append(doc)
        i += 1
    return out
