"""The quality signals' cost against another revision, in the same interleaved rounds.

``python -m benchmarks.studies.quality_base [--base REV] [--rounds R]``

`rerank_quality` of this tree and of `REV` (default ``main``; imported beside it with
`span_cost.import_base`) on the quality section's six 50-document scenarios
(`benchmarks/sections/quality.py`), as the stage calls it (recall order at hand). Both sides'
variants take turns in the same rounds (`quality._rounds`: `timeit` blocks of 50 calls, garbage
collection off in a block, the order rotating), so a machine shared with other processes slows
both alike; the figure is the minimum over rounds per call, the median beside it. Used for
issue 39: the seven signals (RBO and the score spread added) against main's five, within the
20 µs budget.
"""

from __future__ import annotations

import argparse
import importlib
import random
import statistics
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

from ..sections import quality
from .span_cost import import_base

RECORD = "histogram points (record_quality, SDK MeterProvider; outside the budget)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="main", help="a git revision to compare with")
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from retrieval_stage.metrics import RerankMetrics
    from retrieval_stage.models import recall_order
    from retrieval_stage.quality import rerank_quality

    with tempfile.TemporaryDirectory() as tmp:
        package = import_base(args.base, Path(tmp))
        base = importlib.import_module(package + ".quality")
        base_metrics = importlib.import_module(package + ".metrics")
        sides = {"this tree": rerank_quality, args.base: base.rerank_quality}
        variants: dict[str, Callable[[], object]] = {}
        for name, (given, scored) in quality._scenarios(random.Random(28)).items():
            order = recall_order(given)
            for side, fn in sides.items():
                variants[f"{name} | {side}"] = partial(
                    fn, given, scored, quality.TOP_K, recall=order
                )
        # Outside the budget: recording the signals as histogram points (the SDK's cost, paid
        # only with a MeterProvider), this tree's eight against the base's points.
        metrics_modules = {"this tree": RerankMetrics, args.base: base_metrics.RerankMetrics}
        providers = [MeterProvider(metric_readers=[InMemoryMetricReader()]) for _ in sides]
        given, scored = quality._scenarios(random.Random(28))["reorders"]
        for (side, fn), provider in zip(sides.items(), providers, strict=True):
            signals = fn(given, scored, quality.TOP_K, recall=recall_order(given))
            record = metrics_modules[side](provider).record_quality
            variants[f"{RECORD} | {side}"] = partial(record, signals, model="m", provider="p")
        for fn in variants.values():
            fn()
        wall, _ = quality._rounds(variants, dict.fromkeys(variants, quality.CALLS), args.rounds)
    print(f"µs per 50-document call, min over {args.rounds} rounds (median); budget 20 µs")
    print(f"| scenario | this tree | {args.base} |")
    print("|---|---:|---:|")
    for name in [*quality._scenarios(random.Random(28)), RECORD]:
        cells = []
        for side in sides:
            times = wall[f"{name} | {side}"]
            cells.append(f"{min(times) * 1e6:.1f} ({statistics.median(times) * 1e6:.1f})")
        print(f"| {name} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
