"""``python -m retrieval_stage.server``: the same command as ``retrieval-stage serve``."""

from __future__ import annotations

import typer

from ..cli.serve import serve

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command()(serve)

if __name__ == "__main__":
    app()
