"""Ctrl-C and SIGTERM, handled once for every command: one line saying what was done and what
is kept, the spans flushed as at any exit (`cli.session`), and the shell's exit code for the
signal (130 for SIGINT, 143 for SIGTERM).

SIGTERM is turned into `Terminated`, a `KeyboardInterrupt`, so the code that cleans up after
Ctrl-C (context managers, the clients' abort of their other threads) does the same for it.
The layer that knows what it was doing says so with `while_doing`; the innermost one speaks.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import typer

from .console import err, note

__all__ = [
    "EXIT_SIGINT",
    "EXIT_SIGTERM",
    "Terminated",
    "exit_code",
    "handled",
    "say",
    "while_doing",
]

EXIT_SIGINT = 128 + signal.SIGINT
"""130: what a shell reports for a command Ctrl-C stopped."""
EXIT_SIGTERM = 128 + signal.SIGTERM
"""143: what a shell reports for a command SIGTERM stopped."""

NOTHING_DONE = "interrupted before anything was done"

_WHAT = "_retrieval_stage_interrupted"
"""The attribute of the interrupt holding the line to say (set by the innermost layer)."""
_SAID = "_retrieval_stage_said"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread where Ctrl-C would raise `KeyboardInterrupt`."""


def _terminated(_number: int, _frame: FrameType | None) -> None:
    raise Terminated


def exit_code(exc: KeyboardInterrupt) -> int:
    """The exit code for the signal that raised `exc`: 143 for SIGTERM, else 130."""
    return EXIT_SIGTERM if isinstance(exc, Terminated) else EXIT_SIGINT


@contextmanager
def while_doing(describe: Callable[[], str]) -> Iterator[None]:
    """Inside, an interrupt is reported with ``describe()``: what was done and what is kept
    (``interrupted: embedded 320 of 1,538 documents; ...``), unless a layer inside said it."""
    try:
        yield
    except KeyboardInterrupt as exc:
        if getattr(exc, _WHAT, None) is None:
            setattr(exc, _WHAT, describe())
        raise


def say(exc: KeyboardInterrupt) -> None:
    """Print the interrupt's line on stderr, once (the session says it before the ``spans:``
    line; the command's handler, for an interrupt outside a session). A second Ctrl-C while
    the first one's spans are flushed says nothing more."""
    seen: BaseException | None = exc
    while seen is not None:
        if getattr(seen, _SAID, False):
            return
        seen = seen.__context__
    setattr(exc, _SAID, True)
    note(err(), str(getattr(exc, _WHAT, None) or NOTHING_DONE), "yellow")


@contextmanager
def handled() -> Iterator[None]:
    """Run a command with SIGTERM raising `Terminated`; an interrupt ends it with its line and
    exit code 130 or 143 instead of a traceback. The previous SIGTERM handler is put back
    after (a test runner invoking the command keeps its own)."""
    previous: Any = None
    main = threading.current_thread() is threading.main_thread()
    if main:
        previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    except KeyboardInterrupt as exc:
        say(exc)
        raise typer.Exit(exit_code(exc)) from None
    finally:
        if main:  # None: a handler not set from Python, which cannot be put back
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
