"""A BERT sentence encoder in numpy: the packaged all-MiniLM-L6-v2 without torch.

`BertEncoder.from_directory` reads a sentence-transformers model folder (``config.json``,
``modules.json``, the pooling module's ``config.json``, ``sentence_bert_config.json``,
``tokenizer.json``, ``model.safetensors``) and embeds texts as sentence-transformers would:
the HF Rust tokenizer (``tokenizers``) cuts each text at the model's ``max_seq_length``, the
BERT encoder runs in float32 numpy (exact GELU, the config's LayerNorm epsilon, token type
ids), mean pooling over the real tokens, then L2 normalisation when ``modules.json`` lists a
``Normalize`` module. Nothing is padded: a batch's tokens are packed one text after another,
the position-wise steps run on blocks of rows that stay in cache, and attention runs per text
over exactly its tokens (what a padded batch with an attention mask computes, without the
padded work: a 50-document rerank pool of long and short texts was 55% padding).

It implements exactly that: a BERT encoder (``model_type`` ``bert``, ``architectures``
``BertModel``, absolute positions, ``gelu``) followed by mean pooling and optionally
normalisation. Any other folder is refused by `UnsupportedModelError`, naming what was found;
sentence-transformers (the ``[torch]`` extra) runs the rest. Nothing is ever downloaded: the
folder is read as it is on disk.

The light ``[local]`` extra (tokenizers, safetensors, numpy and the model package) is all it
needs; those are imported when a model is loaded, so importing this module costs nothing.
"""

from __future__ import annotations

import itertools
import json
import math
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .model_source import ModelUnavailableError

__all__ = ["BertEncoder", "UnsupportedModelError", "erf", "read_model_spec"]

_TRANSFORMER = "sentence_transformers.models.Transformer"
_POOLING = "sentence_transformers.models.Pooling"
_NORMALIZE = "sentence_transformers.models.Normalize"
_OTHER_POOLING_MODES = (
    "pooling_mode_cls_token",
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
    "pooling_mode_lasttoken",
)
_DOCUMENT_PROMPTS = ("document", "passage", "corpus")  # what sentence-transformers looks for


class UnsupportedModelError(ModelUnavailableError):
    """The folder holds a model this encoder does not implement (not a BERT encoder with mean
    pooling), or misses a file it needs. The message names what was found.

    A `RerankError` (as every load failure), so a stage falls back to recall order and the
    command says why.
    """


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What a model folder says about itself, checked: the numbers the encoder needs."""

    root: Path
    layers: int
    hidden: int
    heads: int
    layer_norm_eps: float
    max_seq_length: int
    normalize: bool
    do_lower_case: bool
    prompts: dict[str, str]
    default_prompt_name: str | None

    def prompt(self, role: str) -> str:
        """The prompt sentence-transformers prepends for `role` (``query``/``document``)."""
        names = (role,) if role == "query" else _DOCUMENT_PROMPTS
        for name in names:
            if name in self.prompts:
                return self.prompts[name]
        if self.default_prompt_name is not None:
            return self.prompts.get(self.default_prompt_name, "")
        return ""


def _json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UnsupportedModelError(f"{path.parent} has no {path.name} ({what})") from None
    except (OSError, ValueError) as exc:
        raise UnsupportedModelError(f"cannot read {path}: {exc}") from exc


def _refuse(root: Path, found: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"{root} holds {found}; the torch-free embedding backend implements only a BERT "
        "encoder with mean pooling (such as all-MiniLM-L6-v2). For other models install "
        "sentence-transformers (the [torch] extra) and use backend='sentence-transformers'"
    )


def read_model_spec(directory: str | Path) -> ModelSpec:
    """The checked description of the sentence-transformers model in `directory`.

    `UnsupportedModelError` names what was found when it is not a BERT encoder followed by
    mean pooling (and optionally ``Normalize``), or when a file it needs is missing.
    """
    root = Path(directory)
    modules = _json(root / "modules.json", "a sentence-transformers model lists its modules there")
    types = [m.get("type") for m in modules] if isinstance(modules, list) else None
    if (
        not types
        or not all(isinstance(m, dict) for m in modules)
        or types[:2] != [_TRANSFORMER, _POOLING]
        or types[2:] not in ([], [_NORMALIZE])
        or modules[0].get("path", "") not in ("", ".")
    ):
        raise _refuse(root, f"the modules {types!r}")
    config = _json(root / "config.json", "the transformer's configuration")
    model_type = config.get("model_type")
    architectures = config.get("architectures") or []
    if model_type != "bert" or any(a != "BertModel" for a in architectures):
        shown = ", ".join(map(str, architectures)) or "none"
        raise _refuse(root, f"model_type {model_type!r} with architectures {shown}")
    for key, expected in (("hidden_act", "gelu"), ("position_embedding_type", "absolute")):
        if config.get(key, expected) != expected:
            raise _refuse(root, f"a BERT with {key} {config.get(key)!r} (not {expected!r})")
    if config.get("is_decoder") or config.get("add_cross_attention"):
        raise _refuse(root, "a BERT decoder")
    pooling_path = root / str(modules[1].get("path") or "1_Pooling") / "config.json"
    pooling = _json(pooling_path, "the pooling module's configuration")
    others = [mode for mode in _OTHER_POOLING_MODES if pooling.get(mode)]
    if not pooling.get("pooling_mode_mean_tokens") or others:
        modes = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and v] or ["none"]
        raise _refuse(root, f"pooling {', '.join(modes)} (not mean pooling alone)")
    st_config: dict[str, Any] = {}
    if (root / "sentence_bert_config.json").is_file():
        st_config = _json(root / "sentence_bert_config.json", "the transformer module's settings")
    settings: dict[str, Any] = {}
    if (root / "config_sentence_transformers.json").is_file():
        settings = _json(root / "config_sentence_transformers.json", "the model's settings")
    prompts = {str(k): str(v) for k, v in (settings.get("prompts") or {}).items() if v}
    if prompts and pooling.get("include_prompt") is False:
        raise _refuse(root, "pooling that leaves out prompt tokens (include_prompt false)")
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    if hidden % heads or int(pooling.get("word_embedding_dimension", hidden)) != hidden:
        raise _refuse(root, f"hidden size {hidden} with {heads} heads")
    positions = int(config.get("max_position_embeddings", 512))
    tokenizer_config: dict[str, Any] = {}
    if (root / "tokenizer_config.json").is_file():
        tokenizer_config = _json(root / "tokenizer_config.json", "the tokenizer's settings")
    # As sentence-transformers: its own max_seq_length, else the tokenizer's model_max_length,
    # capped by the model's position table either way.
    length = st_config.get("max_seq_length") or tokenizer_config.get("model_max_length")
    max_seq_length = min(int(length), positions) if length else positions
    return ModelSpec(
        root=root,
        layers=int(config["num_hidden_layers"]),
        hidden=hidden,
        heads=heads,
        layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)),
        max_seq_length=max_seq_length,
        normalize=types[2:] == [_NORMALIZE],
        do_lower_case=bool(st_config.get("do_lower_case", False)),
        prompts=prompts,
        default_prompt_name=settings.get("default_prompt_name") or None,
    )


# Float32 erf as a rational function (Eigen's generic_fast_erf_float, also XLA's): absolute
# error below 2e-7 on [-4, 4] (float32 resolution), and erf(|x| > 4) rounds to ±1 in float32.
_ERF_ALPHA = (
    -2.72614225801306e-10,
    2.77068142495902e-08,
    -2.10102402082508e-06,
    -5.69250639462346e-05,
    -7.34990630326855e-04,
    -2.95459980854025e-03,
    -1.60960333262415e-02,
)
_ERF_BETA = (
    -1.45660718464996e-05,
    -2.13374055278905e-04,
    -1.68282697438203e-03,
    -7.37332916720468e-03,
    -1.42647390514189e-02,
)


def erf(x: Any) -> Any:
    """The error function of a float32 numpy array, to float32 precision (numpy has none)."""
    import numpy as np

    return _erf_clipped(np.clip(np.asarray(x, dtype=np.float32), -4.0, 4.0))


def _erf_clipped(x: Any) -> Any:
    """erf of float32 `x`, already clipped to [-4, 4], as a new array; `x` is overwritten.

    Every pass but the first two is in place: three arrays for the whole polynomial.
    """
    import numpy as np

    x2 = x * x
    p = np.multiply(x2, np.float32(_ERF_ALPHA[0]))  # Horner's rule in x²
    p += np.float32(_ERF_ALPHA[1])
    for c in _ERF_ALPHA[2:]:
        p *= x2
        p += np.float32(c)
    p *= x
    q = np.multiply(x2, np.float32(_ERF_BETA[0]), out=x)  # x is no longer needed
    q += np.float32(_ERF_BETA[1])
    for c in _ERF_BETA[2:]:
        q *= x2
        q += np.float32(c)
    p /= q
    return p


def _gelu(x: Any) -> Any:
    """BERT's exact GELU, x·Φ(x) = x·(1 + erf(x/√2))/2, in place on float32 `x` (returned)."""
    import numpy as np

    t = np.multiply(x, np.float32(1 / math.sqrt(2)))
    np.clip(t, -4.0, 4.0, out=t)
    e = _erf_clipped(t)
    e += np.float32(1.0)
    x *= np.float32(0.5)
    x *= e
    return x


def _layer_norm(x: Any, weight: Any, bias: Any, eps: float) -> Any:
    import numpy as np

    mean = x.mean(axis=-1, keepdims=True)
    x = x - mean
    variance = np.mean(x * x, axis=-1, keepdims=True)
    x *= 1.0 / np.sqrt(variance + np.float32(eps))
    x *= weight
    x += bias
    return x


_ROWS = 256
"""Token rows the position-wise steps (output projection, LayerNorm, feed-forward, GELU) work
on at once: their intermediates (256 x 1536 floats for MiniLM) stay in cache, where a whole
batch's would make each elementwise pass a trip to memory, and the products keep enough rows
for BLAS to run near its best (64 rows ran ~10% slower, 1,024 and more ~20%)."""

_SCORES = 1 << 16
"""Attention scores (floats, 256 KB) one text computes at once: as many heads as fit."""


@dataclass(frozen=True, slots=True)
class _Layer:
    qkv_w: Any  # (hidden, 3·hidden): query, key, value side by side, transposed for x @ w
    qkv_b: Any
    out_w: Any
    out_b: Any
    ln1_w: Any
    ln1_b: Any
    up_w: Any
    up_b: Any
    down_w: Any
    down_b: Any
    ln2_w: Any
    ln2_b: Any


class BertEncoder:
    """all-MiniLM-L6-v2 (any BERT encoder with mean pooling) run in numpy, no torch.

    Built by `from_directory`. `embed(texts, role=...)` returns one float32 row per text, as
    sentence-transformers' ``encode_query``/``encode_document`` would. `max_seq_length` may be
    set (a shorter cut); `tokenizer` is the HF Rust tokenizer, cutting at it.
    """

    def __init__(self, spec: ModelSpec, tokenizer: Any, weights: dict[str, Any]) -> None:
        import numpy as np

        self.spec = spec
        self.tokenizer = tokenizer
        self._max_seq_length = spec.max_seq_length
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in weights else ""

        def w(name: str) -> Any:
            try:
                return np.ascontiguousarray(weights[prefix + name], dtype=np.float32)
            except KeyError:
                raise UnsupportedModelError(
                    f"{spec.root}/model.safetensors has no tensor {prefix + name}: not the "
                    "weights of a BERT encoder"
                ) from None

        self._word = w("embeddings.word_embeddings.weight")
        self._position = w("embeddings.position_embeddings.weight")
        self._token_type = w("embeddings.token_type_embeddings.weight")
        self._ln_w = w("embeddings.LayerNorm.weight")
        self._ln_b = w("embeddings.LayerNorm.bias")
        if self._word.shape[1] != spec.hidden:
            raise UnsupportedModelError(
                f"{spec.root}: word embeddings of width {self._word.shape[1]}, config.json "
                f"says hidden_size {spec.hidden}"
            )
        self._max_seq_length = min(self._max_seq_length, self._position.shape[0])
        self._layers: list[_Layer] = []
        for i in range(spec.layers):
            p = f"encoder.layer.{i}."
            attention = [w(f"{p}attention.self.{n}.weight") for n in ("query", "key", "value")]
            biases = [w(f"{p}attention.self.{n}.bias") for n in ("query", "key", "value")]
            self._layers.append(
                _Layer(
                    qkv_w=np.ascontiguousarray(np.concatenate(attention, axis=0).T),
                    qkv_b=np.concatenate(biases),
                    out_w=np.ascontiguousarray(w(f"{p}attention.output.dense.weight").T),
                    out_b=w(f"{p}attention.output.dense.bias"),
                    ln1_w=w(f"{p}attention.output.LayerNorm.weight"),
                    ln1_b=w(f"{p}attention.output.LayerNorm.bias"),
                    up_w=np.ascontiguousarray(w(f"{p}intermediate.dense.weight").T),
                    up_b=w(f"{p}intermediate.dense.bias"),
                    down_w=np.ascontiguousarray(w(f"{p}output.dense.weight").T),
                    down_b=w(f"{p}output.dense.bias"),
                    ln2_w=w(f"{p}output.LayerNorm.weight"),
                    ln2_b=w(f"{p}output.LayerNorm.bias"),
                )
            )
        self._cut(self._max_seq_length)

    @classmethod
    def from_directory(cls, directory: str | Path) -> BertEncoder:
        """Load the model in `directory` (read from disk only); `UnsupportedModelError` when
        it is not a BERT encoder with mean pooling or a file it needs is missing."""
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        spec = read_model_spec(directory)
        weights_path = spec.root / "model.safetensors"
        tokenizer_path = spec.root / "tokenizer.json"
        for path, what in ((weights_path, "the weights"), (tokenizer_path, "the tokenizer")):
            if not path.is_file():
                raise UnsupportedModelError(
                    f"{spec.root} has no {path.name} ({what}), which the torch-free backend "
                    "reads; sentence-transformers (the [torch] extra) reads other formats"
                )
        try:
            tokenizer = Tokenizer.from_file(str(tokenizer_path))
            weights = load_file(str(weights_path))
        except Exception as exc:  # tokenizers and safetensors raise their own types
            raise UnsupportedModelError(
                f"cannot read {spec.root}: {type(exc).__name__}: {exc}"
            ) from exc
        return cls(spec, tokenizer, weights)

    def _tokenized(self, texts: Sequence[str], role: str) -> tuple[list[Any], list[int]]:
        """`texts` with `role`'s prompt (lower-cased where the model is), tokenized, and their
        positions longest first: what every forward pass batches from (this one's packed
        batches, the graph encoders' padded ones)."""
        prompt = self.spec.prompt(role)
        inputs = [prompt + t for t in texts]
        if self.spec.do_lower_case:
            inputs = [t.lower() for t in inputs]
        encodings = self.tokenizer.encode_batch(inputs, add_special_tokens=True)
        order = sorted(range(len(encodings)), key=lambda i: -len(encodings[i].ids))
        return encodings, order

    @property
    def max_seq_length(self) -> int:
        """Tokens of one text the model reads (special tokens included); the rest is cut."""
        return self._max_seq_length

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        self._cut(min(int(value), self._position.shape[0]))

    def _cut(self, length: int) -> None:
        self._max_seq_length = length
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=length, strategy="longest_first")

    def embed(
        self,
        texts: Sequence[str],
        *,
        role: str = "document",
        batch_size: int = 32,
        workers: int = 1,
    ) -> Any:
        """One float32 embedding per text (2-D array), pooled and normalised as the model says.

        Texts are tokenized together, then embedded `batch_size` at a time (longest first, as
        sentence-transformers does), and put back in input order. A batch is never padded:
        its tokens are packed one text after another, the position-wise steps run on every
        real token at once, and attention runs text by text over exactly that text's tokens.

        With `workers` > 1 the batches run on that many threads side by side (numpy lets go
        of the GIL in its matrix products and its large element-wise steps), the batches made
        small enough that each worker gets one: 50 texts on 2 workers are two batches of 25,
        not 32 and 18. A text's embedding does not depend on its batch mates (nothing is
        padded), so the result is the same; the caller keeps BLAS at one thread per worker.
        """
        import numpy as np

        out = np.zeros((len(texts), self.spec.hidden), dtype=np.float32)
        if not texts:
            return out
        encodings, order = self._tokenized(texts, role)
        if workers > 1 and len(order) > 1:
            batch_size = min(batch_size, -(-len(order) // workers))
        batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
        if workers <= 1 or len(batches) == 1:
            for chosen in batches:
                out[chosen] = self._embed_batch([encodings[i] for i in chosen])
            return out
        pool = self._workers(workers)
        done = pool.map(lambda chosen: self._embed_batch([encodings[i] for i in chosen]), batches)
        for chosen, vectors in zip(batches, done, strict=True):
            out[chosen] = vectors
        return out

    def _workers(self, workers: int) -> ThreadPoolExecutor:
        """This encoder's pool of `workers` threads, made on first use (and again, once, for a
        different count)."""
        with self._pool_lock:
            pool = self._pool
            if pool is None or pool._max_workers != workers:
                if pool is not None:
                    pool.shutdown(wait=False)
                pool = self._pool = ThreadPoolExecutor(workers, "bert-encoder")
            return pool

    def _embed_batch(self, encodings: Sequence[Any]) -> Any:
        """Pooled (and normalised) embeddings of some tokenized texts, packed without padding."""
        import numpy as np

        lengths = np.array([len(e.ids) for e in encodings], dtype=np.int64)
        starts = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        total = int(lengths.sum())
        ids = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), np.int64, total)
        types = np.fromiter(
            itertools.chain.from_iterable(e.type_ids for e in encodings), np.int64, total
        )
        positions = np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)
        x = self._word[ids]
        x += self._position[positions]
        x += self._token_type[types]
        x = _layer_norm(x, self._ln_w, self._ln_b, self.spec.layer_norm_eps)
        spans = list(zip(starts.tolist(), lengths.tolist(), strict=True))
        for layer in self._layers:
            x = self._layer(x, layer, spans)
        # Mean pooling over each text's tokens (sentence-transformers clamps the count at 1e-9).
        pooled = np.zeros((len(lengths), self.spec.hidden), dtype=np.float32)
        present = lengths > 0
        if present.any():
            pooled[present] = np.add.reduceat(x, starts[present], axis=0)
        pooled /= np.maximum(lengths, 1e-9).astype(np.float32)[:, None]
        if self.spec.normalize:
            norms = np.linalg.norm(pooled, axis=1, keepdims=True)
            pooled /= np.maximum(norms, np.float32(1e-12))
        return pooled

    def _layer(self, x: Any, layer: _Layer, spans: list[tuple[int, int]]) -> Any:
        """One encoder layer over packed tokens `x` (tokens x hidden); `spans` gives each
        text's (first row, length)."""
        import numpy as np

        tokens, hidden = x.shape
        heads = self.spec.heads
        size = hidden // heads
        eps = self.spec.layer_norm_eps
        scale = np.float32(1.0 / math.sqrt(size))
        qkv = x @ layer.qkv_w
        qkv += layer.qkv_b
        context = np.empty((tokens, hidden), dtype=np.float32)
        for first, width in spans:
            # Contiguous (heads, width, size) blocks: numpy's stacked matmul calls BLAS per
            # matrix only for contiguous operands (strided ones run ~6x slower).
            block = qkv[first : first + width].reshape(width, 3, heads, size)
            q = np.multiply(
                block[:, 0].transpose(1, 0, 2),
                scale,
                out=np.empty((heads, width, size), np.float32),
            )
            kt = np.ascontiguousarray(block[:, 1].transpose(1, 2, 0))
            v = np.ascontiguousarray(block[:, 2].transpose(1, 0, 2))
            into = context[first : first + width].reshape(width, heads, size)
            group = max(1, _SCORES // (width * width))  # heads whose scores stay in cache
            for h in range(0, heads, group):
                scores = np.matmul(q[h : h + group], kt[h : h + group])
                # Softmax with the normalisation after the product with V: one pass less over
                # the scores, and the same weights.
                scores -= scores.max(axis=-1, keepdims=True)
                np.exp(scores, out=scores)
                sums = scores.sum(axis=-1, keepdims=True)
                part = np.matmul(scores, v[h : h + group])
                part /= sums
                into[:, h : h + group] = part.transpose(1, 0, 2)
        out = np.empty_like(x)
        for r in range(0, tokens, _ROWS):  # position-wise: a block of rows stays in cache
            rows = slice(r, r + _ROWS)
            attended = context[rows] @ layer.out_w
            attended += layer.out_b
            attended += x[rows]
            attended = _layer_norm(attended, layer.ln1_w, layer.ln1_b, eps)
            up = attended @ layer.up_w
            up += layer.up_b
            down = _gelu(up) @ layer.down_w
            down += layer.down_b
            down += attended
            out[rows] = _layer_norm(down, layer.ln2_w, layer.ln2_b, eps)
        return out
