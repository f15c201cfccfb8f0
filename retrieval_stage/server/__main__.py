"""``python -m retrieval_stage.server``: the same command as ``retrieval-stage serve``.

The command (its options, help, messages and exit codes) is the CLI's, which builds on this
wing; so this entry point, which nothing imports, looks it up by name when it runs instead of
importing the CLI into the server wing.
"""

from __future__ import annotations

import importlib

import typer


def main() -> None:
    """Run ``retrieval-stage serve`` with this process's arguments."""
    serve = importlib.import_module("retrieval_stage.cli.serve").serve
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(serve)
    app()


if __name__ == "__main__":
    main()
