"""Where the command writes, how it fails, and what it never prints (credentials in URLs).

Exit codes: 0 done, 2 bad usage or input (nothing was reranked), 1 the reranker or the run
failed, 3 (``demo`` only) done, but the reranker failed and recall order was shown instead.
Every cell and message goes out as Rich `Text`, never markup: ids and texts are data.
"""

from __future__ import annotations

from typing import NoReturn
from urllib.parse import urlsplit

import typer
from rich.console import Console
from rich.text import Text

__all__ = [
    "COMPOSE_HINT",
    "COMPOSE_UP",
    "EXIT_DEGRADED",
    "EXIT_FAILURE",
    "EXIT_USAGE",
    "err",
    "fail",
    "note",
    "out",
    "scrubbed",
    "shown_url",
]

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_DEGRADED = 3
"""demo: it ran and showed results, but at least one rerank fell back to recall order."""
COMPOSE_UP = "docker compose -f docker/compose.yaml up tei"
COMPOSE_HINT = (
    f"start TEI from the compose stack ({COMPOSE_UP}) and pass --endpoint http://localhost:8080"
)


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


def shown_url(url: str) -> str:
    """`url` as the command prints it: ``user:password@`` masked, query and fragment dropped.

    An endpoint may carry a credential in either place (``?key=...`` for some gateways); what
    is printed lands in terminals, CI logs and bug reports.
    """
    from ..otlp import shown_endpoint

    return shown_endpoint(url)


def scrubbed(message: str, url: str | None) -> str:
    """`message` with `url`'s password, query string and fragment replaced by ``***``.

    Error messages can quote the URL (a client's own check, a service echoing the request).
    """
    if not url:
        return message
    parts = urlsplit(url)
    # A token may stand alone as the username (https://TOKEN@host).
    secrets = [url, str(parts.password or parts.username or ""), parts.query, parts.fragment]
    message = message.replace(url, shown_url(url))
    for secret in sorted(secrets[1:], key=len, reverse=True):
        if len(secret) >= 3:  # a one- or two-character "secret" would mangle the message
            message = message.replace(secret, "***")
    return message
