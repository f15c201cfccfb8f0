"""The packaged MiniLM's int8 and bf16 graphs, built once per test session and shared by the
test files.

Building and quantising a graph takes a few seconds; every test that loads one points the
package's cache directory (``$XDG_CACHE_HOME``) at `cache_home()`, so the first load builds it
there and the rest read it back, through the same cache code a user's load goes through.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from ._minilm import need_numpy_backend, packaged_path

EXTRAS = {"int8": ("onnxruntime", "onnx", "onnx_ir"), "bf16": ("openvino", "onnx")}


def need(precision: str) -> None:
    """Skip, naming what is missing, where `precision` cannot be built or run here."""
    need_numpy_backend()
    for name in EXTRAS[precision]:
        pytest.importorskip(name, reason=f"the {precision} model needs {name} ([{precision}])")
    from retrieval_stage.local import bf16, int8

    missing = (int8 if precision == "int8" else bf16).unavailable()
    if missing is not None:
        pytest.skip(f"{precision} cannot run here: {missing}")


def need_int8() -> None:
    need("int8")


@functools.cache
def cache_home() -> Path:
    """A cache directory for this session (removed at exit), holding the built graphs."""
    home = Path(tempfile.mkdtemp(prefix="retrieval-stage-graph-tests-"))
    atexit.register(shutil.rmtree, home, True)
    return home


def graph_dir() -> Path:
    """Where the graph encoders keep their graphs under `cache_home()`."""
    from retrieval_stage.local.graph_cache import GRAPHS_DIR

    return cache_home() / "retrieval-stage" / GRAPHS_DIR


@functools.cache
def encoder(precision: str) -> Any:
    """The packaged model's `precision` encoder on two threads, loaded once (building it)."""
    from retrieval_stage.local.embedding import _graph_encoder

    return _graph_encoder(precision).from_directory(
        packaged_path(), threads=2, graph_dir=graph_dir()
    )


def int8_encoder() -> Any:
    return encoder("int8")
