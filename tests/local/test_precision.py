"""The int8 and bf16 embedding models (`retrieval_stage.local.int8`, `.bf16`): how close they
keep the ranking, that the bar can fail, that their on-disk graph is trusted only when it
checks, and that a machine without them runs float32 and says so.

The quality bars: over the whole bundled corpus the lowest cosine between
a document's int8 (bf16) and float32 embedding is at least 0.99, and the bundled eval's MRR@10
is within 0.01 of float32's. int8 holds the first and not the second (one near-tie moves: see
the test), bf16 holds both. The corpus is embedded once per session each way (about a minute
on two busy cores), each graph built once (`tests._int8`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from structlog.testing import capture_logs

from retrieval_stage.local import bf16 as bf16_module
from retrieval_stage.local import embedding as embedding_module
from retrieval_stage.local import graph_cache
from retrieval_stage.local import int8 as int8_module

from .._int8 import cache_home, encoder, graph_dir, int8_encoder, need, need_int8
from .._minilm import packaged_path

COSINE_BAR = 0.99
MRR_BAR = 0.01
FP32_MRR = 0.7102
"""The bundled eval's MRR@10 reranked by the float32 model (docs/benchmarks.md)."""
CRUDE_STEP = 8
"""The cruder recipe is checked on every 8th corpus document (193): it fails on far fewer."""


PRECISIONS = ["int8", "bf16"]


@pytest.fixture(autouse=True)
def _graphs_cached_for_the_session(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home()))


@functools.cache
def corpus() -> tuple[list[str], Any]:
    """The bundled corpus's texts and their float32 (numpy) embeddings."""
    need("int8")  # only the tests of a graph precision ask for the corpus
    from threadpoolctl import threadpool_limits

    from retrieval_stage.evaluation.corpus import load_corpus
    from retrieval_stage.local import BertEncoder

    texts = [d.text for d in load_corpus()]
    with threadpool_limits(limits=1, user_api="blas"):
        fp32 = BertEncoder.from_directory(packaged_path()).embed(texts, workers=2)
    return texts, fp32


@functools.cache
def corpus_vectors(precision: str) -> Any:
    """The bundled corpus embedded at `precision`."""
    return encoder(precision).embed(corpus()[0])


def lowest_cosine(a: Any, b: Any) -> float:
    return float((a * b).sum(axis=1).min())


# -- the quality bars --------------------------------------------------------------------------


@pytest.mark.parametrize("precision", PRECISIONS)
def test_embeddings_of_the_bundled_corpus_are_within_cosine_0_99_of_float32(
    precision: str,
) -> None:
    need(precision)
    texts, fp32 = corpus()
    assert len(texts) == 1538
    assert lowest_cosine(fp32, corpus_vectors(precision)) >= COSINE_BAR


def test_bf16_is_within_cosine_0_9999_of_float32() -> None:
    """bf16 keeps float32's products' accumulation: near-ties stay put."""
    need("bf16")
    assert lowest_cosine(corpus()[1], corpus_vectors("bf16")) >= 0.9999


@pytest.mark.parametrize(
    "recipe",
    [
        pytest.param({"down_blockwise": False}, id="down-projection-per-batch-scale"),
        pytest.param({"down_blockwise": False, "per_channel": False}, id="per-tensor-weights"),
    ],
)
def test_a_cruder_quantisation_fails_the_cosine_bar(recipe: dict[str, bool]) -> None:
    """The feed-forward's down projection quantised like the others (one activation scale per
    batch, where GELU's outliers live), or on top of that one weight scale per matrix instead
    of one per channel: the bar catches either."""
    need_int8()
    from retrieval_stage.local.bert_graph import Quantisation
    from retrieval_stage.local.int8 import Int8BertEncoder

    texts, fp32 = corpus()
    crude = Int8BertEncoder.from_directory(
        packaged_path(),
        threads=2,
        graph_dir=graph_dir(),
        quantisation=Quantisation(**recipe),
    )
    assert lowest_cosine(fp32[::CRUDE_STEP], crude.embed(texts[::CRUDE_STEP])) < COSINE_BAR


def _mrr(precision: str, vectors: Any) -> float:
    """The bundled eval's MRR@10 reranked by the packaged model at `precision`, its cache
    filled with the corpus's `vectors` (so only the queries are embedded here)."""
    pytest.importorskip("ir_measures", reason="the eval needs the [cli] extra")
    from retrieval_stage import RerankStage
    from retrieval_stage.evaluation import corpus as bundled
    from retrieval_stage.evaluation.measures import evaluate
    from retrieval_stage.evaluation.readers import read_candidates, read_qrels, read_queries
    from retrieval_stage.local import EmbeddingCache, EmbeddingReranker

    texts, _ = corpus()
    documents = {d.id: d for d in bundled.load_corpus()}
    reranker = EmbeddingReranker(
        backend="numpy", precision=precision, threads=2, cache=EmbeddingCache()
    )
    assert reranker.precision == precision
    reranker.remember(texts, vectors)
    report = evaluate(
        RerankStage(reranker, on_error="raise"),
        read_queries(bundled.data_path(bundled.EXAMPLE_QUERIES)),
        read_qrels(bundled.data_path(bundled.EXAMPLE_QRELS)),
        read_candidates(bundled.data_path(bundled.EXAMPLE_CANDIDATES), documents),
        resamples=10,
    )
    return float(report.metric("MRR@10").reranked)


NEAR_TIE = (
    "int8 moves one near-tie: q23's first two documents are 0.0033 apart in float32 and swap "
    "(MRR@10 0.6894 against 0.7102; each swap at the top of 24 queries is 0.021). int8's "
    "cosines (>= 0.993) move scores by about that much; bf16's (>= 0.99998) do not."
)


@pytest.mark.parametrize(
    "precision",
    [pytest.param("int8", marks=pytest.mark.xfail(reason=NEAR_TIE, strict=True)), "bf16"],
)
def test_the_bundled_evals_mrr_at_10_is_within_0_01_of_float32s(precision: str) -> None:
    need(precision)
    _, fp32 = corpus()
    baseline = _mrr("fp32", fp32)
    assert baseline == pytest.approx(FP32_MRR, abs=5e-5)
    assert abs(_mrr(precision, corpus_vectors(precision)) - baseline) <= MRR_BAR


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_rerank_at_each_precision_puts_the_answer_first(precision: str) -> None:
    need(precision)
    from retrieval_stage.local import EmbeddingReranker

    reranker = EmbeddingReranker(precision=precision, threads=2)
    ranked = reranker.rerank(
        "sort a list in place",
        ["json.dumps: serialise to JSON", "list.sort: sort the list in place"],
        text=str,
    )
    assert ranked[0][0].startswith("list.sort")
    assert reranker.precision == precision
    assert f"precision={precision}" in reranker.cache_key  # never mixed with float32 vectors


@pytest.mark.parametrize("precision", PRECISIONS)
def test_the_reranker_span_says_which_precision_ran(precision: str) -> None:
    need(precision)
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from retrieval_stage import RerankStage
    from retrieval_stage.local import EmbeddingReranker
    from retrieval_stage.models import Candidate
    from retrieval_stage.spans.keys import ATTR_MODEL_PRECISION

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    stage = RerankStage(EmbeddingReranker(precision=precision, threads=2), tracer_provider=provider)
    stage.run("sort a list", [Candidate("a", "list.sort sorts"), Candidate("b", "json")])
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes[ATTR_MODEL_PRECISION] == precision


# -- the graph on disk ---------------------------------------------------------------------------


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_second_load_reads_the_graph_from_the_cache(precision: str) -> None:
    need(precision)
    encoder(precision)  # built (or read) once
    again = type(encoder(precision)).from_directory(
        packaged_path(), threads=1, graph_dir=graph_dir()
    )
    assert not again.graph_built


def test_a_corrupt_cached_graph_is_built_again_never_loaded(tmp_path: Path) -> None:
    need_int8()
    from retrieval_stage.local.int8 import Int8BertEncoder

    target = tmp_path / "graphs"
    int8_encoder()
    key = _default_key()
    graph = target / f"{key}.onnx"
    target.mkdir()
    whole = (graph_dir() / graph.name).read_bytes()
    graph.write_bytes(whole[: len(whole) // 2])  # truncated: onnxruntime could not load it
    (target / f"{key}.sha256").write_bytes((graph_dir() / f"{key}.sha256").read_bytes())
    rebuilt = Int8BertEncoder.from_directory(packaged_path(), threads=1, graph_dir=target)
    assert rebuilt.graph_built
    stored = graph.read_bytes()
    assert hashlib.sha256(stored).hexdigest() == (target / f"{key}.sha256").read_text().strip()
    texts = ["list.sort sorts in place", "json.dumps"]
    assert lowest_cosine(rebuilt.embed(texts), int8_encoder().embed(texts)) > 0.99999


def test_a_graph_of_another_runtime_version_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    need_int8()
    import onnxruntime

    key = _default_key()
    monkeypatch.setattr(onnxruntime, "__version__", "0.0.0-test")
    assert _default_key() != key


def _default_key() -> str:
    """The cache key the default recipe's graph of the packaged model is stored under."""
    found: list[str] = []
    real = graph_cache.cached_graph

    def spy(directory: Path, key: str, build: Any) -> tuple[bytes, bool]:
        found.append(key)
        return real(directory, key, build)

    from retrieval_stage.local.int8 import Int8BertEncoder

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(graph_cache, "cached_graph", spy)
        Int8BertEncoder.from_directory(packaged_path(), threads=1, graph_dir=graph_dir())
    (key,) = found
    return key


def test_cached_graph_rebuilds_on_a_checksum_that_does_not_match(tmp_path: Path) -> None:
    builds: list[bytes] = []

    def build() -> bytes:
        builds.append(b"graph")
        return b"graph"

    assert graph_cache.cached_graph(tmp_path, "k", build) == (b"graph", True)
    assert graph_cache.cached_graph(tmp_path, "k", build) == (b"graph", False)
    (tmp_path / "k.onnx").write_bytes(b"grapH")  # same size, one byte changed
    assert graph_cache.cached_graph(tmp_path, "k", build) == (b"graph", True)
    (tmp_path / "k.sha256").unlink()
    assert graph_cache.cached_graph(tmp_path, "k", build) == (b"graph", True)
    assert len(builds) == 3


def test_the_weights_digest_follows_their_content_and_is_remembered(tmp_path: Path) -> None:
    memo = tmp_path / "digests"
    one, two = tmp_path / "one.safetensors", tmp_path / "two.safetensors"
    one.write_bytes(b"weights")
    two.write_bytes(b"weights")
    expected = hashlib.sha256(b"weights").hexdigest()
    assert graph_cache.file_digest(one, memo) == graph_cache.file_digest(two, memo) == expected
    (remembered,) = [p for p in memo.iterdir() if p.read_text() == expected][:1]
    remembered.write_text("0" * 64)  # the memo is read, not the file, while the file is unchanged
    assert "0" * 64 in {graph_cache.file_digest(one, memo), graph_cache.file_digest(two, memo)}
    one.write_bytes(b"other weights")  # a new size and mtime: hashed again
    assert graph_cache.file_digest(one, memo) == hashlib.sha256(b"other weights").hexdigest()


# -- where int8 cannot run ---------------------------------------------------------------------


def test_without_onnxruntime_it_runs_float32_and_says_so_once() -> None:
    code = (
        "import sys; sys.modules['onnxruntime'] = None\n"  # as if the extra were not installed
        "from retrieval_stage.local import EmbeddingReranker\n"
        "r = EmbeddingReranker(precision='int8')\n"
        "print(r.precision, r.backend)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RETRIEVAL_STAGE_EMBEDDING_BACKEND": ""},
        check=True,
    )
    assert done.stdout.split() == ["fp32", "numpy"]
    lines = [line for line in done.stderr.splitlines() if "precision_fallback" in line]
    assert len(lines) == 1
    assert "onnxruntime not installed" in lines[0]
    assert "retrieval-stage[int8]" in lines[0]


def test_on_a_cpu_without_vnni_it_runs_float32_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from retrieval_stage.local import EmbeddingReranker

    monkeypatch.setattr(int8_module, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    monkeypatch.setattr(embedding_module, "_said", set())  # as in a new process
    with capture_logs() as logs:
        reranker = EmbeddingReranker(precision="int8")
        EmbeddingReranker(precision="int8")  # said once, not per reranker
    assert reranker.precision == "fp32"
    (event,) = [e for e in logs if e["event"] == "embedding.precision_fallback"]
    assert event["requested"] == "int8"
    assert event["running"] == "fp32"
    assert "no VNNI" in event["missing"]


def test_on_a_cpu_without_bf16_units_it_runs_float32_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from retrieval_stage.local import EmbeddingReranker

    monkeypatch.setattr(bf16_module, "cpu_flags", lambda: frozenset({"avx512f", "avx512_vnni"}))
    monkeypatch.setattr(bf16_module, "importable", lambda module: True)
    monkeypatch.setattr(embedding_module, "_said", set())
    with capture_logs() as logs:
        reranker = EmbeddingReranker(precision="bf16")
    assert reranker.precision == "fp32"
    (event,) = [e for e in logs if e["event"] == "embedding.precision_fallback"]
    assert "no bf16 units" in event["missing"]


def test_a_precision_it_does_not_know_is_refused() -> None:
    from retrieval_stage.local import EmbeddingReranker

    with pytest.raises(ValueError, match="precision must be one of fp32, int8, bf16"):
        EmbeddingReranker(precision="int4")


def test_int8_with_the_sentence_transformers_backend_is_refused() -> None:
    pytest.importorskip("sentence_transformers")
    from retrieval_stage.local import EmbeddingReranker

    with pytest.raises(ValueError, match="not the sentence-transformers backend"):
        EmbeddingReranker(precision="int8", backend="sentence-transformers")


def test_a_graph_the_runtime_cannot_build_falls_back_to_float32_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need_int8()
    from retrieval_stage.local import EmbeddingReranker, bert_graph

    def refuse(*args: Any, **kwargs: Any) -> bytes:
        raise RuntimeError("quantizer refused the graph")

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing cached: it must build
    monkeypatch.setattr(bert_graph, "quantize", refuse)
    reranker = EmbeddingReranker(precision="int8")
    with capture_logs() as logs:
        ranked = reranker.rerank("sort a list", ["json.dumps", "list.sort sorts"], text=str)
    assert ranked[0][0] == "list.sort sorts"
    assert reranker.precision == "fp32"
    (event,) = [e for e in logs if e["event"] == "embedding.precision_fallback"]
    assert "quantizer refused the graph" in event["missing"]
