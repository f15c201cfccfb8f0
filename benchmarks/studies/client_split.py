"""A 50-candidate call through `RerankClient` against the shipped server, before and after
issue 41.

``python -m benchmarks.studies.client_split [--rounds R] [--calls N] [--threads T]``

Before: `serve` capped at TEI's 32 texts a request (the old default), the sync client sending
the two sub-batches (32 + 18) one after the other, as it did until issue 41 (the same code
path is kept as ``max_concurrency=1``). After: the same capped server with the sub-batches
sent concurrently (the server's batcher then scores both in one model batch), and `serve` at
its new default cap of 128, where the call is one request. Two real servers on loopback (the
numpy embedding backend, the packaged all-MiniLM-L6-v2, ``--model-threads T``), loaded
before any timing; the variants take turns call by call, so a change in the machine's load
hits all of them. Reported: the median and p90 wall time of one call per variant, and the
ratios to "before".
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from retrieval_stage import RerankClient

from .. import guard
from ..sections.rerank_server import QUERY, passage

DOCS = 50


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="calls per variant")
    parser.add_argument("--threads", type=int, default=1, help="the servers' --model-threads")
    args = parser.parse_args(argv)
    guard.install()
    from tests.server.served import server_env, start_server

    texts = [passage(i) for i in range(DOCS)]
    env = server_env(RETRIEVAL_STAGE_EMBEDDING_BACKEND="numpy")
    common = ("--model-threads", str(args.threads), "--log-level", "WARNING")
    with (
        tempfile.TemporaryDirectory(prefix="bench-client-split-") as tmp,
        start_server(Path(tmp), *common, "--max-client-batch-size", "32", env=env) as capped,
        start_server(Path(tmp), *common, env=env) as default,
        RerankClient(capped.url, batch_size=32, max_concurrency=1) as before,
        RerankClient(capped.url, batch_size=32) as split,
        RerankClient(default.url, batch_size=128) as one,
    ):
        variants: dict[str, Callable[[], object]] = {
            "before: cap 32, sub-batches in turn": lambda: before.rerank(QUERY, texts),
            "after: cap 32, sub-batches at once": lambda: split.rerank(QUERY, texts),
            "after: default cap 128, one request": lambda: one.rerank(QUERY, texts),
        }
        for call in variants.values():  # warm-up: first passes allocate
            call()
            call()
        times: dict[str, list[float]] = {name: [] for name in variants}
        for r in range(args.rounds):
            names = list(variants)
            names = names[r % len(names) :] + names[: r % len(names)]
            for name in names:
                started = time.perf_counter()
                variants[name]()
                times[name].append(time.perf_counter() - started)
    base = statistics.median(times["before: cap 32, sub-batches in turn"])
    print(f"{DOCS} candidates, {args.rounds} calls each, --model-threads {args.threads}")
    print("| variant | p50 (ms) | p90 (ms) | p50 / before |")
    print("|---|---|---|---|")
    for name, values in times.items():
        p50 = statistics.median(values)
        p90 = statistics.quantiles(values, n=10)[-1]
        print(f"| {name} | {p50 * 1000:.0f} | {p90 * 1000:.0f} | {p50 / base:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
