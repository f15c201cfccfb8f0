"""`Int8BertEncoder`: the numpy encoder's model as an int8 onnxruntime graph (``[int8]``).

The forward pass is `bert_graph`'s fused graph quantised to int8 (`bert_graph.quantize`),
built from the folder's own weights once and kept on disk; the batching, padding and cache are
`GraphBertEncoder`'s. onnxruntime runs it on `threads` intra-op threads that sleep when idle.

`unavailable()` says why int8 cannot run here (the ``[int8]`` extra missing, a CPU without
VNNI): the reranker then runs float32 and says so once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .graph_encoder import GraphBertEncoder, cpu_flags, importable

__all__ = ["INT8_INSTALL_HINT", "Int8BertEncoder", "unavailable"]

INT8_INSTALL_HINT = "pip install 'retrieval-stage[int8]'"

_VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
_MODULES = ("onnxruntime", "onnx", "onnx_ir")


def unavailable() -> str | None:
    """Why the int8 graph cannot run on this machine, or None when it can.

    The ``[int8]`` extra (onnxruntime, onnx, onnx-ir) must be importable, and the CPU must have
    VNNI (int8 dot products): without it onnxruntime's int8 kernels are no faster than numpy's
    float32. A machine whose flags cannot be read (not Linux) is taken as able.
    """
    missing = [m for m in _MODULES if not importable(m)]
    if missing:
        return f"{' and '.join(missing)} not installed (the [int8] extra: {INT8_INSTALL_HINT})"
    flags = cpu_flags()
    if flags is not None and not flags.intersection(_VNNI_FLAGS):
        return "this CPU has no VNNI (avx512_vnni, avx_vnni or amx_int8 in /proc/cpuinfo)"
    return None


class Int8BertEncoder(GraphBertEncoder):
    """A `BertEncoder` whose forward pass is the cached int8 graph, run by onnxruntime."""

    def _start(self, threads: int | None, graph_dir: Path, quantisation: Any) -> None:
        import onnxruntime

        from . import bert_graph

        chosen = quantisation or bert_graph.Quantisation()
        data = self._graph(
            graph_dir,
            f"int8-{chosen.tag}",
            f"onnxruntime={onnxruntime.__version__}",
            lambda: bert_graph.quantize(bert_graph.build_graph(self), chosen),
        )
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads or 0
        options.inter_op_num_threads = 1
        # Idle threads sleep rather than spin: spinning cost ~40% more CPU per rerank here, and
        # on a machine shared with other work it takes the cores the other requests need.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = onnxruntime.InferenceSession(
            data, options, providers=["CPUExecutionProvider"]
        )

    def _forward(self, ids: Any, types: Any, mask: Any) -> Any:
        feeds = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
        return self._session.run(["embeddings"], feeds)[0]
