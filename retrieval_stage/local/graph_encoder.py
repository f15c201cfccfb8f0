"""`GraphBertEncoder`: a `BertEncoder` whose forward pass is `bert_graph`'s ONNX graph, run by
a runtime (`int8`: onnxruntime, `bf16`: OpenVINO), and what those share.

Same folder checks, tokenizer, cut and pooling as the numpy encoder; the texts run longest first
in small batches of similar length (eight: a 50-document pool pads ~3%), right-padded to a
width rounded up to the runtime's `width_step`, one batch at a time on the runtime's own
threads. The graph is built from the folder's own ``model.safetensors`` once and kept on disk
(`graph_cache`), keyed by the weights' content, the recipe and the runtime's version.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from .bert import BertEncoder, ModelSpec

__all__ = ["GraphBertEncoder", "cpu_flags", "default_graph_dir", "importable"]

_BATCH = 8
"""Texts per run: sorted by length, eight neighbours pad little, and an int8 batch's activation
scales are taken over few texts. 8 ran faster than 4 and 16 on both runtimes (measured)."""


@cache
def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags from ``/proc/cpuinfo`` (None where there is none to read)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return None


def importable(module: str) -> bool:
    """True when `module` can be imported (False for ``sys.modules[module] = None`` too)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def default_graph_dir() -> Path:
    """Where the graphs are kept: ``onnx-graphs`` in the package's cache directory (the one
    dense recall keeps its embeddings in: ``$XDG_CACHE_HOME/retrieval-stage``)."""
    from ..cache_files import default_cache_dir
    from .graph_cache import GRAPHS_DIR

    return default_cache_dir() / GRAPHS_DIR


class GraphBertEncoder(BertEncoder):
    """A `BertEncoder` whose forward pass is a graph on a runtime (see the subclasses).

    Built by `from_directory(directory, threads=..., graph_dir=...)`: `threads` is the
    runtime's threads for one batch (None: one per core); `graph_dir` where the graph is kept
    (default `default_graph_dir()`). `graph_built` says whether this load built the graph
    (False: it came from the cache, checked).
    """

    graph_built: bool = False
    width_step = 1
    """Batch widths are rounded up to a multiple of this (a runtime that compiles per shape
    keeps fewer shapes)."""

    @classmethod
    def from_directory(
        cls,
        directory: str | Path,
        *,
        threads: int | None = None,
        graph_dir: str | Path | None = None,
        quantisation: Any = None,
    ) -> GraphBertEncoder:
        """The model in `directory` with its graph. `quantisation` is
        `bert_graph.Quantisation` (private, int8 only: the tests ask for a cruder one)."""
        encoder = super().from_directory(directory)
        assert isinstance(encoder, GraphBertEncoder)
        where = Path(graph_dir) if graph_dir else default_graph_dir()
        encoder._start(threads, where, quantisation)
        # The float32 layers live in the graph now; the numpy copies are not needed.
        encoder._layers = []
        return encoder

    def _start(self, threads: int | None, graph_dir: Path, quantisation: Any) -> None:
        """Build or read the graph and start the runtime's session on it."""
        raise NotImplementedError

    def _graph(self, graph_dir: Path, recipe: str, runtime: str, build: Any) -> bytes:
        """The serialised graph for `recipe` on `runtime` (``name=version``), from the cache
        under `graph_dir` when it checks, else `build()`'s, stored there."""
        import onnx

        from . import bert_graph
        from .graph_cache import cached_graph, file_digest, graph_key

        spec: ModelSpec = self.spec
        key = graph_key(
            file_digest(spec.root / "model.safetensors", graph_dir / "digests"),
            spec.layers,
            spec.hidden,
            spec.heads,
            spec.layer_norm_eps,
            spec.normalize,
            f"graph={bert_graph.GRAPH_VERSION}",
            recipe,
            f"onnx={onnx.__version__}",
            runtime,
        )
        data, self.graph_built = cached_graph(graph_dir, key, build)
        return data

    def embed(
        self,
        texts: Sequence[str],
        *,
        role: str = "document",
        batch_size: int = 32,
        workers: int = 1,
    ) -> Any:
        """One float32 embedding per text, as `BertEncoder.embed`; `batch_size` and `workers`
        are the numpy encoder's knobs, unused (the graph runs eight texts at a time on the
        runtime's threads)."""
        import numpy as np

        out = np.zeros((len(texts), self.spec.hidden), dtype=np.float32)
        if not texts:
            return out
        encodings, order = self._tokenized(texts, role)
        for start in range(0, len(order), _BATCH):
            chosen = order[start : start + _BATCH]
            out[chosen] = self._padded([encodings[i] for i in chosen])
        return out

    def _padded(self, encodings: Sequence[Any]) -> Any:
        """One right-padded batch through the graph: its pooled, normalised embeddings."""
        import numpy as np

        lengths = [len(e.ids) for e in encodings]
        step = self.width_step
        width = -(-max(max(lengths), 1) // step) * step
        ids = np.zeros((len(encodings), width), dtype=np.int32)
        types = np.zeros_like(ids)
        mask = np.zeros_like(ids)
        for row, (encoding, n) in enumerate(zip(encodings, lengths, strict=True)):
            ids[row, :n] = encoding.ids
            types[row, :n] = encoding.type_ids
            mask[row, :n] = 1
        return self._forward(ids, types, mask)

    def _forward(self, ids: Any, types: Any, mask: Any) -> Any:
        """The graph's ``embeddings`` for one padded batch (int32 ids, type ids, mask)."""
        raise NotImplementedError
