"""How results look: the tables of what moved, the eval report, and the failure message."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..errors import RerankError
from .console import EXIT_FAILURE, fail, note
from .failure import Failure, Witness, describe
from .reranker import Chosen

__all__ = [
    "changes_table",
    "metrics_table",
    "movement_table",
    "rerank_failed",
    "say_reranker",
    "snippet",
    "why_failed",
]

SNIPPET_CHARS = 72
MAX_ID = 40
MIN_ID = 6
MIN_SNIPPET = 8
MIN_USEFUL_SNIPPET = 20
"""Below this many characters the snippet column is left out of the table."""


def snippet(text: str, width: int = SNIPPET_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1].rstrip() + "…"


def _without_id(text: str, ident: str) -> str:
    """`text` without a leading ``"<id>: "`` (the bundled corpus starts each text with its
    name): the id column already shows it."""
    head = f"{ident}:"
    return text[len(head) :].lstrip() if text.startswith(head) else text


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}" if abs(value) >= 1e4 else f"{value:.3f}"


def changes_table(
    changes: Sequence[Any], *, score_label: str, recall_label: str, width: int
) -> Table:
    """Final rank, recall rank, movement, both scores, id and a snippet, fitted to `width`."""
    rows = [
        (
            str(c.rank),
            str(c.recall_rank),
            c.movement,
            _number(c.score) if c.reranked else "—",  # a recall score is no rerank score
            _number(c.recall_score),
            c.candidate.id,
            c,
        )
        for c in changes
    ]
    headers = ("rank", "recall rank", "move", score_label, recall_label, "id")
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    # Numbers are never cut: the id and the snippet share what the number columns leave.
    left = width - sum(widths[:5]) - 3 * len(headers)  # 6 separators of " │ "
    # A snippet narrower than MIN_USEFUL_SNIPPET says nothing: leave it out, the id gets room.
    show_snippet = left - min(widths[5], MAX_ID) >= MIN_USEFUL_SNIPPET
    if show_snippet:
        widths[5] = max(MIN_ID, min(widths[5], MAX_ID, left - MIN_SNIPPET))
    else:
        widths[5] = max(MIN_ID, min(widths[5], left + 3))  # the snippet's separator too
    snippet_width = max(MIN_SNIPPET, left - widths[5])
    table = Table(show_edge=False, pad_edge=False, header_style="bold")
    for i, header in enumerate(headers):
        table.add_column(
            header,
            justify="left" if i == 5 else "center" if i == 2 else "right",
            no_wrap=True,
            overflow="ellipsis",
            width=widths[i],
            min_width=widths[i],
        )
    if show_snippet:
        table.add_column("snippet", no_wrap=True, overflow="ellipsis", width=snippet_width)
    for rank, recall_rank, movement, score, recall_score, ident, change in rows:
        style = "green" if change.is_new or change.moved > 0 else "red" if change.moved < 0 else ""
        cells = [  # Text, not str: a str cell is parsed as Rich markup
            Text(rank),
            Text(recall_rank),
            Text(movement, style=style),
            Text(score),
            Text(recall_score),
            Text(ident),
        ]
        if show_snippet:
            cells.append(Text(snippet(_without_id(change.candidate.text, ident), snippet_width)))
        table.add_row(*cells)
    return table


def say_reranker(console: Console, chosen: Chosen) -> None:
    console.print(Text("reranker: ", style="bold") + Text(chosen.label))
    if chosen.why:
        note(console, chosen.why)
    if chosen.hint:
        note(console, chosen.hint, style="yellow")


def why_failed(chosen: Chosen, exc: RerankError, stage: Any, timeout: float | None) -> Failure:
    """What happened to the call that raised `exc`, in words (see `failure.describe`)."""
    witness = getattr(stage, "reranker", None)
    elapsed = witness.last_elapsed if isinstance(witness, Witness) else None
    provider = getattr(chosen.reranker, "provider", None)
    return describe(
        exc,
        base_url=chosen.base_url,
        provider=provider if isinstance(provider, str) else None,
        timeout=timeout,
        elapsed=elapsed,
    )


def rerank_failed(
    chosen: Chosen, exc: RerankError, stage: Any = None, timeout: float | None = None
) -> NoReturn:
    """Exit 1 saying what happened (and the hint, only where it is the likely cause)."""
    failure = why_failed(chosen, exc, stage, timeout)
    details = [failure.hint] if failure.hint else []
    fail(EXIT_FAILURE, f"rerank failed: {failure.message}", *details)


def metrics_table(report: Any) -> Table:
    table = Table(show_edge=False, pad_edge=False, header_style="bold")
    for name, justify in (("metric", "left"), ("recall", "right"), ("reranked", "right"),
                          ("Δ", "right"), ("p", "right")):  # fmt: skip
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for m in report.metrics:
        style = "green" if m.delta > 0 else "red" if m.delta < 0 else ""
        table.add_row(  # Text, not str: a str cell is parsed as Rich markup
            Text(m.name),
            Text(f"{m.recall:.3f}"),
            Text(f"{m.reranked:.3f}"),
            Text(f"{m.delta:+.3f}", style=style),
            Text(f"{m.p_value:.3f}"),
        )
    return table


def movement_table(report: Any, width: int) -> Table:
    """Per query: first relevant rank before → after, movement, RR@10 before → after, text."""
    rows = []
    for q in report.per_query:
        before = "—" if q.first_relevant_recall is None else str(q.first_relevant_recall)
        after = "—" if q.first_relevant_reranked is None else str(q.first_relevant_reranked)
        rr = f"{q.recall['MRR@10']:.2f} → {q.reranked['MRR@10']:.2f}"
        rows.append((q.query_id, f"{before} → {after}", q.movement, rr, q.query))
    # Every cell is a Text: a plain str would be parsed as Rich markup, and an id like "[/x]"
    # raises mid-table.
    headers = ("query", "first relevant", "move", "RR@10")
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    text_width = max(12, width - sum(widths) - 3 * len(headers))
    table = Table(show_edge=False, pad_edge=False, header_style="bold")
    for i, header in enumerate(headers):
        table.add_column(
            header,
            justify="left" if i == 0 else "center" if i == 2 else "right",
            no_wrap=True,
            width=widths[i],
        )
    table.add_column("text", no_wrap=True, overflow="ellipsis", width=text_width)
    for query_id, ranks, move, rr, text in rows:
        good = move.startswith("↑") or move == "found"
        bad = move.startswith("↓") or move == "lost"
        style = "green" if good else "red" if bad else ""
        table.add_row(
            Text(query_id),
            Text(ranks),
            Text(move, style=style),
            Text(rr),
            Text(snippet(text, text_width)),
        )
    return table
