"""`eval --phoenix`'s pure parts: where Phoenix is, which document each grade goes to, retries.

The real Phoenix round trip (annotations stored, NDCG read back and compared with the eval's
own) is in tests/third_party/test_phoenix_evals.py; here a finished span comes from a real SDK
tracer and the only stand-in is the Phoenix client in the retry tests.
"""

from __future__ import annotations

import os
from typing import Any

import httpx
import pytest
import typer.main
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from typer.core import TyperGroup
from typer.testing import CliRunner

from retrieval_stage import Candidate, RerankStage
from retrieval_stage.cli import app
from retrieval_stage.cli.help import with_bare_values
from retrieval_stage.cli.phoenix import (
    ANNOTATION_NAME,
    FROM_OTLP,
    SHARED,
    DocumentSpans,
    FixedRecall,
    PhoenixUnavailableError,
    SpanDocuments,
    judgements,
    log_judgements,
    phoenix_url,
)
from retrieval_stage.pipeline import Pipeline

from ..fakes import ByLength

# -- where Phoenix is ---------------------------------------------------------------------


def test_phoenix_url_given_wins() -> None:
    assert phoenix_url("http://px:6006/", "http://collector:4318") == "http://px:6006"


def test_bare_phoenix_takes_the_otlp_endpoints_host() -> None:
    assert phoenix_url("otlp", "http://127.0.0.1:6006") == "http://127.0.0.1:6006"
    assert phoenix_url("otlp", "https://px.example:443/v1/traces") == "https://px.example:443"
    # Credentials in the endpoint are not carried into the API URL.
    assert phoenix_url("otlp", "http://user:secret@px:6006") == "http://px:6006"


def test_a_phoenix_behind_a_path_keeps_it() -> None:
    assert phoenix_url("https://host/phoenix/", None) == "https://host/phoenix"


@pytest.mark.parametrize(
    ("given", "endpoint", "message"),
    [
        ("otlp", None, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        ("localhost:6006", None, "http"),
        ("otlp", "grpc://collector:4317", "http"),
    ],
)
def test_phoenix_url_refuses_what_is_not_an_http_url(
    given: str, endpoint: str | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        phoenix_url(given, endpoint)


# -- a bare --phoenix on the command line ------------------------------------------------


def eval_params(*args: str) -> dict[str, Any]:
    """What `eval` parses from `args` (Typer's real parser; nothing runs)."""
    command = typer.main.get_command(app)
    assert isinstance(command, TyperGroup)
    return command.commands["eval"].make_context("eval", list(args)).params


@pytest.mark.parametrize(
    ("args", "phoenix"),
    [
        (["--phoenix"], FROM_OTLP),
        (["--phoenix", "--json"], FROM_OTLP),
        (["--json", "--phoenix"], FROM_OTLP),
        (["--phoenix", "--resamples", "100"], FROM_OTLP),
        (["--phoenix", "http://px:6006", "--json"], "http://px:6006"),
        (["--json", "--phoenix=http://px:6006"], "http://px:6006"),
        (["--phoenix", "otlp"], FROM_OTLP),
        ([], None),
    ],
)
def test_phoenix_may_be_given_without_a_url(args: list[str], phoenix: str | None) -> None:
    params = eval_params(*args)
    assert params["phoenix"] == phoenix
    assert params["as_json"] == ("--json" in args)


def test_only_options_before_the_end_of_options_are_rewritten() -> None:
    assert with_bare_values(["--phoenix", "--", "--phoenix"], {"--phoenix": "otlp"}) == [
        "--phoenix=otlp",
        "--",
        "--phoenix",
    ]
    assert with_bare_values(["--phoenix", "http://px"], {"--phoenix": "otlp"}) == [
        "--phoenix",
        "http://px",
    ]


def test_bare_phoenix_without_an_otlp_endpoint_is_a_usage_error() -> None:
    unset: dict[str, str | None] = {k: None for k in os.environ if k.startswith("OTEL_")}
    done = CliRunner().invoke(app, ["eval", "--phoenix", "--json"], env=unset)
    assert done.exit_code == 2, done.output
    assert "--phoenix without a URL" in " ".join(done.output.split())
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in done.output


def test_an_unknown_annotation_naming_is_a_usage_error_naming_the_two() -> None:
    done = CliRunner().invoke(app, ["eval", "--phoenix-annotation", "shared"])
    assert done.exit_code == 2, done.output
    assert "by-kind" in done.output
    assert "relevance" in done.output


def test_bare_phoenix_refuses_an_otlp_endpoint_that_is_no_http_url() -> None:
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "grpc://collector:4317"
    done = CliRunner().invoke(app, ["eval", "--phoenix"], env=env)
    assert done.exit_code == 2, done.output
    assert "(from OTEL_EXPORTER_OTLP_ENDPOINT)" in " ".join(done.output.split())


# -- which document each grade goes to ----------------------------------------------------


def traced_pipeline(pool: list[Candidate]) -> tuple[list[SpanDocuments], list[str]]:
    provider = TracerProvider()
    spans = DocumentSpans()
    provider.add_span_processor(spans)
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    stage = RerankStage(ByLength(), tracer_provider=provider)
    result = Pipeline(
        FixedRecall(pool, "given"), stage, recall_k=len(pool), tracer_provider=provider
    ).run("q")
    return spans.drain(), [r.candidate.id for r in result.results]


POOL = [
    Candidate("short", "a", score=0.9),
    Candidate("longest", "a much longer passage", score=0.5),
    Candidate("middle", "medium text", score=0.1),
]


def test_each_span_is_read_back_with_its_documents_in_its_order() -> None:
    spans, reranked = traced_pipeline(POOL)

    assert [s.kind for s in spans] == ["RETRIEVER", "RERANKER"]
    assert spans[0].document_ids == ("short", "longest", "middle")
    assert spans[1].document_ids == tuple(reranked) == ("longest", "middle", "short")
    assert all(len(s.span_id) == 16 for s in spans)


def test_grades_follow_the_documents_not_the_positions() -> None:
    spans, reranked = traced_pipeline(POOL)

    out = judgements(
        spans,
        query_id="q1",
        recalled=[c.id for c in POOL],
        reranked=reranked,
        judged={"longest": 2, "short": 0},
    )

    by_span = {s.kind: s.span_id for s in spans}
    graded = {
        (a["span_id"], a["document_position"]): (a["result"]["score"], a["metadata"]["document_id"])
        for a in out
    }
    assert graded == {
        (by_span["RETRIEVER"], 0): (0.0, "short"),
        (by_span["RETRIEVER"], 1): (2.0, "longest"),
        (by_span["RETRIEVER"], 2): (0.0, "middle"),  # unjudged: 0, as ir-measures counts it
        (by_span["RERANKER"], 0): (2.0, "longest"),
        (by_span["RERANKER"], 1): (0.0, "middle"),
        (by_span["RERANKER"], 2): (0.0, "short"),
    }
    # Each kind under its own name, so Phoenix's project summary never averages the two.
    names = {by_span["RETRIEVER"]: "recall.relevance", by_span["RERANKER"]: "rerank.relevance"}
    assert all(a["name"] == names[a["span_id"]] for a in out)
    assert {a["annotator_kind"] for a in out} == {"LLM"}
    assert [a["metadata"]["judged"] for a in out][:3] == [True, True, False]


def test_the_shared_name_of_earlier_versions_is_one_choice_away() -> None:
    spans, reranked = traced_pipeline(POOL)

    by_kind = judgements(
        spans, query_id="q1", recalled=[c.id for c in POOL], reranked=reranked, judged={}
    )
    shared = judgements(
        spans,
        query_id="q1",
        recalled=[c.id for c in POOL],
        reranked=reranked,
        judged={},
        names=SHARED,
    )

    assert {a["name"] for a in shared} == {ANNOTATION_NAME} == {"relevance"}
    # Nothing else differs: the same documents, positions and grades.
    assert [{**a, "name": None} for a in shared] == [{**a, "name": None} for a in by_kind]


def test_a_span_that_disagrees_with_the_eval_is_refused() -> None:
    spans, reranked = traced_pipeline(POOL)

    with pytest.raises(ValueError, match="shows 'longest' at position 0"):
        judgements(
            spans,
            query_id="q1",
            recalled=[c.id for c in POOL],
            reranked=list(reversed(reranked)),
            judged={},
        )


def test_a_span_cut_short_by_a_limit_is_graded_as_far_as_it_goes() -> None:
    spans = [SpanDocuments("00000000000000aa", "RERANKER", ("b",))]

    out = judgements(spans, query_id="q", recalled=["a", "b"], reranked=["b", "a"], judged={"b": 1})

    assert [(a["document_position"], a["result"]["score"]) for a in out] == [(0, 1.0)]


def test_a_capped_id_still_matches_its_document() -> None:
    from retrieval_stage.spans import TRUNCATION_MARKER

    long_id = "doc-" + "x" * 100
    spans = [SpanDocuments("00000000000000aa", "RETRIEVER", ("doc-xx" + TRUNCATION_MARKER,))]

    out = judgements(
        spans, query_id="q", recalled=[long_id], reranked=[long_id], judged={long_id: 3}
    )

    assert out[0]["result"]["score"] == 3.0
    assert out[0]["metadata"]["document_id"] == long_id


# -- logging, with Phoenix's client replaced ----------------------------------------------


class FlakyClient:
    """Answers 404 (spans not stored yet) `misses` times, then stores what it is given."""

    def __init__(self, misses: int, status: int = 404) -> None:
        self.misses = misses
        self.status = status
        self.calls: list[list[dict[str, Any]]] = []
        self.spans = self

    def log_document_annotations(
        self, *, document_annotations: list[dict[str, Any]], sync: bool
    ) -> list[dict[str, str]]:
        assert sync is True
        self.calls.append(document_annotations)
        if self.misses:
            self.misses -= 1
            request = httpx.Request("POST", "http://px/v1/document_annotations")
            response = httpx.Response(self.status, request=request, text="Spans do not exist")
            raise httpx.HTTPStatusError("missing", request=request, response=response)
        return [{"id": str(i)} for i, _ in enumerate(document_annotations)]


def annotations(n: int) -> list[dict[str, Any]]:
    return [{"span_id": "00000000000000aa", "document_position": i} for i in range(n)]


def test_spans_phoenix_has_not_stored_yet_are_waited_for() -> None:
    client = FlakyClient(misses=2)

    assert log_judgements("http://px", annotations(3), client=client) == 3
    assert len(client.calls) == 3


def test_batches_are_bounded() -> None:
    client = FlakyClient(misses=0)

    assert log_judgements("http://px", annotations(1200), client=client) == 1200
    assert [len(c) for c in client.calls] == [500, 500, 200]


def test_spans_that_never_arrive_end_in_an_error() -> None:
    with pytest.raises(PhoenixUnavailableError, match="HTTP 404"):
        log_judgements("http://px", annotations(1), client=FlakyClient(misses=10**6), wait_s=0.6)


def test_other_refusals_are_not_retried() -> None:
    client = FlakyClient(misses=1, status=422)

    with pytest.raises(PhoenixUnavailableError, match="HTTP 422 Spans do not exist"):
        log_judgements("http://px", annotations(1), client=client)
    assert len(client.calls) == 1
