"""The application: ``demo`` and ``rerank`` here, ``eval`` (`cli.eval`) and ``serve``
(`cli.serve`) registered here, and the console script's `main`.

``demo`` recalls from the bundled standard-library corpus and reranks, ``rerank`` reorders
candidates given as JSON lines, ``eval`` compares recall with reranked on judged queries. Each
command says which reranker ran and where its spans went. Exit codes: 0 done, 2 bad usage or
input (nothing was reranked), 1 the reranker or the run failed, 3 (demo) the reranker failed
and recall order was shown.

This is an application, so unlike the library it configures logging and tracing, and prints.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import suppress
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from .._version import __version__
from ..errors import RerankError
from .console import EXIT_DEGRADED, EXIT_FAILURE, EXIT_USAGE, err, fail, note, out
from .eval import EvalCommand, eval_
from .failure import Witness, backoff_s
from .help import MAX_WIDTH, HelpCommand
from .inputs import check_text, read_candidates
from .interrupt import while_doing
from .options import (
    Command,
    Group,
    OutputFormat,
    RecallChoice,
    RerankOptions,
    with_rerank_options,
)
from .render import (
    changes_table,
    rerank_failed,
    say_reranker,
    why_failed,
)
from .reranker import Chosen
from .serve import serve
from .session import session
from .tiers import say_tiers

__all__ = ["app", "main"]

DEFAULT_QUERY = "serialize a Python object to a JSON string"

app = typer.Typer(
    name="retrieval-stage",
    help="Run recall→rerank, see what the reranker moved, and measure the lift.",
    cls=Group,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,  # never dump locals (an API key may be among them)
    rich_markup_mode=None,  # plain Click help: wraps to the terminal, reads the same in a pipe
    context_settings={"max_content_width": MAX_WIDTH},
)


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"retrieval-stage {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """Run recall→rerank, see what the reranker moved, and measure the lift."""


@app.command(cls=Command)
@with_rerank_options
def demo(
    options: RerankOptions,
    query: Annotated[
        str, typer.Argument(help="What to search the bundled corpus for.")
    ] = DEFAULT_QUERY,
    top_k: Annotated[
        int, typer.Option("--top-k", min=0, help="Results to show (0: every candidate).")
    ] = 10,
    recall_k: Annotated[
        int, typer.Option("--recall-k", min=1, help="Candidates recall hands to the reranker.")
    ] = 50,
    corpus: Annotated[
        Path | None,
        typer.Option(
            "--corpus",
            help="Search this corpus instead: JSON lines {id, text, metadata?}.",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    repeat: Annotated[
        int,
        typer.Option(
            "--repeat",
            min=1,
            help="Run this many pipelines (the query, then the bundled example queries in "
            "turn), e.g. to keep traffic flowing into the compose stack's dashboards.",
        ),
    ] = 1,
    interval: Annotated[
        float, typer.Option("--interval", min=0.0, help="Seconds to wait between repeats.")
    ] = 1.0,
    recall: Annotated[
        RecallChoice,
        typer.Option(
            "--recall",
            help="bm25: words; dense: cosine of embeddings (the embedding model, document "
            "embeddings cached on disk after the first run); hybrid: both, fused by "
            "reciprocal rank.",
        ),
    ] = RecallChoice.bm25,
) -> None:
    """Recall from the bundled corpus of Python docstrings, rerank, and show what moved.

    Runs with no server and no network: recall over ~1,500 standard-library docstrings (BM25,
    dense or hybrid), then the service at --endpoint, or in process a cross-encoder on disk,
    the packaged embedding model (the [local] extra) or the lexical fallback.
    """
    if not query.strip():
        fail(EXIT_USAGE, "the query must not be empty")
    check_text(query, "the query")
    from ..evaluation.corpus import load_corpus
    from ..pipeline import Pipeline
    from .model_load import LOAD_SPAN
    from .recall import make_recall

    documents = load_corpus() if corpus is None else read_candidates(str(corpus), "--corpus")
    if not documents:
        fail(EXIT_USAGE, f"--corpus {corpus}: no documents")
    where = "Python standard-library docstrings" if corpus is None else str(corpus)
    console = out()
    # The model loads when it is chosen, before the pipeline, under a span of its own: the
    # rerank span times the rerank alone, and the trace still shows the load.
    with session(options, trace_model_load=True) as (chosen, tracing):
        # Fallback, as the library's default: a failing reranker shows recall order, marked.
        stage = tracing.stage(chosen, top_k or None, on_error="fallback")
        recaller = make_recall(recall, documents, chosen)
        pipeline = Pipeline(
            recaller.recaller, stage, recall_k=recall_k, tracer_provider=tracing.provider
        )
        try:
            with while_doing(lambda: "interrupted before the first run ended: nothing shown"):
                result = pipeline.run(query)
        except (TypeError, ValueError) as exc:  # the reranker refused its arguments
            fail(EXIT_USAGE, f"cannot rerank this input: {exc}")
        console.print(Text("query: ", style="bold") + Text(query))
        console.print(
            Text("recall: ", style="bold")
            + Text(
                f"{recaller.label} over {len(documents):,} {where}: "
                f"{len(result.recalled)} candidates"
            )
        )
        say_reranker(console, chosen)
        if chosen.load_s is not None:
            note(
                console,
                f"model loaded in {chosen.load_s:.2f} s before the rerank (span {LOAD_SPAN}), "
                "not timed as the rerank",
            )
        say_tiers(console, chosen, tracing.tally.chain_calls)  # the pipeline's RERANKER span
        failures = 0
        if result.fell_back:
            failures += 1
            _say_fallback(console, chosen, stage, options.timeout)
        if not result.results:
            note(console, "no document shares a word with the query: nothing to rerank")
        else:
            console.print(
                changes_table(
                    result.changes,
                    score_label="score",
                    recall_label=recaller.score_label,
                    width=console.width,
                )
            )
        if repeat > 1:
            failures += _repeat(
                pipeline, chosen, stage, query, repeat - 1, interval, options, failures
            )
            note(
                err(),
                f"{repeat:,} runs, {failures:,} fell back to recall order",
                "yellow" if failures else "dim",
            )
        if failures:
            raise typer.Exit(EXIT_DEGRADED)


def _say_fallback(console: Any, chosen: Chosen, stage: Any, timeout: float) -> None:
    """The line above a fallback table: recall order is shown, and why."""
    witness = stage.reranker
    exc = witness.last_error if isinstance(witness, Witness) else None
    why = (
        str(why_failed(chosen, exc, stage, timeout))
        if exc is not None
        else "its answer did not fit the candidates"
    )
    console.print(
        Text("fallback: ", style="bold yellow")
        + Text(f"the reranker failed ({why}); showing recall order, unreranked", style="yellow")
    )


def _repeat(
    pipeline: Any,
    chosen: Chosen,
    stage: Any,
    query: str,
    runs: int,
    interval: float,
    options: RerankOptions,
    failed_before: int = 0,
) -> int:
    """Run `runs` more pipelines, cycling through the example queries, one line each; keep
    going through failures, backing off (`failure.backoff_s`). Returns how many fell back.
    Interrupted, the line counts the runs done and those that fell back (with the first run's
    `failed_before`)."""
    import itertools
    import time

    from ..evaluation import read_queries
    from ..evaluation.corpus import data_path

    queries = [*read_queries(data_path("example/queries.tsv")).values(), query]
    stderr = err()
    failures = in_a_row = 0
    finished = 1  # the first run, before these

    def interrupted() -> str:
        return (
            f"interrupted after {finished:,} of {runs + 1:,} runs; "
            f"{failures + failed_before:,} fell back to recall order"
        )

    with while_doing(interrupted):
        for n, text in enumerate(itertools.islice(itertools.cycle(queries), runs)):
            time.sleep(backoff_s(in_a_row, interval))
            result = pipeline.run(text)
            finished += 1
            if result.fell_back:
                failures += 1
                in_a_row += 1
                witness = stage.reranker
                exc = witness.last_error if isinstance(witness, Witness) else None
                why = why_failed(chosen, exc, stage, options.timeout) if exc else "unfit answer"
                note(stderr, f"run {n + 2}: fell back to recall order ({why})", "yellow")
                continue
            in_a_row = 0
            moved = sum(1 for change in result.changes if change.moved)
            note(stderr, f"run {n + 2}: {text!r}: {len(result.results)} results, {moved} moved")
    return failures


@app.command(cls=Command)
@with_rerank_options
def rerank(
    options: RerankOptions,
    query: Annotated[str, typer.Option("--query", "-q", help="The query to rank against.")],
    input_: Annotated[
        str,
        typer.Option(
            "--input",
            "-i",
            help='Candidates as JSON lines {"id", "text", "score"?, "metadata"?}: a file, '
            "or - for stdin.",
        ),
    ] = "-",
    top_k: Annotated[
        int | None,
        typer.Option(
            "--top-k", min=0, help="Keep the best K (0 or unset: all).", show_default=False
        ),
    ] = None,
    output_format: Annotated[
        OutputFormat,
        typer.Option(
            "--format",
            help='jsonl: {"id", "score", "recall_score", "rank", "recall_rank"} per line, best '
            "first; table: for people.",
        ),
    ] = OutputFormat.jsonl,
) -> None:
    """Rerank candidates given as JSON lines; print them best first.

    Every input line is checked first: a bad line is reported with its number, exit code 2,
    and nothing is written to stdout. Ranks are 1-based; recall_rank orders the input by its
    "score" (best first, unscored last, ties in input order).
    """
    if not query.strip():
        fail(EXIT_USAGE, "--query must not be empty")
    check_text(query, "--query")
    candidates = read_candidates(input_, "--input")
    stderr = err()
    if not candidates:
        note(stderr, "no candidates on the input: nothing to rerank")
        return
    from ..models import recall_order
    from ..pipeline import compare_ranks

    # Recall order in: rerankers keep tied scores in input order, and ties must mean "no
    # change" against recall_rank, not a move back to the order of the lines.
    candidates = [candidates[i] for i in recall_order(candidates)]
    with session(options) as (chosen, tracing):
        stage = tracing.stage(chosen, top_k or None)
        try:
            with while_doing(lambda: "interrupted: nothing reranked, nothing written"):
                outputs = stage.run(query, candidates)
        except RerankError as exc:
            rerank_failed(chosen, exc, stage, options.timeout)
        except (TypeError, ValueError) as exc:  # the reranker refused its arguments
            fail(EXIT_USAGE, f"cannot rerank this input: {exc}")
        changes = compare_ranks(candidates, outputs)
        if output_format is OutputFormat.table:
            console = out()
            console.print(
                changes_table(
                    changes, score_label="score", recall_label="recall score", width=console.width
                )
            )
        else:
            lines = [
                json.dumps(
                    {
                        "id": c.candidate.id,
                        "score": c.score,
                        "recall_score": c.recall_score,
                        "rank": c.rank,
                        "recall_rank": c.recall_rank,
                    },
                    ensure_ascii=False,
                )
                + "\n"
                for c in changes
            ]
            sys.stdout.write("".join(lines))
            sys.stdout.flush()
        stderr.print(
            Text(f"reranked {len(candidates)} candidates with ", style="dim")
            + Text(chosen.label, style="dim")
        )
        say_tiers(stderr, chosen, tracing.tally.chain_calls)
        if chosen.hint:
            note(stderr, chosen.hint, style="yellow")


# Is reranking better than recall? The command and its machinery are in cli/eval.py.
app.command("eval", cls=EvalCommand)(eval_)


# The rerank server (retrieval_stage.server, the [server] extra), defined in cli/serve.py.
# Its own options only (no shared reranker/telemetry set behind --help-all): --reranker,
# --model, --project and --log-level are serve's, and --help shows them.
app.command("serve", cls=HelpCommand)(serve)


def main() -> None:
    """Run the application; a reader that leaves the pipe early is not an error to report."""
    try:
        app()
    except BrokenPipeError:  # `retrieval-stage rerank ... | head`: the reader left
        with suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        raise SystemExit(EXIT_FAILURE) from None
