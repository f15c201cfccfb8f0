"""Where the command writes, how it fails, and what it never prints (credentials in URLs).

Exit codes: 0 done, 2 bad usage or input (nothing was reranked), 1 the reranker or the run
failed, 3 (``demo`` only) done, but the reranker failed and recall order was shown instead.
Every cell and message goes out as Rich `Text`, never markup: ids and texts are data.
"""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.text import Text

__all__ = [
    "EXIT_DEGRADED",
    "EXIT_FAILURE",
    "EXIT_USAGE",
    "err",
    "fail",
    "note",
    "out",
]

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_DEGRADED = 3
"""demo: it ran and showed results, but at least one rerank fell back to recall order."""


def out() -> Console:
    """The console for results (stdout)."""
    return Console(soft_wrap=False)


def err() -> Console:
    """The console for notes, progress and errors (stderr)."""
    return Console(stderr=True, soft_wrap=False)


def fail(code: int, message: str, *details: str) -> NoReturn:
    """Print ``error: message`` (and details) to stderr and exit with `code`; no traceback."""
    console = err()
    console.print(Text("error: ", style="bold red") + Text(message))
    for detail in details:
        console.print(Text(f"  {detail}"))
    raise typer.Exit(code)


def note(console: Console, message: str, style: str = "dim") -> None:
    """One line of commentary (which reranker ran, where spans went)."""
    console.print(Text(message, style=style))
