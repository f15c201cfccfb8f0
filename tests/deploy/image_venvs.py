"""The compose images' install steps run in plain virtualenvs, for
`tests/deploy/test_image_installs.py`.

Both Dockerfiles run ``docker/install.sh`` on exactly the files they COPY; so does `install`,
with this machine's pip settings. The virtualenvs are kept in ``.venv-images/`` and reused while
the install steps, the Dockerfile and pyproject.toml are unchanged (then the dependencies are
already there and only this checkout's package is installed again: seconds, not minutes); any
change to those makes a fresh virtualenv, so a package the steps no longer install is gone.

``python -m tests.deploy.image_venvs`` makes both ahead of the tests (.ci/run does, in the
background); the tests then wait for it on the same lock and find the work done.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
CACHE = ROOT / ".venv-images"
INSTALL_SECONDS = 900.0  # a first install from an index, on a busy 2-core machine


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


IMAGES = {"app": DOCKER / "Dockerfile", "reranker": DOCKER / "Dockerfile.server"}
"""Each virtualenv's name, and the Dockerfile whose install steps make it."""


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="image-venvs-") as tmp:
        for name, dockerfile in IMAGES.items():
            (Path(tmp) / name).mkdir()
            install(name, dockerfile, Path(tmp) / name)
            print(f"image venvs: {name} ready in {CACHE / name}")
