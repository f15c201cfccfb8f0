"""What the label-free quality signals cost per rerank call (issue 28's budget: <= 20 us at 50).

Run with ``python -m benchmarks.quality`` from the repository root (``--json FILE`` keeps the
raw numbers, ``--quick`` is a smoke run). Pure CPU, no server: `rerank_quality` on 50 candidates
with the orders a stage sees (the reranker reorders, keeps recall's order, collapses every score
to one value, or is given no recall scores), timed round by round next to what the stage already
does per call on the same input (`map_results` and `recall_order`) and next to
``scipy.stats.kendalltau`` on the same pairs. Variants are interleaved within each round; the
median over rounds is reported with its range, and the ratio to `map_results` is taken within a
round. Nothing here asserts: the budget is reported as met or not met.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from retrieval_stage import Candidate
from retrieval_stage.models import recall_order
from retrieval_stage.quality import rerank_quality
from retrieval_stage.stage import map_results

DOCS = 50
BUDGET_US = 20.0


def _scenarios(rng: random.Random) -> dict[str, tuple[list[Candidate], list[tuple[int, float]]]]:
    """name -> (candidates in recall order, the reranker's (position, score) best first)."""
    recall_scores = sorted((rng.random() for _ in range(DOCS)), reverse=True)
    given = [Candidate(f"d{i}", "x" * 300, score=s) for i, s in enumerate(recall_scores)]
    unscored = [Candidate(c.id, c.text) for c in given]

    def ranked(scores: list[float]) -> list[tuple[int, float]]:
        return sorted(enumerate(scores), key=lambda p: (-p[1], p[0]))

    shuffled = [rng.random() for _ in range(DOCS)]
    return {
        "reorders": (given, ranked(shuffled)),
        "keeps recall order": (given, ranked([1.0 - i / DOCS for i in range(DOCS)])),
        "scores collapsed (all 0.5)": (given, ranked([0.5] * DOCS)),
        "no recall scores": (unscored, ranked(shuffled)),
    }


def _per_call_us(fn: Callable[[], object], calls: int) -> float:
    """CPU time (this process) per call: time other processes take on a shared machine is
    not charged, though their cache and core contention still is."""
    started = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - started) / calls * 1e6


def run(rounds: int, calls: int) -> dict[str, Any]:
    from scipy import stats

    scenarios = _scenarios(random.Random(28))
    per_round: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, (given, scored) in scenarios.items():
            results = [(given[i], s) for i, s in scored]
            x = [given[i].score or 0.0 for i, _ in scored]
            y = [s for _, s in scored]
            order = recall_order(given)
            timed = {
                # As the stage calls it: it has recall order already (for top1_changed).
                f"rerank_quality: {name}": lambda g=given, s=scored, o=order: rerank_quality(
                    g, s, 10, recall=o
                ),
                f"rerank_quality, recall order computed: {name}": (
                    lambda g=given, s=scored: rerank_quality(g, s, 10)
                ),
                f"map_results: {name}": lambda g=given, r=results: map_results(g, r, 10),
                f"recall_order: {name}": lambda g=given: recall_order(g),
                f"scipy.stats.kendalltau: {name}": lambda x=x, y=y: stats.kendalltau(x, y),
            }
            measured = {label: _per_call_us(fn, calls) for label, fn in timed.items()}
            for label, value in measured.items():
                per_round.setdefault(label, []).append(value)
            ratios.setdefault(name, []).append(
                measured[f"rerank_quality: {name}"] / measured[f"map_results: {name}"]
            )
    summary = {
        label: {"median_us": statistics.median(v), "min_us": min(v), "max_us": max(v)}
        for label, v in per_round.items()
    }
    # The budget must hold for the slowest scenario.
    worst = max(summary[f"rerank_quality: {name}"]["median_us"] for name in scenarios)
    return {
        "docs": DOCS,
        "rounds": rounds,
        "calls_per_round": calls,
        "python": sys.version.split()[0],
        "per_call": summary,
        "ratio_to_map_results": {n: statistics.median(r) for n, r in ratios.items()},
        "budget_us": BUDGET_US,
        "worst_median_us": worst,
        "budget_met": worst <= BUDGET_US,
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        f"quality signals, {result['docs']} candidates, median of {result['rounds']} rounds "
        f"(Python {result['python']})",
        "",
        "| what | µs per call (median) | range |",
        "|---|---:|---|",
    ]
    for label, row in result["per_call"].items():
        lines.append(
            f"| {label} | {row['median_us']:.1f} | {row['min_us']:.1f}-{row['max_us']:.1f} |"
        )
    lines += ["", "| scenario | rerank_quality / map_results |", "|---|---:|"]
    for name, ratio in result["ratio_to_map_results"].items():
        lines.append(f"| {name} | {ratio:.2f} |")
    verdict = "met" if result["budget_met"] else "NOT met"
    lines += [
        "",
        f"budget <= {result['budget_us']:.0f} µs: {verdict} "
        f"(slowest scenario {result['worst_median_us']:.1f} µs)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the raw numbers here")
    parser.add_argument("--quick", action="store_true", help="a smoke run, not a measurement")
    args = parser.parse_args(argv)
    result = run(rounds=3 if args.quick else 15, calls=200 if args.quick else 2000)
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
