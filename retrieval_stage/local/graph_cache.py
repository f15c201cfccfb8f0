"""The model's ONNX graphs on disk: built once per model, runtime and recipe, checked before
each use.

Building and quantising the packaged MiniLM's graph takes a few seconds; loading it from disk
milliseconds. `cached_graph` keeps it under ``<cache dir>/onnx-graphs/`` (the cache directory
dense recall uses: ``$XDG_CACHE_HOME/retrieval-stage``), named by a key of everything the
bytes depend on: the SHA-256 of ``model.safetensors`` (its content, not its path: two installs
of one model share a file, a model changed in place gets a new one), the numbers of the model's
configuration the graph is built from, `GRAPH_VERSION` and the recipe (int8's quantisation,
or float32 for bf16), and the onnx and runtime (onnxruntime, OpenVINO) versions. Beside each
graph is its own SHA-256; a file whose checksum does not match (truncated, corrupt, written by
something else) is built again, never loaded.

The weights' digest is remembered by path, inode, size and times (``digests/``:
`retrieval_stage.cache_files.file_digest`, the one dense recall keys its embeddings by), so a
load hashes the 91 MB of weights only when they changed.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from pathlib import Path

from ..cache_files import file_digest, write_atomically

__all__ = ["GRAPHS_DIR", "cached_graph", "file_digest", "graph_key"]

GRAPHS_DIR = "onnx-graphs"
"""The subdirectory of the cache directory that holds the graphs."""


def graph_key(weights_digest: str, *parts: object) -> str:
    """The cache file's name: the weights' digest and every other input of the build."""
    text = "\x00".join([weights_digest, *map(str, parts)])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def cached_graph(directory: Path, key: str, build: Callable[[], bytes]) -> tuple[bytes, bool]:
    """The graph stored as `key` under `directory` when its checksum holds, else `build()`'s,
    stored there for next time; and whether it was built now. A cache that cannot be written
    (read-only home) costs a build per load, never a failure."""
    path = directory / f"{key}.onnx"
    checksum = directory / f"{key}.sha256"
    try:
        data = path.read_bytes()
        expected = checksum.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        pass
    else:
        if hashlib.sha256(data).hexdigest() == expected:
            return data, False
    data = build()
    with contextlib.suppress(OSError):
        write_atomically(path, data)
        write_atomically(checksum, hashlib.sha256(data).hexdigest().encode("ascii"))
    return data, True
