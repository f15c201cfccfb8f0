"""One real Arize Phoenix per test session, for every test that reads spans back from Phoenix.

The ``arize-phoenix`` package lives in its own venv, ``.venv-phoenix`` at the repository root
(tests/phoenix/setup.sh installs it; a symlink to another checkout's works too). `phoenix`, the
session fixture (made available to every test by tests/conftest.py), starts ``phoenix serve``
from there (as soon as collection shows a test that uses it: `start_early`) on loopback with
its own SQLite working directory, telemetry and every outbound fetch off, waits for
``/healthz``, and stops it when the session ends. The suite's Phoenix tests
(tests/third_party, tests/server) and the framework tests' (tests/integrations, run from
``.venv-frameworks``) share it: each writes to its own project or filters by its own trace id.

A plain module (no pytest plugin), importable from the project's venv and from
``.venv-frameworks`` alike. A test module that needs Phoenix marks itself ``phoenix`` and skips
when it is missing::

    pytestmark = pytest.mark.phoenix
    if not PHOENIX.exists():
        pytest.skip(MISSING, allow_module_level=True)
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

__all__ = [
    "INGEST_SECONDS",
    "MISSING",
    "PHOENIX",
    "STARTUP_SECONDS",
    "PhoenixProcess",
    "phoenix",
    "phoenix_env",
    "running_phoenix",
    "start_early",
    "stop_early",
]

ROOT = Path(__file__).resolve().parents[1]
PHOENIX = ROOT / ".venv-phoenix" / "bin" / "phoenix"
MISSING = f"Phoenix is not installed at {PHOENIX}: run tests/phoenix/setup.sh"
STARTUP_SECONDS = 180.0
"""Measured ~20-30 s from start to /healthz on a 2-core machine under load (mostly imports)."""
INGEST_SECONDS = 30.0
"""Phoenix inserts spans in batches a moment after the OTLP request returned."""
STOP_SECONDS = 15.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def phoenix_env(working_dir: Path, http_port: int, grpc_port: int) -> dict[str, str]:
    """This process's environment without Phoenix or OTLP settings, plus a loopback-only
    Phoenix keeping its SQLite database in `working_dir`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PHOENIX_", "OTEL_"))}
    env.update(
        {
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(http_port),
            "PHOENIX_GRPC_PORT": str(grpc_port),
            "PHOENIX_WORKING_DIR": str(working_dir),  # SQLite at <dir>/phoenix.db
            # No FullStory/Scarf pixels, no fonts, sandbox binary or other public-internet fetches.
            "PHOENIX_TELEMETRY_ENABLED": "false",
            "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
            # Nothing the tests use, and each would reach out or do work at start-up.
            "PHOENIX_DISABLE_AGENT_ASSISTANT": "true",
            "PHOENIX_AGENTS_DISABLE_WEB_ACCESS": "true",
            "PHOENIX_AGENTS_DISABLE_GITHUB": "true",
            "PHOENIX_ENABLE_MCP_SERVER": "false",
        }
    )
    return env


def _wait_ready(url: str, exited: Callable[[], str | None]) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        reason = exited()
        if reason is not None:
            raise RuntimeError(f"Phoenix exited before answering at {url}:\n{reason}")
        try:
            if httpx.get(url + "/healthz", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"Phoenix at {url} did not answer within {STARTUP_SECONDS:.0f}s")


class PhoenixProcess:
    """One ``phoenix serve`` on loopback with its own working directory: started when made,
    answering once `ready` returns, gone after `stop` (which is safe to call twice)."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="phoenix-test-")
        tmp = Path(self._tmp.name)
        self._log_path = tmp / "phoenix.log"
        http_port, grpc_port = _free_port(), _free_port()
        self.url = f"http://127.0.0.1:{http_port}"
        self._log = self._log_path.open("wb")
        self._proc = subprocess.Popen(
            [str(PHOENIX), "serve"],
            env=phoenix_env(tmp, http_port, grpc_port),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=tmp,
        )

    def _exited(self) -> str | None:
        if self._proc.poll() is None:
            return None
        tail = self._log_path.read_text(errors="replace")[-3000:]
        return f"exit code {self._proc.returncode}; log tail:\n{tail}"

    def ready(self) -> str:
        """The base URL, once Phoenix answers ``/healthz``; RuntimeError with the tail of its
        log when it exits or does not answer within `STARTUP_SECONDS` of this call."""
        _wait_ready(self.url, self._exited)
        return self.url

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=STOP_SECONDS)
        self._log.close()
        self._tmp.cleanup()


@contextmanager
def running_phoenix() -> Iterator[str]:
    """A Phoenix started for the ``with`` block; its base URL (``http://127.0.0.1:PORT``).

    RuntimeError, with the tail of Phoenix's log, when it exits or does not answer in time.
    """
    process = PhoenixProcess()
    try:
        yield process.ready()
    finally:
        process.stop()


_early: list[PhoenixProcess] = []
"""The session's Phoenix when `start_early` started it (at most one)."""


def start_early(items: Sequence[pytest.Item]) -> None:
    """Start the session's Phoenix as soon as collection shows a test that will use it.

    Phoenix takes 20-30 s to answer (mostly its imports, in its own process), and its first
    test comes late in the run: started here, that time passes while the tests before it run
    instead of being waited for (tests/conftest.py calls this once collection is final).
    """
    if _early or not PHOENIX.exists():
        return
    if any("phoenix" in getattr(item, "fixturenames", ()) for item in items):
        _early.append(PhoenixProcess())


def stop_early() -> None:
    """Stop a Phoenix `start_early` started (no test may have used it: all were skipped)."""
    while _early:
        _early.pop().stop()


@pytest.fixture(scope="session")
def phoenix() -> Iterator[str]:
    """Base URL of the session's Phoenix: the one `start_early` started, else one started on
    first use; stopped at the end."""
    if not PHOENIX.exists():
        pytest.skip(MISSING)
    process = _early.pop() if _early else PhoenixProcess()
    try:
        yield process.ready()
    finally:
        process.stop()
