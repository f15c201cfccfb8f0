"""The ``retrieval-stage`` command (the ``[cli]`` extra): run recall→rerank, see what moved,
measure the lift.

This module imports nothing of the extra at import time, so that the console script installed
with the light core can say in one line how to get the command instead of a traceback. The
Typer application is ``retrieval_stage.cli.commands.app`` (loaded on first access).
"""

from __future__ import annotations

import sys
from typing import Any

from .._install import install_hint

__all__ = ["CLI_INSTALL_HINT", "app", "main"]

CLI_INSTALL_HINT = install_hint("cli")
"""How to get the command's extra, as a command that works from the clone."""
_CLI_MODULES = ("typer", "rich", "bm25s", "numpy", "ir_measures")


def _missing() -> str | None:
    """The first module of the [cli] extra that cannot be found, or None."""
    from importlib.util import find_spec

    return next((name for name in _CLI_MODULES if find_spec(name) is None), None)


def main() -> None:
    """The console script's entry point: the command, or one line saying how to install it."""
    missing = _missing()
    if missing is not None:
        sys.stderr.write(
            f"retrieval-stage: the command needs the [cli] extra ({missing} is missing): "
            f"{CLI_INSTALL_HINT}\n"
        )
        raise SystemExit(2)
    from .commands import main as run

    run()


def __getattr__(name: str) -> Any:
    """``app`` on first access: importing it imports Typer and Rich."""
    if name == "app":
        from .commands import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
