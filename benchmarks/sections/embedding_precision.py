"""The packaged MiniLM in int8 (onnxruntime) and bf16 (OpenVINO) against numpy float32, both
cores, one run (issue 48).

Two workloads, each timed round by round with the precisions interleaved (the order turned
every round), so the machine's load hits every side of each ratio alike:

- a 50-document rerank: `EmbeddingReranker.rerank` of the bundled eval's first query and its
  50 candidates (51 texts: the query, then the documents in one call), no embedding cache;
- the bundled corpus: `embed_documents` of its 1,538 documents (what the tour's first ``eval``
  and dense recall embed).

Every reranker runs on two threads (``threads=2``: numpy's two batches side by side with one
BLAS thread each; onnxruntime's two intra-op threads; OpenVINO's two). Reported per workload:
CPU seconds (``process_time``, every thread) and wall seconds per round for each precision, the
per-round ratios to fp32 (median, min, max), and the 1-minute load average at each round's
start; and the lowest cosine between a corpus document's embedding at each precision and in
float32. Where the time goes: the tokenizer's share of a rerank (the same texts tokenized alone).

    python -m benchmarks --only embedding_precision
    python -m benchmarks.sections.embedding_precision [--quick] [--json PATH]

A precision whose extra or CPU units are missing is left out, and the section says so.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from ..report import Row, verdict

SCALE = {"precision_rounds": (3, 1), "precision_corpus_step": (1, 16)}
"""Rounds of each workload; every n-th corpus document (``--quick``: a sixteenth)."""

THREADS = 2


def _timed(run: Any) -> tuple[float, float, Any]:
    gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    value = run()
    return time.process_time() - cpu, time.perf_counter() - wall, value


def _ratios(a: list[float], b: list[float]) -> dict[str, float]:
    ratios = sorted(x / y for x, y in zip(a, b, strict=True))
    return {"median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1]}


def run(rounds: int, corpus_step: int = 1) -> dict[str, Any]:
    """Both workloads, `rounds` rounds each, interleaved; raw samples and ratios."""
    import numpy as np

    from benchmarks.studies.embedding_backends import read_first_pool
    from retrieval_stage.evaluation.corpus import load_corpus
    from retrieval_stage.local import EmbeddingReranker, bf16, int8

    left_out = {p: m.unavailable() for p, m in (("int8", int8), ("bf16", bf16))}
    chosen = ["fp32", *(p for p, missing in left_out.items() if missing is None)]
    if len(chosen) == 1:
        return {"skipped": f"neither int8 nor bf16 can run here: {left_out}"}
    query, pool = read_first_pool()
    corpus = [d.text for d in load_corpus()][::corpus_step]
    rerankers = {
        p: EmbeddingReranker(backend="numpy", precision=p, threads=THREADS) for p in chosen
    }
    load_s = {}
    for name, reranker in rerankers.items():
        load_s[name] = _timed(reranker.load)[1]
        reranker.rerank(query, pool[:4], text=str)  # warm: first-run allocations, thread start
    tokenizer = rerankers["fp32"].tokenizer
    samples: dict[str, dict[str, dict[str, list[float]]]] = {
        w: {p: {"cpu": [], "wall": []} for p in rerankers} for w in ("rerank", "corpus")
    }
    loads: dict[str, list[float]] = {"rerank": [], "corpus": []}
    vectors: dict[str, Any] = {}
    for r in range(rounds):
        order = list(rerankers) if r % 2 == 0 else list(reversed(rerankers))
        loads["rerank"].append(os.getloadavg()[0])
        for name in order:
            cpu, wall, _ = _timed(lambda n=name: rerankers[n].rerank(query, pool, text=str))
            samples["rerank"][name]["cpu"].append(cpu)
            samples["rerank"][name]["wall"].append(wall)
        loads["corpus"].append(os.getloadavg()[0])
        for name in order:
            cpu, wall, vectors[name] = _timed(lambda n=name: rerankers[n].embed_documents(corpus))
            samples["corpus"][name]["cpu"].append(cpu)
            samples["corpus"][name]["wall"].append(wall)
    tokenize_cpu = _timed(lambda: tokenizer.encode_batch([query, *pool], add_special_tokens=True))[
        0
    ]
    out: dict[str, Any] = {
        "precisions": chosen,
        "left_out": {p: m for p, m in left_out.items() if m is not None},
        "rounds": rounds,
        "threads": THREADS,
        "documents": len(pool),
        "corpus_documents": len(corpus),
        "load_seconds": load_s,
        "load_average": loads,
        "raw": samples,
        "lowest_cosine": {
            p: float(np.sum(vectors[p] * vectors["fp32"], axis=1).min()) for p in chosen[1:]
        },
        "tokenize_cpu_s": tokenize_cpu,
    }
    for workload, by in samples.items():
        for clock in ("cpu", "wall"):
            for name in by:
                out[f"{workload}_{clock}_{name}_median"] = statistics.median(by[name][clock])
                if name != "fp32":
                    out[f"{workload}_{clock}_{name}_ratio"] = _ratios(
                        by[name][clock], by["fp32"][clock]
                    )
    return out


def measure(server: Any, scale: Any) -> dict[str, Any]:
    """The section (the benchmark's fake server is not used)."""
    return run(scale.precision_rounds, scale.precision_corpus_step)


def _ratio(result: dict[str, Any], key: str) -> str:
    r = result[key]
    return f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})"


def targets(result: dict[str, Any], results: dict[str, Any]) -> list[Row]:
    """int8 (bf16) <= 0.5x numpy fp32, CPU and wall, on the rerank and the corpus (issue 48)."""
    if "skipped" in result:
        return [("int8 / fp32 embedding model", f"not measured: {result['skipped']}", "", "")]
    out: list[Row] = []
    for name in result["precisions"][1:]:
        for workload, what in (("rerank", "50-doc rerank"), ("corpus", "corpus")):
            for clock in ("cpu", "wall"):
                key = f"{workload}_{clock}_{name}_ratio"
                ok = result[key]["median"] <= 0.5
                out.append(
                    (f"{name} / fp32: {what}, {clock}", _ratio(result, key), "<= 0.5x", verdict(ok))
                )
        low = result["lowest_cosine"][name]
        out.append(
            (f"{name} vs fp32: lowest corpus cosine", f"{low:.5f}", ">= 0.99", verdict(low >= 0.99))
        )
    return out


def rows(result: dict[str, Any], results: dict[str, Any]) -> list[Row]:
    if "skipped" in result:
        return []
    out: list[Row] = []
    for workload in ("rerank", "corpus"):
        loads = ", ".join(f"{x:.1f}" for x in result["load_average"][workload])
        names = result["precisions"]
        cpu = " / ".join(f"{result[f'{workload}_cpu_{n}_median']:.2f}" for n in names)
        wall = " / ".join(f"{result[f'{workload}_wall_{n}_median']:.2f}" for n in names)
        out.append(
            (
                f"{workload}: {' / '.join(names)} CPU s; wall s "
                f"(median of {result['rounds']} rounds)",
                f"{cpu}; {wall} (load {loads})",
                "(context)",
                "",
            )
        )
    for name in result["precisions"][1:]:
        share = result["tokenize_cpu_s"] / result[f"rerank_cpu_{name}_median"]
        out.append(
            (f"{name} rerank: the tokenizer's share of CPU", f"{share:.0%}", "(context)", "")
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run, not a measurement")
    parser.add_argument("--json", type=Path, help="also write every raw number here")
    parser.add_argument("--rounds", type=int, help="rounds of each workload (default 3)")
    args = parser.parse_args(argv)
    full, quick = SCALE["precision_rounds"]
    rounds = args.rounds or (quick if args.quick else full)
    step = SCALE["precision_corpus_step"][1 if args.quick else 0]
    result = run(rounds, step)
    for row in (*targets(result, {}), *rows(result, {})):
        print(" | ".join(row))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
