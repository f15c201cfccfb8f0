"""docker/build-images.sh's and docker/check-stack.sh's last lines say what happened, run with
a stand-in ``docker`` (and Compose) on PATH: these scripts run for real only where a Docker
engine does, and what they print at the end is what a user acts on.

The stand-ins answer as Docker and Compose would for the calls the scripts make; a loopback
HTTP server plays the reranker's ``/rerank`` and Phoenix's span API.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT_SECONDS = 120.0
IMAGES = {"APP_IMAGE": "app:t", "RERANKER_IMAGE": "reranker:t", "PHOENIX_IMAGE": "phoenix:t"}

_DOCKER = """#!PYTHON
import os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_CALLS"], "a") as calls:
    calls.write(" ".join(args) + "\\n")
if args[:1] == ["inspect"]:
    fmt, container = args[2], args[3]
    print(0 if "RestartCount" in fmt else "running" if container == "cid-app" else "healthy")
elif args[:2] == ["image", "inspect"]:
    if "-f" in args:
        print(123456789)
elif args[:1] == ["build"]:
    image = args[args.index("-t") + 1]
    print("Step 1/9 : FROM base")
    if image in os.environ.get("FAKE_FAILING", "").split(","):
        print("ERROR: pip could not install the package")
        sys.exit(1)
elif args[:1] == ["pull"]:
    sys.exit(1)
"""

_COMPOSE = """#!PYTHON
import os, sys
args, rest, i = sys.argv[1:], [], 0
while i < len(args):
    if args[i] in ("-p", "-f"):
        i += 2
        continue
    rest.append(args[i])
    i += 1
if rest[0] == "ps" and "-q" in rest:
    print("cid-" + rest[-1])
elif rest[0] == "port":
    print("127.0.0.1:" + os.environ["FAKE_HTTP_PORT"])
elif rest[0] == "logs" and os.path.exists(os.environ["FAKE_APP_LOG"]):
    print(open(os.environ["FAKE_APP_LOG"]).read(), end="")
"""


def _stand_ins(tmp_path: Path) -> dict[str, str]:
    """PATH with the stand-in ``docker`` first, and ``COMPOSE`` naming the stand-in Compose."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("docker", _DOCKER), ("compose", _COMPOSE)):
        path = bin_dir / name
        path.write_text(body.replace("PYTHON", sys.executable), encoding="utf-8")
        path.chmod(0o755)
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "COMPOSE": str(bin_dir / "compose"),
        "FAKE_CALLS": str(tmp_path / "calls"),
        "FAKE_APP_LOG": str(tmp_path / "app.log"),
    }


def _run(script: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        ["bash", str(ROOT / "docker" / script)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=SCRIPT_SECONDS,
        check=False,
    )
    return done, time.monotonic() - started


# -- build-images.sh ---------------------------------------------------------------------------


def _last_line(done: subprocess.CompletedProcess[str]) -> str:
    return done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("failing", "code", "last"),
    [
        ("", 0, r"images: all 3 images built, \d+s after the start"),
        (
            "reranker:t",
            1,
            r"images: 1 of 3 builds failed \(reranker:t\), 2 built, \d+s after the start",
        ),
        (
            "app:t,reranker:t,phoenix:t",
            1,
            r"images: no image built: all 3 builds failed \(app:t, reranker:t, phoenix:t\), "
            r"\d+s after the start",
        ),
    ],
    ids=["all-built", "one-failed", "all-failed"],
)
def test_build_images_last_line_says_which_were_built_and_which_failed(
    tmp_path: Path, failing: str, code: int, last: str
) -> None:
    env = {**_stand_ins(tmp_path), **IMAGES, "BASE_IMAGE": "base:t", "FAKE_FAILING": failing}
    done, _ = _run("build-images.sh", env)
    assert done.returncode == code, done.stderr
    assert re.fullmatch(last, _last_line(done)), done.stderr
    builds = [c for c in (tmp_path / "calls").read_text().splitlines() if c.startswith("build")]
    assert len(builds) == 3


# -- check-stack.sh ----------------------------------------------------------------------------

TRACE = "0af7651916cd43dd8448eb211c80319c"


def _span(name: str, span_id: str, parent: str | None, kind: str) -> dict[str, Any]:
    return {
        "name": name,
        "span_kind": kind,
        "parent_id": parent,
        "context": {"trace_id": TRACE, "span_id": span_id},
    }


CHAINED = [
    _span("pipeline", "01", None, "CHAIN"),
    _span("rerank", "02", "01", "RERANKER"),
    _span("POST /rerank", "03", "02", "UNKNOWN"),
    _span("rerank.batch", "04", "03", "CHAIN"),
]


@pytest.fixture
def stack_http() -> Iterator[tuple[int, dict[str, Any]]]:
    """The reranker's /rerank and Phoenix's span API on one loopback port; ``state["spans"]``
    is what Phoenix holds (nothing: it answers 404, as before a project's first span)."""
    state: dict[str, Any] = {"spans": None}

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # /rerank: the second text is the match
            self.rfile.read(int(self.headers["content-length"]))
            self._send(200, [{"index": 1, "score": 0.9}, {"index": 0, "score": 0.1}])

        def do_GET(self) -> None:
            if state["spans"] is None:
                self._send(404, {"detail": "no such project"})
            else:
                self._send(200, {"data": state["spans"]})

        def log_message(self, *_: Any) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], state
    finally:
        server.shutdown()
        server.server_close()


def _check_stack(
    tmp_path: Path, port: int, trace_seconds: int
) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**_stand_ins(tmp_path), "FAKE_HTTP_PORT": str(port), "UP_SECONDS": "5"}
    return _run("check-stack.sh", {**env, "TRACE_SECONDS": str(trace_seconds)})


def test_check_stack_stops_waiting_once_the_app_log_shows_the_fallback(
    tmp_path: Path, stack_http: tuple[int, dict[str, Any]]
) -> None:
    port, _ = stack_http
    (tmp_path / "app.log").write_text(
        "app-1  | query: serialize a Python object to a JSON string\n"
        "app-1  | fallback: the reranker failed (could not connect to http://reranker:8080; is \n"
        "app-1  | the service up?); showing recall order, unreranked\n",
        encoding="utf-8",
    )
    done, took = _check_stack(tmp_path, port, trace_seconds=40)
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.fullmatch(
        r"compose: failed: the app's reranks fell back to recall order after \d+s, so no trace "
        r"can hold the reranker's spans; its log says: fallback: the reranker failed \(could "
        r"not connect to http://reranker:8080; is",
        done.stdout.strip(),
    ), done.stdout
    assert took < 30  # not the 40 s TRACE_SECONDS allows


def test_check_stack_says_plainly_that_no_such_trace_came(
    tmp_path: Path, stack_http: tuple[int, dict[str, Any]]
) -> None:
    port, _ = stack_http
    done, _ = _check_stack(tmp_path, port, trace_seconds=2)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.strip() == (
        "compose: failed: within 2s no trace in Phoenix held the app's pipeline and rerank "
        "spans with the reranker's POST /rerank and rerank.batch spans under them"
    )


def test_check_stack_names_the_trace_it_found(
    tmp_path: Path, stack_http: tuple[int, dict[str, Any]]
) -> None:
    port, state = stack_http
    state["spans"] = CHAINED
    done, _ = _check_stack(tmp_path, port, trace_seconds=30)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == (
        f"compose: app, reranker, phoenix healthy; trace {TRACE} in Phoenix"
    )
