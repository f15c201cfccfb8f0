"""One real Arize Phoenix per test session, for every test that reads spans back from Phoenix.

The ``arize-phoenix`` package lives in its own venv, ``.venv-phoenix`` at the repository root
(tests/phoenix/setup.sh installs it; a symlink to another checkout's works too). `phoenix`, the
session fixture (made available to every test by tests/conftest.py), starts ``phoenix serve``
from there on loopback with its own SQLite working directory, telemetry and every outbound
fetch off, waits for ``/healthz``, and stops it when the session ends. The suite's Phoenix tests
(tests/servers, tests/server) and the framework tests' (tests/integrations, run from
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

__all__ = [
    "INGEST_SECONDS",
    "MISSING",
    "PHOENIX",
    "STARTUP_SECONDS",
    "phoenix",
    "phoenix_env",
    "running_phoenix",
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


@contextmanager
def running_phoenix() -> Iterator[str]:
    """A Phoenix started for the ``with`` block; its base URL (``http://127.0.0.1:PORT``).

    RuntimeError, with the tail of Phoenix's log, when it exits or does not answer in time.
    """
    with tempfile.TemporaryDirectory(prefix="phoenix-test-") as tmp:
        log_path = Path(tmp) / "phoenix.log"
        http_port, grpc_port = _free_port(), _free_port()
        url = f"http://127.0.0.1:{http_port}"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [str(PHOENIX), "serve"],
                env=phoenix_env(Path(tmp), http_port, grpc_port),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=tmp,
            )

            def exited() -> str | None:
                if proc.poll() is None:
                    return None
                tail = log_path.read_text(errors="replace")[-3000:]
                return f"exit code {proc.returncode}; log tail:\n{tail}"

            try:
                _wait_ready(url, exited)
                yield url
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=STOP_SECONDS)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=STOP_SECONDS)


@pytest.fixture(scope="session")
def phoenix() -> Iterator[str]:
    """Base URL of the session's Phoenix, started on first use and stopped at the end."""
    if not PHOENIX.exists():
        pytest.skip(MISSING)
    with running_phoenix() as url:
        yield url
