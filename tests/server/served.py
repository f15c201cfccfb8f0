"""A real `retrieval-stage serve` on loopback, as a user starts it, for the server tests.

`start_server` runs the command (the venv's ``retrieval-stage serve``) in its own process on
a free 127.0.0.1 port, waits until ``/health`` answers 200, and stops it with SIGTERM at the
end. Its stderr (our JSON log lines) is kept in a file; `Served.log_lines` reads it back.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "retrieval-stage"
# Measured: 10-35 s from start to a loaded MiniLM on a busy 2-core machine (imports, mostly).
STARTUP_SECONDS = 180.0
STOP_SECONDS = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Served:
    """One running server: its URL, process and log file."""

    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def log_lines(self) -> list[dict[str, Any]]:
        """Every JSON line the server wrote (anything else would fail the test that reads)."""
        return [json.loads(line) for line in self.log_text().splitlines() if line.strip()]

    def stop(self, timeout: float = STOP_SECONDS) -> int:
        """SIGTERM, then wait; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)
        return self.proc.returncode


def server_env(**extra: str) -> dict[str, str]:
    """This environment without OTLP/rerank settings, offline, importing this checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RERANK_"))}
    env.pop("RETRIEVAL_STAGE_PROJECT", None)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        }
    )
    env.update(extra)
    return env


def wait_healthy(served: Served, timeout: float = STARTUP_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if served.proc.poll() is not None:
            raise RuntimeError(
                f"the server exited with {served.proc.returncode}:\n{served.log_text()[-3000:]}"
            )
        try:
            if httpx.get(served.url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server did not become healthy within {timeout:.0f} s")


@contextmanager
def start_server(
    tmp: Path,
    *args: str,
    env: dict[str, str] | None = None,
    wait: bool = True,
    open_files: int | None = None,
) -> Iterator[Served]:
    """`retrieval-stage serve ARGS` on a free loopback port; stopped (SIGTERM) afterwards.
    `open_files` lowers the server process's open-file limit (``RLIMIT_NOFILE``)."""

    def limit_files() -> None:
        if open_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

    port = free_port()
    log_path = tmp / f"server-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(SCRIPT), "serve", "--port", str(port), *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env or server_env(),
            cwd=tmp,
            preexec_fn=limit_files if open_files is not None else None,
        )
        served = Served(f"http://127.0.0.1:{port}", proc, log_path)
        try:
            if wait:
                wait_healthy(served)
            yield served
        finally:
            served.stop()


IN_PROCESS_START_S = 30.0
"""How long an in-process app may take to answer ``/health`` (a lexical app takes well under a
second; the margin is for a busy shared machine)."""


@contextmanager
def running_in_process(app: Any, wait: float = IN_PROCESS_START_S) -> Iterator[str]:
    """`app` (`create_app`'s) on uvicorn in a thread of this process, on a free loopback
    port, healthy; its URL. Stopped (``should_exit``, thread joined) afterwards."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + wait
    try:
        while True:
            try:
                if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the in-process server did not start"
            time.sleep(0.05)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=wait)
