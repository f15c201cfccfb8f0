"""``make phoenix``, the Phoenix-without-Docker recipe, serves the tested Phoenix on loopback.

The recipe the docs give (docs/install.md, docs/quality.md) installs Phoenix with the script the
tests use, so its version is the tested one; the docs must name that version, and the server
must bind to loopback by default (Phoenix has no login). ``make -n`` shows the commands without
running them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from .examples import ROOT

_VERSION = re.compile(r"(?<![\d.])\d+\.\d+\.\d+(?![\d.])")
"""A three-part version standing alone (not part of an address such as 127.0.0.1)."""


def _tested_version() -> str:
    script = (ROOT / "tests" / "phoenix" / "setup.sh").read_text(encoding="utf-8")
    match = re.search(r'^PHOENIX_VERSION="([^"]+)"$', script, flags=re.MULTILINE)
    assert match, "tests/phoenix/setup.sh pins no PHOENIX_VERSION"
    return match[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make on PATH")
def test_make_phoenix_installs_with_the_tests_script_and_serves_on_loopback() -> None:
    done = subprocess.run(
        ["make", "-n", "phoenix"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "bash tests/phoenix/setup.sh" in done.stdout
    assert "PHOENIX_HOST=127.0.0.1" in done.stdout
    assert ".venv-phoenix/bin/phoenix serve" in done.stdout


@pytest.mark.parametrize("page", ["docs/install.md", "docs/quality.md"])
def test_the_docs_name_the_tested_phoenix_for_make_phoenix(page: str) -> None:
    text = (ROOT / page).read_text(encoding="utf-8")
    assert "make phoenix" in text
    phoenix_lines = [line for line in text.splitlines() if "Phoenix" in line]
    named = {v for line in phoenix_lines for v in _VERSION.findall(line)}
    assert named == {_tested_version()}, f"{page} names Phoenix {named}"


# -- quiet until Phoenix answers (scripts/serve_quietly.sh) ----------------------------------

SCRIPT = ROOT / "scripts" / "serve_quietly.sh"
ANSWER_DEADLINE_S = 60.0
"""How long the stand-in server may take to answer on a loaded machine (it needs ~1 s)."""
NOISE = 3050
"""Lines the stand-in prints before it answers, as Phoenix's SQLAlchemy INFO lines do."""

_STAND_IN = """
import http.server, os, sys, time
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
for n in range(NOISE):
    print(f"INFO sqlalchemy.engine.Engine SELECT {n}", file=sys.stderr if n % 2 else sys.stdout)
sys.stdout.flush()
if sys.argv[2] == "fail":
    sys.exit(3)
time.sleep(0.5)
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *args):
        print("GET", *args, file=sys.stderr)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[3])), Ok).serve_forever()
""".replace("NOISE", str(NOISE))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], Path, Path, int]:
    import sys

    stand_in = tmp_path / "stand_in.py"
    stand_in.write_text(_STAND_IN, encoding="utf-8")
    log, pid_file, port = tmp_path / "logs" / "phoenix.log", tmp_path / "pid", _free_port()
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), "Phoenix", str(log), f"http://127.0.0.1:{port}", sys.executable,
         str(stand_in), str(pid_file), mode, str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHON": sys.executable, "NOTE": "OTLP/HTTP at /v1/traces"},
    )  # fmt: skip
    return proc, log, pid_file, port


def test_make_phoenix_serves_through_the_quiet_script_with_its_log_named() -> None:
    done = subprocess.run(
        ["make", "-n", "phoenix"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "scripts/serve_quietly.sh Phoenix .venv-phoenix/phoenix.log" in " ".join(
        done.stdout.replace("\\\n", " ").split()
    )


def test_the_server_is_quiet_until_it_answers_then_one_line_names_it_and_its_log(
    tmp_path: Path,
) -> None:
    import signal

    proc, log, pid_file, port = _start(tmp_path, "serve")
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first == f"Phoenix: starting (its log: {log})\n"
    deadline = threading.Timer(ANSWER_DEADLINE_S, proc.kill)
    deadline.start()
    try:
        up = proc.stdout.readline()
    finally:
        deadline.cancel()
    assert re.fullmatch(
        rf"Phoenix is up on http://127\.0\.0\.1:{port} after \d+s \(OTLP/HTTP at /v1/traces; "
        rf"its log: {re.escape(str(log))}\); Ctrl-C stops it\.\n",
        up,
    ), up
    assert len(log.read_text(encoding="utf-8").splitlines()) >= NOISE  # kept, not shown
    server = int(pid_file.read_text(encoding="utf-8"))

    proc.send_signal(signal.SIGINT)  # Ctrl-C: the server stops too
    out, err = proc.communicate(timeout=ANSWER_DEADLINE_S)
    assert proc.returncode == 130
    assert out == f"Phoenix: stopped (its log: {log})\n"
    assert err == ""
    assert _gone(server)


def _gone(pid: int) -> bool:
    """Whether process `pid` ends within a few seconds (its parent reaps it at once)."""
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_a_server_that_exits_before_answering_shows_the_end_of_its_log(tmp_path: Path) -> None:
    proc, log, _, port = _start(tmp_path, "fail")
    out, err = proc.communicate(timeout=ANSWER_DEADLINE_S)
    assert proc.returncode == 3
    assert out == f"Phoenix: starting (its log: {log})\n"
    lines = err.splitlines()
    assert lines[0] == (
        f"Phoenix: exited with status 3 before answering at http://127.0.0.1:{port}; "
        f"the last lines of {log}:"
    )
    assert len(lines) == 21  # the last 20 lines of the log, not its thousands
