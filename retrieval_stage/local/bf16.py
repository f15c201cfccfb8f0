"""`Bf16BertEncoder`: the numpy encoder's model run by OpenVINO in bfloat16 (``[bf16]``).

The forward pass is `bert_graph`'s fused float32 graph, built from the folder's own weights
once and kept on disk, compiled by OpenVINO with bfloat16 as its inference precision: on a
CPU with AVX512_BF16 (or AMX) the products run on the bf16 units, accumulating in float32,
LayerNorm and softmax kept in float32 by OpenVINO itself. The batching and the cache are
`GraphBertEncoder`'s; widths are rounded up to a multiple of 16, since OpenVINO prepares its
kernels per input shape (a corpus of ~190 distinct widths ran a third slower unrounded).

`unavailable()` says why bf16 cannot run here (the ``[bf16]`` extra missing, a CPU without
bf16 units): the reranker then runs float32 and says so once. (onnxruntime's CPU kernels have
no bf16 matrix products on x86, hence OpenVINO for this precision.)
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from .graph_encoder import GraphBertEncoder, cpu_flags, importable

__all__ = ["BF16_INSTALL_HINT", "Bf16BertEncoder", "unavailable"]

BF16_INSTALL_HINT = "pip install 'retrieval-stage[bf16]'"

_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def unavailable() -> str | None:
    """Why bf16 cannot run on this machine, or None when it can: the ``[bf16]`` extra
    (openvino, onnx) must be importable and the CPU must have bf16 units (without them
    OpenVINO would quietly run float32). A machine whose flags cannot be read is taken as able.
    """
    missing = [m for m in ("openvino", "onnx") if not importable(m)]
    if missing:
        return f"{' and '.join(missing)} not installed (the [bf16] extra: {BF16_INSTALL_HINT})"
    flags = cpu_flags()
    if flags is not None and not flags.intersection(_BF16_FLAGS):
        return "this CPU has no bf16 units (avx512_bf16 or amx_bf16 in /proc/cpuinfo)"
    return None


class Bf16BertEncoder(GraphBertEncoder):
    """A `BertEncoder` whose forward pass is the cached float32 graph, compiled by OpenVINO
    to run in bfloat16."""

    width_step = 16

    def _start(self, threads: int | None, graph_dir: Path, quantisation: Any) -> None:
        import openvino

        from . import bert_graph

        data = self._graph(
            graph_dir,
            "fp32",
            f"openvino={openvino.__version__}",
            lambda: bert_graph.serialised(bert_graph.build_graph(self)),
        )
        core = openvino.Core()
        config: dict[str, Any] = {
            "INFERENCE_PRECISION_HINT": "bf16",
            "PERFORMANCE_HINT": "LATENCY",  # one stream: a batch uses every thread
        }
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        self._compiled = core.compile_model(core.read_model(data), "CPU", config)
        self._output = self._compiled.output(0)
        self._request = self._compiled.create_infer_request()
        self._request_lock = threading.Lock()  # one request, its tensors reused per call

    def _forward(self, ids: Any, types: Any, mask: Any) -> Any:
        feeds = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
        with self._request_lock:
            return self._request.infer(feeds)[self._output].copy()
