"""A `BertEncoder`'s forward pass as one ONNX graph of onnxruntime's fused BERT operators.

`build_graph` writes the graph with the ``onnx`` helpers from the encoder's own float32
weights (nothing is read or downloaded): ``EmbedLayerNormalization`` (the three embeddings and
their LayerNorm, and each row's length from the mask), then per layer one ``Attention`` (the
query/key/value projection, softmax and context, over each row's real tokens only),
``SkipLayerNormalization`` (residual, bias and LayerNorm in one pass) and ``BiasGelu`` (the
exact, erf-based GELU that BERT uses), the weight products as plain ``MatMul``; then mean
pooling over the real tokens and L2 normalisation, so one run returns finished embeddings.
These are the operators onnxruntime's own BERT optimizer fuses a HF export into; writing them
directly needs no pattern matching to succeed.

`quantize` turns it into int8 with onnxruntime's quantizers (`Quantisation`): only the weight
products, weights int8 per output channel; the attention projection and the output and up
projections with their activations quantised per run (dynamic), the feed-forward's down
projection 8-bit in blocks with its activations quantised per row and block (``MatMulNBits``:
GELU's outliers would take a whole batch's scale). The attention scores and their softmax stay
float32 inside ``Attention``: quantising them too cost the ranking (cosine 0.94).

`build_graph` needs onnx (both the ``[int8]`` and the ``[bf16]`` extra), `quantize`
onnxruntime and onnx-ir (``[int8]``); they are imported inside the functions.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .bert import BertEncoder

__all__ = ["GRAPH_VERSION", "Quantisation", "build_graph", "quantize"]

GRAPH_VERSION = 1
"""The graph's layout and the quantisation recipe; a cached graph of another version is
built again (change it with either)."""

_OPSET = 17
_MS = "com.microsoft"
_CONTRIB = {"EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu"}


@dataclass(frozen=True, slots=True)
class Quantisation:
    """How `quantize` quantises: at what granularity, and how the feed-forward's second product.

    The default is the recipe that keeps the ranking: weights int8 per output channel, and the
    feed-forward's down projection (whose input, GELU's output, has the outliers that a single
    activation scale per batch cannot hold) 8-bit in blocks of `block` weights with its
    activations quantised per row and block (``MatMulNBits``). The cruder ones exist so a test
    can show the quality bar fails without them: `per_channel` False is one scale per weight
    matrix; `down_blockwise` False quantises the down projection like the others.
    """

    per_channel: bool = True
    down_blockwise: bool = True
    block: int = 128

    @property
    def tag(self) -> str:
        """A short name for cache files (the default is ``pc-b128``)."""
        down = f"b{self.block}" if self.down_blockwise else "dyn"
        return ("pc" if self.per_channel else "pt") + "-" + down


def build_graph(encoder: BertEncoder) -> Any:
    """The float32 `onnx.ModelProto` of `encoder`: (input_ids, token_type_ids, attention_mask),
    int32 batch x width, right-padded → ``embeddings`` (batch x hidden), pooled and normalised
    as the model says."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    spec = encoder.spec
    eps = spec.layer_norm_eps
    nodes: list[Any] = []
    inits: list[Any] = []

    def const(name: str, value: Any) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(op: str, inputs: list[str], outputs: list[str], **attrs: Any) -> list[str]:
        domain = _MS if op in _CONTRIB else ""
        nodes.append(helper.make_node(op, inputs, outputs, name=outputs[0], domain=domain, **attrs))
        return outputs

    def dense(x: str, w: Any, name: str) -> str:
        return node("MatMul", [x, const(f"{name}.w", w)], [name])[0]

    x, lengths = node(
        "EmbedLayerNormalization",
        [
            "input_ids",
            "token_type_ids",
            const("word", encoder._word),
            const("position", encoder._position),
            const("token_type", encoder._token_type),
            const("embed.ln.w", encoder._ln_w),
            const("embed.ln.b", encoder._ln_b),
            "attention_mask",
        ],
        ["embed", "lengths"],
        epsilon=eps,
    )
    for i, layer in enumerate(encoder._layers):
        p = f"l{i}"
        context = node(
            "Attention",
            [x, const(f"{p}.qkv.w", layer.qkv_w), const(f"{p}.qkv.b", layer.qkv_b), lengths],
            [f"{p}.attention"],
            num_heads=spec.heads,
        )[0]
        projected = dense(context, layer.out_w, f"{p}.out")
        x = node(
            "SkipLayerNormalization",
            [
                projected,
                x,
                const(f"{p}.ln1.w", layer.ln1_w),
                const(f"{p}.ln1.b", layer.ln1_b),
                const(f"{p}.out.b", layer.out_b),
            ],
            [f"{p}.ln1"],
            epsilon=eps,
        )[0]
        up = dense(x, layer.up_w, f"{p}.up")
        gelu = node("BiasGelu", [up, const(f"{p}.up.b", layer.up_b)], [f"{p}.gelu"])[0]
        down = dense(gelu, layer.down_w, f"{p}.down")
        x = node(
            "SkipLayerNormalization",
            [
                down,
                x,
                const(f"{p}.ln2.w", layer.ln2_w),
                const(f"{p}.ln2.b", layer.ln2_b),
                const(f"{p}.down.b", layer.down_b),
            ],
            [f"{p}.ln2"],
            epsilon=eps,
        )[0]
    # Mean pooling over the real tokens (sentence-transformers clamps the count at 1e-9).
    mask = node("Cast", ["attention_mask"], ["mask.f"], to=TensorProto.FLOAT)[0]
    mask3 = node("Unsqueeze", [mask, const("axis2", np.array([2], np.int64))], ["mask3"])[0]
    masked = node("Mul", [x, mask3], ["pool.masked"])[0]
    axis1 = const("axis1", np.array([1], np.int64))
    summed = node("ReduceSum", [masked, axis1], ["pool.sum"], keepdims=0)[0]
    counts = node("ReduceSum", [mask3, axis1], ["pool.count"], keepdims=0)[0]
    counts = node("Max", [counts, const("tiny", np.array(1e-9, np.float32))], ["pool.clamped"])[0]
    pooled = node("Div", [summed, counts], ["pooled" if spec.normalize else "embeddings"])[0]
    if spec.normalize:
        squares = node("Mul", [pooled, pooled], ["norm.sq"])[0]
        total = node("ReduceSum", [squares, axis1], ["norm.sum"], keepdims=1)[0]
        norm = node("Sqrt", [total], ["norm"])[0]
        norm = node("Max", [norm, const("eps", np.array(1e-12, np.float32))], ["norm.clamped"])[0]
        node("Div", [pooled, norm], ["embeddings"])
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", "width"])
        for name in ("input_ids", "token_type_ids", "attention_mask")
    ]
    outputs = [
        helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["batch", spec.hidden])
    ]
    graph = helper.make_graph(nodes, "bert_mean_pooling", inputs, outputs, inits)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", _OPSET), helper.make_opsetid(_MS, 1)],
    )
    model.ir_version = 8
    return model


def quantize(model: Any, quantisation: Quantisation | None = None) -> bytes:
    """The serialised int8 model of float32 `model` (`build_graph`'s), as `quantisation` says
    (default: the recipe that keeps the ranking)."""
    import onnx
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic

    chosen = quantisation or Quantisation()
    downs = [n.name for n in model.graph.node if n.name.endswith(".down")]
    with (
        tempfile.TemporaryDirectory(prefix="retrieval-stage-int8-") as work,
        _quiet_quantizer(),
    ):
        out = Path(work) / "int8.onnx"
        quantize_dynamic(
            model,
            out,
            op_types_to_quantize=["MatMul", "Attention"],
            per_channel=chosen.per_channel,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=downs if chosen.down_blockwise else None,
            # The contrib operators have no ONNX shape inference: their outputs are float32.
            extra_options={"DefaultTensorType": TensorProto.FLOAT},
        )
        quantized = onnx.load(out)
    if chosen.down_blockwise:
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            DefaultWeightOnlyQuantConfig,
            MatMulNBitsQuantizer,
        )

        config = DefaultWeightOnlyQuantConfig(
            block_size=chosen.block,
            is_symmetric=True,
            accuracy_level=4,  # int8 activations, per row and block: the integer units
            bits=8,
        )
        blockwise = MatMulNBitsQuantizer(quantized, nodes_to_include=downs, algo_config=config)
        blockwise.process()
        quantized = blockwise.model.model
    return bytes(quantized.SerializeToString())


class _PreprocessingAdvice(logging.Filter):
    """Drops the quantizer's advice to run its shape pre-processing (on the root logger, at
    every call): the graph is written with its shapes, there is nothing to pre-process."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    advice = _PreprocessingAdvice()
    root = logging.getLogger()
    root.addFilter(advice)
    try:
        yield
    finally:
        root.removeFilter(advice)


def serialised(model: Any) -> bytes:
    """`model` as bytes (for a float32 session)."""
    return bytes(model.SerializeToString())
