"""``retrieval-stage eval``: is reranking better than recall, on judged queries?

Reads the queries, judgements and candidates (or finds candidates now with ``--recall``),
reranks each judged query under one CHAIN span with a progress bar, and prints MRR@10,
nDCG@10, Recall@k and top-1 accuracy for both rankings with a paired permutation test. With
``--phoenix`` each query runs as a traced pipeline whose spans then get their judgements in
Arize Phoenix. `cli.commands` registers `eval_` on the application as ``eval``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, ClassVar

import typer
from openinference.instrumentation import get_span_kind_attributes
from openinference.semconv.trace import OpenInferenceSpanKindValues
from rich.text import Text

from .._install import install_hint
from ..errors import RerankError
from ..models import Candidate
from ..spans.status import mark_ok
from ..telemetry.otlp import DEFAULT_SERVICE_NAME
from .console import EXIT_FAILURE, EXIT_USAGE, err, fail, note, out
from .inputs import read_candidates, read_pools
from .interrupt import while_doing
from .options import Command, RecallChoice, RerankOptions, with_rerank_options
from .phoenix import FROM_OTLP
from .render import metrics_table, movement_table, rerank_failed, say_reranker
from .reranker import Chosen
from .session import Tracing, session

__all__ = ["EvalCommand", "PhoenixNames", "eval_"]


class PhoenixNames(str, enum.Enum):
    """``--phoenix-annotation``: how the judgements are named in Phoenix (`cli.phoenix`)."""

    by_kind = "by-kind"
    """``recall.relevance`` on RETRIEVER spans, ``rerank.relevance`` on RERANKER spans."""
    relevance = "relevance"
    """Both ``relevance``, as before: Phoenix's project summary then averages the two."""


class EvalCommand(Command):
    """``eval``: a bare ``--phoenix`` means the Phoenix the OTLP traces already go to."""

    bare: ClassVar[Mapping[str, str]] = MappingProxyType({"--phoenix": FROM_OTLP})


@with_rerank_options
def eval_(
    options: RerankOptions,
    queries: Annotated[
        Path | None,
        typer.Option(
            "--queries",
            help="Queries: 'qid<TAB>text' lines, or JSON lines {id, text}.",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    qrels: Annotated[
        Path | None,
        typer.Option(
            "--qrels",
            help="Judgements: TREC qrels 'qid 0 docid grade', or JSON lines "
            "{query_id, doc_id, relevance}.",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    candidates: Annotated[
        Path | None,
        typer.Option(
            "--candidates",
            help="Recall's candidates per query: a TREC run 'qid Q0 docid rank score tag' "
            "(texts from --docs), or JSON lines {query_id, id, text?, score?}.",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    docs: Annotated[
        Path | None,
        typer.Option(
            "--docs",
            help="Document texts for a TREC run: JSON lines {id, text} (default: the bundled "
            "corpus).",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    recall: Annotated[
        RecallChoice | None,
        typer.Option(
            "--recall",
            help="Find each query's candidates now, over the corpus (--docs or the bundled "
            "one), instead of reading --candidates: bm25, dense (the embedding model; "
            "document embeddings cached on disk) or hybrid (both, reciprocal rank fusion). "
            "Default: --candidates, or for the bundled example its BM25 run.",
            show_default=False,
        ),
    ] = None,
    recall_k: Annotated[
        int,
        typer.Option("--recall-k", min=1, help="Candidates per query with --recall."),
    ] = 50,
    recall_at: Annotated[int, typer.Option("--recall-at", min=1, help="The k of Recall@k.")] = 5,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the report as one JSON object.")
    ] = False,
    resamples: Annotated[
        int,
        typer.Option(
            "--resamples",
            min=100,
            max=1_000_000,  # evaluation.MAX_RESAMPLES: p to ~1e-6, more only costs time
            help="Random sign flips of the permutation test (when the exact test is larger).",
        ),
    ] = 9999,
    phoenix: Annotated[
        str | None,
        typer.Option(
            "--phoenix",
            metavar="[URL]",
            help="Trace the eval into Arize Phoenix at URL (without one: the host "
            "OTEL_EXPORTER_OTLP_ENDPOINT points to) and log every judged document onto its "
            "RETRIEVER and RERANKER spans, so Phoenix shows NDCG@k, precision@k and hit. "
            "Needs the [phoenix] extra.",
            show_default=False,
        ),
    ] = None,
    phoenix_annotation: Annotated[
        PhoenixNames,
        typer.Option(
            "--phoenix-annotation",
            metavar="NAMES",
            help="by-kind: recall.relevance, rerank.relevance; relevance: both, as before.",
        ),
    ] = PhoenixNames.by_kind,
) -> None:
    """Is reranking better than recall? MRR@10, nDCG@10, Recall@k, top-1 accuracy.

    Reranks each judged query's candidates and reports both rankings side by side with a
    paired permutation test, and how far each query's first relevant document moved. With no
    --queries/--qrels/--candidates it runs the bundled example: 24 questions about the
    standard library with BM25's top 50 as candidates.
    """
    inputs = _eval_inputs(queries, qrels, candidates, docs, recall)
    phoenix_at = None if phoenix is None else _phoenix_target(phoenix)
    with session(options) as (chosen, tracing):
        if inputs.recall is not None:
            inputs = _recalled(inputs, inputs.recall, chosen, recall_k)
        elif chosen.embedder is not None and inputs.corpus:
            _embed_corpus(inputs.corpus, chosen)
        report, logged = _run_eval(
            chosen,
            tracing,
            inputs,
            recall_at=recall_at,
            resamples=resamples,
            timeout=options.timeout,
            phoenix=phoenix_at,
            project=options.project or DEFAULT_SERVICE_NAME,
            phoenix_names=phoenix_annotation,
        )
        if as_json:
            body = report.to_dict()
            if logged is not None:
                body["phoenix"] = logged
            body["reranker"] = {
                "label": chosen.label,
                "provider": getattr(chosen.reranker, "provider", None),
                "model": getattr(chosen.reranker, "model_name", None),
                "why": chosen.why,  # why auto passed over the better choices, or null
            }
            body["recall"] = inputs.recall_label
            sys.stdout.write(json.dumps(body, ensure_ascii=False, indent=2) + "\n")
            sys.stdout.flush()
            if chosen.hint:  # the label it speaks of is in the JSON, not on the screen
                note(err(), f"reranker: {chosen.label}. {chosen.hint}", style="yellow")
            return
        _print_report(report, chosen, inputs)


@dataclass(frozen=True)
class _EvalInputs:
    """What `eval` measures: query texts, judgements, candidates per query, judged queries."""

    texts: dict[str, str]
    judgements: Any
    pools: dict[str, list[Candidate]]
    judged: list[str]
    source: str
    corpus: list[Candidate]
    recall: RecallChoice | None
    recall_label: str


def _eval_inputs(
    queries: Path | None,
    qrels: Path | None,
    candidates: Path | None,
    docs: Path | None,
    recall: RecallChoice | None,
) -> _EvalInputs:
    """The eval files (default: the bundled example), read and checked; exit 2 naming the
    file and line of the first problem (of --candidates: every bad line). Without
    --candidates, recall finds them later."""
    from ..evaluation import EvalInputError, read_qrels, read_queries
    from ..evaluation.corpus import (
        EXAMPLE_CANDIDATES,
        EXAMPLE_QRELS,
        EXAMPLE_QUERIES,
        data_path,
        load_corpus,
    )

    if (queries is None) != (qrels is None) or (candidates is not None and queries is None):
        fail(
            EXIT_USAGE,
            "give --queries and --qrels together (and --candidates, or --recall to find "
            "them), or none of them to run the bundled example",
        )
    if candidates is not None and recall is not None:
        fail(EXIT_USAGE, "--candidates and --recall exclude each other: recall finds them")
    if queries is not None and candidates is None and recall is None:
        recall = RecallChoice.bm25
    queries_path = data_path(EXAMPLE_QUERIES) if queries is None else queries
    qrels_path = data_path(EXAMPLE_QRELS) if qrels is None else qrels
    candidates_path = data_path(EXAMPLE_CANDIDATES) if candidates is None else candidates
    try:
        corpus = load_corpus() if docs is None else read_candidates(str(docs), "--docs")
        texts = read_queries(queries_path)
        judgements = read_qrels(qrels_path)
    except EvalInputError as exc:
        fail(EXIT_USAGE, str(exc))
    # Every line of --candidates checked, each bad one listed (as rerank does for --input).
    pools = {} if recall else read_pools(candidates_path, {d.id: d for d in corpus})
    judged = [q for q in texts if any(g > 0 for g in judgements.get(q, {}).values())]
    if not judged:
        fail(EXIT_USAGE, f"no query in {queries_path} has a relevant document in {qrels_path}")
    source = "the bundled example (stdlib docstrings)" if queries is None else str(queries_path)
    label = (
        "the bundled BM25 run (top 50)"
        if queries is None and recall is None
        else str(candidates_path)
        if recall is None
        else recall.value
    )
    return _EvalInputs(texts, judgements, pools, judged, source, corpus, recall, label)


def _embed_corpus(corpus: list[Candidate], chosen: Chosen) -> None:
    """Fill the embedding reranker's cache with the corpus's document embeddings, from disk
    after the first run, so each query's rerank costs one query embedding."""
    from .recall import dense_recall, index_corpus

    index_corpus(dense_recall(corpus, chosen.embedder))


def _recalled(inputs: _EvalInputs, choice: RecallChoice, chosen: Chosen, depth: int) -> _EvalInputs:
    """`inputs` with each judged query's candidates found now by `choice` over the corpus."""
    from .recall import make_recall

    if not inputs.corpus:
        fail(EXIT_USAGE, "--docs: no documents to recall from")
    made = make_recall(choice, inputs.corpus, chosen)
    pools = {qid: made.recaller.recall(inputs.texts[qid], depth) for qid in inputs.judged}
    label = f"{made.label}, top {depth}"
    return dataclasses.replace(inputs, pools=pools, recall_label=label)


def _phoenix_target(given: str) -> str:
    """Phoenix's URL for ``--phoenix``, with the traces sent there; exit 2 when it cannot be
    used (no URL, no [phoenix] extra)."""
    from .phoenix import phoenix_url

    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    try:
        url = phoenix_url(given, endpoint)
    except ValueError as exc:
        fail(EXIT_USAGE, str(exc))
    try:
        import phoenix.client  # noqa: F401
    except ImportError:
        fail(
            EXIT_USAGE,
            f"--phoenix needs the [phoenix] extra: {install_hint('phoenix')}",
        )
    # Phoenix takes OTLP/HTTP at <url>/v1/traces: the spans must go where the judgements go.
    os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"{url}/v1/traces"
    os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
    return url


def _run_eval(
    chosen: Chosen,
    tracing: Tracing,
    inputs: _EvalInputs,
    *,
    recall_at: int,
    resamples: int,
    timeout: float,
    phoenix: str | None = None,
    project: str = DEFAULT_SERVICE_NAME,
    phoenix_names: PhoenixNames = PhoenixNames.by_kind,
) -> tuple[Any, dict[str, Any] | None]:
    """Rerank every judged query under one CHAIN span, with a progress bar on stderr; with
    `phoenix`, each query as a traced pipeline whose spans then get their judgements there."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from ..evaluation import evaluate

    stage = tracing.stage(chosen, None)
    names = _annotation_names(phoenix_names)
    rerank, annotated = _phoenix_reranking(tracing, stage, inputs, names) if phoenix else (None, [])
    tracer = tracing.provider.get_tracer("retrieval_stage.cli")
    progress = Progress(
        TextColumn("reranking"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}", markup=False),  # a query id, not markup
        console=err(),
        transient=True,
        disable=not sys.stderr.isatty(),  # a bar in a log file is noise (and a blank line)
    )
    attributes = {
        **get_span_kind_attributes(OpenInferenceSpanKindValues.CHAIN),
        "retrieval_stage.queries": len(inputs.judged),
    }
    reranked: list[str] = []

    def done(qid: str) -> None:
        reranked.append(qid)
        progress.update(task, advance=1, description=qid)

    def interrupted() -> str:
        kept = "; the document embeddings stay cached" if chosen.embedder is not None else ""
        return (
            f"interrupted: reranked {len(reranked)} of {len(inputs.judged)} queries, so no "
            f"report (it needs them all){kept}"
        )

    # Errors are handled outside the span, so that it records the rerank error, not the
    # command's exit.
    try:
        with (
            while_doing(interrupted),
            progress,
            tracer.start_as_current_span("eval", attributes=attributes) as span,
        ):
            task = progress.add_task("", total=len(inputs.judged))
            report = evaluate(
                stage,
                inputs.texts,
                inputs.judgements,
                inputs.pools,
                recall_at=recall_at,
                resamples=resamples,
                progress=done,
                rerank=rerank,
            )
            mark_ok(span)
    except RerankError as exc:
        rerank_failed(chosen, exc, stage, timeout)
    except (TypeError, ValueError) as exc:  # the reranker refused its arguments
        fail(EXIT_USAGE, f"cannot rerank this input: {exc}")
    finally:
        if phoenix:
            tracing.provider.force_flush()  # Phoenix must have the spans to annotate them
    logged = _log_to_phoenix(phoenix, project, annotated, names) if phoenix else None
    return report, logged


def _annotation_names(choice: PhoenixNames) -> Mapping[str, str]:
    """The annotation name of each span kind's judgements (`cli.phoenix`)."""
    from .phoenix import BY_KIND, SHARED

    return BY_KIND if choice is PhoenixNames.by_kind else SHARED


def _phoenix_reranking(
    tracing: Tracing, stage: Any, inputs: _EvalInputs, names: Mapping[str, str]
) -> tuple[Any, list[Any]]:
    """A `rerank` for `evaluate` running each query as a `Pipeline` (RETRIEVER + RERANKER
    spans), and the list it fills with each span's judgements, named by `names`."""
    from ..pipeline import Pipeline
    from .phoenix import DocumentSpans, FixedRecall, judgements

    spans = DocumentSpans()
    tracing.provider.add_span_processor(spans)
    annotated: list[Any] = []

    def rerank(qid: str, query: str, pool: list[Candidate]) -> Any:
        spans.drain()  # anything ended before this query is not its
        pipeline = Pipeline(
            FixedRecall(pool, inputs.recall_label),
            stage,
            recall_k=max(1, len(pool)),
            tracer_provider=tracing.provider,
        )
        results = pipeline.run(query).results
        annotated.extend(
            judgements(
                spans.drain(),
                query_id=qid,
                recalled=[c.id for c in pool],
                reranked=[r.candidate.id for r in results],
                judged=inputs.judgements.get(qid, {}),
                names=names,
            )
        )
        return results

    return rerank, annotated


def _log_to_phoenix(
    url: str, project: str, annotated: list[Any], names: Mapping[str, str]
) -> dict[str, Any]:
    """Log the judgements and say so, with the names to look for; what was logged, for
    ``--json``. Exit 1 if Phoenix refuses them."""
    from .phoenix import PhoenixUnavailableError, log_judgements

    try:
        stored = log_judgements(url, annotated) if annotated else 0
    except PhoenixUnavailableError as exc:
        fail(EXIT_FAILURE, str(exc))
    spans = len({a["span_id"] for a in annotated})
    shown = sorted(set(names.values()))
    if len(shown) == 1:
        which = f"annotation {shown[0]!r} on RETRIEVER and RERANKER spans alike"
    else:
        which = ", ".join(f"{name!r} on {kind} spans" for kind, name in sorted(names.items()))
    note(
        err(),
        f"phoenix: {stored} document judgements on {spans} spans logged to {url} "
        f"(project {project!r}; {which})",
    )
    return {
        "url": url,
        "project": project,
        "annotations": stored,
        "spans": spans,
        "annotation_names": dict(names),
    }


def _print_report(report: Any, chosen: Chosen, inputs: _EvalInputs) -> None:
    console = out()
    console.print(
        Text("queries: ", style="bold") + Text(f"{report.queries} judged, from {inputs.source}")
    )
    console.print(Text("recall: ", style="bold") + Text(inputs.recall_label))
    say_reranker(console, chosen)
    console.print(metrics_table(report))
    console.print(
        Text("top-1 accuracy: ", style="bold")
        + Text(f"{report.top1_recall}/{report.queries} → {report.top1_reranked}/{report.queries}")
    )
    console.print(movement_table(report, console.width))
    note(console, f"p: {report.test}")
    if report.unjudged:
        note(console, f"{len(report.unjudged)} queries without a relevant document were skipped")
