"""``python -m retrieval_stage.server``: the same command as ``retrieval-stage serve``.

The command (its options, help, messages and exit codes) is the CLI's, which builds on this
wing. This entry point, which nothing imports, stands above both: `scripts/architecture.py`
counts a ``__main__`` module as a room of its own, so the server wing itself never imports the
CLI.
"""

from __future__ import annotations

import typer

from ..cli.serve import serve


def main() -> None:
    """Run ``retrieval-stage serve`` with this process's arguments."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(serve)
    app()


if __name__ == "__main__":
    main()
