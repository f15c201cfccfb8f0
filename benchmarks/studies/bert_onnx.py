"""The same BERT encoder as an onnxruntime graph, built from the model's own weights (benchmark).

Measured against the numpy backend and sentence-transformers by
`benchmarks.studies.embedding_backends`; the library ships the numpy one (see docs/benchmarks.md
for why).

`OnnxBertEncoder` is a `BertEncoder` (same folder checks, tokenizer, length batching, pooling
and normalisation) whose forward pass is one ONNX graph, written here with the ``onnx``
package's helpers from the ``model.safetensors`` tensors and run by onnxruntime on the CPU.
No ONNX file is read or downloaded: the graph is built in memory at load.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from retrieval_stage.local.bert import BertEncoder, ModelSpec

__all__ = ["OnnxBertEncoder", "build_graph"]

_OPSET = 17  # LayerNormalization


def build_graph(encoder: BertEncoder) -> bytes:
    """The serialised ONNX model of `encoder`'s forward pass: (input_ids, token_type_ids,
    position_ids, attention_mask) → pooled, normalised embeddings."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    spec: ModelSpec = encoder.spec
    hidden, heads = spec.hidden, spec.heads
    size = hidden // heads
    nodes: list[Any] = []
    inits: list[Any] = []

    def const(name: str, value: Any) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(op: str, inputs: list[str], out: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def layer_norm(x: str, w: Any, b: Any, name: str) -> str:
        return node(
            "LayerNormalization",
            [x, const(f"{name}.w", w), const(f"{name}.b", b)],
            name,
            axis=-1,
            epsilon=spec.layer_norm_eps,
        )

    def dense(x: str, w: Any, b: Any, name: str) -> str:
        y = node("MatMul", [x, const(f"{name}.w", w)], f"{name}.mm")
        return node("Add", [y, const(f"{name}.b", b)], name)

    f32 = np.float32
    words = node("Gather", [const("word", encoder._word), "input_ids"], "e.word")
    positions = node("Gather", [const("pos", encoder._position), "position_ids"], "e.pos")
    types = node("Gather", [const("type", encoder._token_type), "token_type_ids"], "e.type")
    x = node("Add", [node("Add", [words, positions], "e.wp"), types], "e.sum")
    x = layer_norm(x, encoder._ln_w, encoder._ln_b, "e.ln")
    inverted = node("Sub", [const("one", np.array(1.0, f32)), "attention_mask"], "m.inv")
    bias = node("Mul", [inverted, const("min", np.array(np.finfo(f32).min, f32))], "m.bias")
    bias = node("Unsqueeze", [bias, const("axes12", np.array([1, 2], np.int64))], "m.bias4")
    split_shape = const("qkv.shape", np.array([0, 0, 3, heads, size], np.int64))
    merge_shape = const("ctx.shape", np.array([0, 0, hidden], np.int64))
    scale = const("scale", np.array(1.0 / math.sqrt(size), f32))
    for i, layer in enumerate(encoder._layers):
        p = f"l{i}"
        qkv = dense(x, layer.qkv_w, layer.qkv_b, f"{p}.qkv")
        qkv = node("Reshape", [qkv, split_shape], f"{p}.qkv5")
        qkv = node("Transpose", [qkv], f"{p}.qkvT", perm=[2, 0, 3, 1, 4])
        q, k, v = (
            node("Gather", [qkv, const(f"{p}.i{j}", np.array(j, np.int64))], f"{p}.{n}", axis=0)
            for j, n in enumerate("qkv")
        )
        q = node("Mul", [q, scale], f"{p}.qs")
        kt = node("Transpose", [k], f"{p}.kT", perm=[0, 1, 3, 2])
        scores = node("Add", [node("MatMul", [q, kt], f"{p}.s0"), bias], f"{p}.s")
        weights = node("Softmax", [scores], f"{p}.p", axis=-1)
        context = node("MatMul", [weights, v], f"{p}.c")
        context = node("Transpose", [context], f"{p}.cT", perm=[0, 2, 1, 3])
        context = node("Reshape", [context, merge_shape], f"{p}.c3")
        attended = dense(context, layer.out_w, layer.out_b, f"{p}.o")
        x = layer_norm(node("Add", [attended, x], f"{p}.r1"), layer.ln1_w, layer.ln1_b, f"{p}.ln1")
        up = dense(x, layer.up_w, layer.up_b, f"{p}.up")
        # GELU exact: x·(1 + erf(x/√2))/2 (onnxruntime fuses this pattern into its Gelu).
        e = node(
            "Erf", [node("Div", [up, const(f"{p}.sqrt2", f32(math.sqrt(2)))], f"{p}.g0")], f"{p}.g1"
        )
        e = node("Add", [e, const(f"{p}.g.one", f32(1.0))], f"{p}.g2")
        g = node("Mul", [node("Mul", [up, e], f"{p}.g3"), const(f"{p}.half", f32(0.5))], f"{p}.g")
        down = dense(g, layer.down_w, layer.down_b, f"{p}.down")
        x = layer_norm(node("Add", [down, x], f"{p}.r2"), layer.ln2_w, layer.ln2_b, f"{p}.ln2")
    mask3 = node("Unsqueeze", ["attention_mask", const("axis2", np.array([2], np.int64))], "m3")
    summed = node(
        "ReduceSum",
        [node("Mul", [x, mask3], "pool.m"), const("axis1", np.array([1], np.int64))],
        "pool.s",
        keepdims=0,
    )
    counts = node("ReduceSum", [mask3, "axis1"], "pool.n", keepdims=0)
    counts = node("Max", [counts, const("tiny", np.array(1e-9, f32))], "pool.nc")
    pooled = node("Div", [summed, counts], "pooled")
    if spec.normalize:
        norm = node("ReduceL2", [pooled], "norm", axes=[1], keepdims=1)
        norm = node("Max", [norm, const("eps", np.array(1e-12, f32))], "norm.c")
        pooled = node("Div", [pooled, norm], "normalised")
    nodes.append(helper.make_node("Identity", [pooled], ["embeddings"]))
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "w"]),
        helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["b", "w"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["w"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.FLOAT, ["b", "w"]),
    ]
    outputs = [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["b", hidden])]
    graph = helper.make_graph(nodes, "bert_mean_pooling", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


class OnnxBertEncoder(BertEncoder):
    """`BertEncoder` whose forward pass runs as an onnxruntime graph (CPU)."""

    def __init__(self, spec: ModelSpec, tokenizer: Any, weights: dict[str, Any]) -> None:
        import onnxruntime

        super().__init__(spec, tokenizer, weights)
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = onnxruntime.InferenceSession(
            build_graph(self), options, providers=["CPUExecutionProvider"]
        )

    def _embed_batch(self, encodings: Sequence[Any]) -> Any:
        """One padded batch through the graph (the numpy encoder packs; a graph pads)."""
        import numpy as np

        width = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(encodings), width), dtype=np.int64)
        types = np.zeros((len(encodings), width), dtype=np.int64)
        mask = np.zeros((len(encodings), width), dtype=np.float32)
        for row, encoding in enumerate(encodings):
            n = len(encoding.ids)
            ids[row, :n] = encoding.ids
            types[row, :n] = encoding.type_ids
            mask[row, :n] = 1.0
        return self._forward(ids, types, mask)

    def _forward(self, ids: Any, types: Any, mask: Any) -> Any:
        import numpy as np

        feeds = {
            "input_ids": ids,
            "token_type_ids": types,
            "position_ids": np.arange(ids.shape[1], dtype=np.int64),
            "attention_mask": mask,
        }
        return self._session.run(["embeddings"], feeds)[0]
