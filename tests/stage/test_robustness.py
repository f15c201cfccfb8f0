"""The stage under odd but legal input: telemetry never turns a good rerank into an error."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any, TypeVar

import numpy as np
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from structlog.testing import capture_logs

import retrieval_stage.spans.content as content
import retrieval_stage.spans.fit as fit
from retrieval_stage import Candidate, NullReranker, RerankStage
from retrieval_stage.spans import TRUNCATION_MARKER
from retrieval_stage.telemetry import otlp_encoder
from retrieval_stage.telemetry.otlp_encoder import encode_spans_fast, sdk_serialize_spans

from ..fakes import Reverse
from ..native import LOOPS, use_loops

UNPRINTABLE = "<unprintable "

T = TypeVar("T")


def provider_with(limit: int | None = None) -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    limits = SpanLimits(max_span_attributes=limit) if limit else None
    provider = TracerProvider(span_limits=limits)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


class Float32Scores:
    """A reranker returning numpy float32 scores, as many model wrappers do."""

    def rerank(
        self,
        query: str,
        items: Sequence[T],
        *,
        text: Callable[[T], str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[T, Any]]:
        scored = [(item, np.float32(i)) for i, item in enumerate(items)]
        return sorted(scored, key=lambda p: -float(p[1]))


def test_numpy_float32_scores_are_accepted() -> None:
    cands = [Candidate("a", "x"), Candidate("b", "y")]
    out = RerankStage(Float32Scores()).run("q", cands)
    assert [(r.candidate.id, r.score, r.reranked) for r in out] == [
        ("b", 1.0, True),
        ("a", 0.0, True),
    ]
    assert all(type(r.score) is float for r in out)


def test_odd_metadata_becomes_valid_json_on_the_span() -> None:
    provider, exporter = provider_with()
    cands = [
        Candidate("mixed", "x", metadata={1: "a", "b": 2}),  # type: ignore[dict-item]
        Candidate("tuple", "y", metadata={(1, 2): "x"}),  # type: ignore[dict-item]
        Candidate("nan", "z", metadata={"v": float("nan"), "o": object()}),
    ]
    out = RerankStage(NullReranker(), tracer_provider=provider).run("q", cands)
    assert [r.candidate for r in out] == cands
    (span,) = exporter.get_finished_spans()
    for i in range(3):
        raw = span.attributes[f"reranker.input_documents.{i}.document.metadata"]
        assert isinstance(json.loads(raw), dict)  # valid JSON, NaN included
    assert json.loads(span.attributes["reranker.input_documents.0.document.metadata"]) == {
        "1": "a",
        "b": 2,
    }


def test_lone_surrogate_in_a_document_is_replaced_on_the_span() -> None:
    provider, exporter = provider_with()
    long_text = "x" * 600 + "\ud800" + "y" * 600
    cands = [Candidate("s", long_text), Candidate("t", "short \udfff")]
    out = RerankStage(NullReranker(), tracer_provider=provider).run("q", cands)
    assert len(out) == 2
    (span,) = exporter.get_finished_spans()
    for i in range(2):
        content = span.attributes[f"reranker.input_documents.{i}.document.content"]
        content.encode("utf-8")  # exportable
        assert "?" in content


def test_metadata_id_and_query_are_capped_too() -> None:
    provider, exporter = provider_with()
    big = "é" * 3000
    stage = RerankStage(NullReranker(), tracer_provider=provider, max_content_length=100)
    stage.run(big, [Candidate(big, "t", metadata={"note": big})])
    (span,) = exporter.get_finished_spans()
    for key in (
        "reranker.query",
        "reranker.input_documents.0.document.id",
        "reranker.input_documents.0.document.metadata",
    ):
        value = span.attributes[key]
        assert len(value.encode("utf-8")) <= 100 + 40, key
    assert span.attributes["reranker.query"].endswith(TRUNCATION_MARKER)
    assert json.loads(span.attributes["reranker.input_documents.0.document.metadata"])


def test_identity_survives_a_tiny_attribute_limit() -> None:
    for limit in (8, 12):
        provider, exporter = provider_with(limit)
        cands = [Candidate(f"d{i}", f"text {i}", 1.0 - i / 10) for i in range(5)]
        RerankStage(NullReranker(), tracer_provider=provider, model_name="m", top_k=3).run(
            "tiny", cands
        )
        (span,) = exporter.get_finished_spans()
        assert span.attributes["openinference.span.kind"] == "RERANKER", limit
        assert span.attributes["reranker.query"] == "tiny", limit
        assert span.attributes["reranker.model_name"] == "m", limit
        assert span.attributes["reranker.top_k"] == 3, limit
        assert span.dropped_attributes == 0, limit


def test_candidates_are_hashable() -> None:
    a = Candidate("a", "x", 0.5, {"k": 1})
    assert len({a, Candidate("a", "x", 0.5, {"k": 1})}) == 1
    assert a != Candidate("a", "x", 0.5, {"k": 2})


def test_library_prints_nothing_but_its_warning_when_logging_is_not_configured() -> None:
    """Nothing on stdout; the fallback reaches stderr through `logging.lastResort` (issue 27:
    a plain script must hear it), as one line, and nothing else does."""
    script = (
        "from retrieval_stage import Candidate, RerankClient, RerankStage\n"
        "c = RerankClient('http://127.0.0.1:9', timeout=1.0, max_retries=1)\n"
        "out = RerankStage(c).run('q', [Candidate('a', 'x')])\n"
        "assert not out[0].reranked\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("rerank.fallback: the reranker failed"), line


# -- values that do not print as they look: every one costs itself at most ----------------------


@pytest.fixture(params=LOOPS)
def loops(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The C loops where they stand in for Python on a traced call (the documents' packing,
    ``output.value``, the OTLP bytes), or the Python everywhere."""
    for module in (fit, content):
        use_loops(request, monkeypatch, module)
    return use_loops(request, monkeypatch, otlp_encoder)


def exported(span: Any) -> dict[str, Any]:
    """The span's attributes as our encoder exports them (a deferred record read in C where
    the loops are on), checked against the SDK's own encoding of the same span."""
    body = encode_spans_fast([span])
    assert body == sdk_serialize_spans([span])
    (decoded,) = ExportTraceServiceRequest.FromString(body).resource_spans[0].scope_spans[0].spans
    values: dict[str, Any] = {}
    for kv in decoded.attributes:
        field = kv.value.WhichOneof("value")
        values[kv.key] = getattr(kv.value, field) if field else None
    return values


class Detached:
    """A lazy ORM attribute on a detached row: asking for its text raises."""

    def __str__(self) -> str:
        raise RuntimeError("Parent instance is not bound to a Session")

    __repr__ = __str__


def test_an_unprintable_metadata_value_costs_that_value_only(loops: str) -> None:
    provider, exporter = provider_with()
    cands = [
        Candidate(f"d{i}", f"text {i}", 1.0 - i / 10, {"src": "wiki", "n": i}) for i in range(4)
    ]
    cands[2] = Candidate("d2", "text 2", 0.8, {"src": "wiki", "n": 2, "row": Detached()})
    with capture_logs() as logs:
        out = RerankStage(Reverse(), tracer_provider=provider).run("q", cands)
    assert logs == []  # no rerank.span_attributes_failed
    assert [r.candidate.id for r in out] == ["d3", "d2", "d1", "d0"]
    (span,) = exporter.get_finished_spans()
    values = exported(span)
    assert values["retrieval_stage.fallback"] is False
    for i in range(4):
        for key in ("id", "content", "score", "metadata"):
            assert f"reranker.input_documents.{i}.document.{key}" in values, (i, key)
            assert f"reranker.output_documents.{i}.document.{key}" in values, (i, key)
    bad = {"n": 2, "row": f"{UNPRINTABLE}Detached: RuntimeError>", "src": "wiki"}
    assert json.loads(values["reranker.input_documents.2.document.metadata"]) == bad
    assert json.loads(values["reranker.output_documents.1.document.metadata"]) == bad
    assert json.loads(values["reranker.input_documents.1.document.metadata"]) == {
        "n": 1,
        "src": "wiki",
    }
    ids = [d["id"] for d in json.loads(values["output.value"])["documents"]]
    assert ids == ["d3", "d2", "d1", "d0"]


class Tier(str, Enum):
    GOLD = "gold"
    SILVER = "silver"


class Hostile(str):
    """A str subclass whose every method but its characters raises or lies."""

    def __str__(self) -> str:
        raise RuntimeError("__str__")

    def __len__(self) -> int:
        raise RuntimeError("__len__")

    def isascii(self) -> bool:
        raise RuntimeError("isascii")

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return b"lies"


def test_a_str_subclass_id_text_and_query_are_exported_as_their_characters(loops: str) -> None:
    """A str Enum's ``str()`` is "Tier.GOLD"; its characters, which the SDK exports and json
    writes into ``output.value``, are "gold": the span's document ids, texts and query are the
    characters, whatever the subclass's methods say."""
    provider, exporter = provider_with()
    cands = [
        Candidate(Tier.GOLD, Tier.SILVER, 0.9),
        Candidate(Hostile("hostile é"), Hostile("its text é"), 0.5),
        Candidate("plain", "x" * 3000, 0.1),  # capped: over the default 2,000 bytes
    ]
    with capture_logs() as logs:
        RerankStage(Reverse(), tracer_provider=provider).run(Tier.GOLD, cands)
    assert logs == []
    (span,) = exporter.get_finished_spans()
    values = exported(span)
    assert values["reranker.query"] == values["input.value"] == "gold"
    inputs = [values[f"reranker.input_documents.{i}.document.id"] for i in range(3)]
    assert inputs == ["gold", "hostile é", "plain"]
    texts = [values[f"reranker.input_documents.{i}.document.content"] for i in range(3)]
    assert texts[:2] == ["silver", "its text é"]
    assert texts[2].endswith(TRUNCATION_MARKER)
    outputs = [values[f"reranker.output_documents.{i}.document.id"] for i in range(3)]
    assert outputs == ["plain", "hostile é", "gold"]
    assert [d["id"] for d in json.loads(values["output.value"])["documents"]] == outputs
