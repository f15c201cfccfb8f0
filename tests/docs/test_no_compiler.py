"""What docs/install.md says happens where no C compiler is found is what pip does: the
install succeeds, pip says nothing of the extension at its default verbosity, and the build's
own line for it (quoted by the page) shows under ``pip install -v``.

The package is built from a copy of this tree with ``CC=/bin/false`` (a compiler that always
fails), without build isolation or an index, so nothing is downloaded.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from .examples import ROOT

PAGE = ROOT / "docs" / "install.md"
PIP_SECONDS = 300.0


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def without_a_compiler(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, str]:
    """pip's output (stdout and stderr) installing a copy of this tree where the compiler
    fails, at the default verbosity (False) and with -v (True)."""
    pytest.importorskip("setuptools", reason="the build backend, for a build without isolation")
    tree = tmp_path_factory.mktemp("tree")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, tree / name)
    shutil.copytree(
        ROOT / "retrieval_stage",
        tree / "retrieval_stage",
        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"),
    )
    said: dict[bool, str] = {}
    for verbose in (False, True):
        target = tmp_path_factory.mktemp("target")
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", *(["-v"] if verbose else []), "--no-deps",
             "--no-build-isolation", "--no-index", "--target", str(target), str(tree)],
            capture_output=True, text=True, timeout=PIP_SECONDS, check=False,
            env={**os.environ, "CC": "/bin/false", "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert not list(target.glob("retrieval_stage/_speedups*.so"))  # it was not built
        said[verbose] = done.stdout + done.stderr
    return said


def test_the_install_succeeds_and_pip_says_nothing_of_the_compiler(
    without_a_compiler: dict[bool, str],
) -> None:
    quiet = without_a_compiler[False]
    assert not re.search(r"_speedups|/bin/false|\berror\b|\bfailed\b", quiet, re.I), quiet
    assert "Successfully installed retrieval-stage" in quiet


def test_install_md_says_so_and_quotes_what_pip_v_shows(
    without_a_compiler: dict[bool, str],
) -> None:
    page = _flat(PAGE.read_text(encoding="utf-8"))
    assert "pip prints the compiler's error" not in page
    assert "pip says nothing about it" in page
    quoted = re.search(r"`pip install -v`: `([^`]+)`", page)
    assert quoted, "docs/install.md quotes no line of pip -v's output"
    assert quoted[1] in without_a_compiler[True]
