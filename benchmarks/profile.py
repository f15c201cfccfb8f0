"""Profile the hot path with pyinstrument against the benchmark's local server.

``python -m benchmarks.profile [--what traced|sampled-out|client] [--calls N] [--html PATH]``

Runs N sync calls of 50 documents (TEI shape, no server delay) and prints pyinstrument's call
tree of the main thread. The OTLP exporter works in the BatchSpanProcessor's thread, which
pyinstrument does not sample: ``python -m benchmarks --only breakdown`` times that part.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import guard
from .run import DOCS, QUERY, LocalServer, candidates, sampled_out_provider, traced_provider


def main(argv: list[str] | None = None) -> int:
    """Command line: profile one variant and print (or save) the call tree."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__)
    parser.add_argument("--what", choices=["traced", "sampled-out", "client"], default="traced")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--html", type=Path, help="write pyinstrument's HTML report here")
    args = parser.parse_args(argv)
    try:
        from pyinstrument import Profiler
    except ImportError:
        parser.error("pyinstrument is missing: pip install -e '.[bench]'")
    guard.install()
    from retrieval_stage import RerankClient, RerankStage

    server = LocalServer(max_seconds=600)
    provider = None
    try:
        client = RerankClient(server.url, batch_size=DOCS)
        cands = candidates(DOCS)
        texts = [c.text for c in cands]
        if args.what == "client":

            def call() -> object:
                return client.rerank(QUERY, texts)

        else:
            provider = traced_provider(server) if args.what == "traced" else None
            stage = RerankStage(client, tracer_provider=provider or sampled_out_provider())

            def call() -> object:
                return stage.run(QUERY, cands)

        for _ in range(50):
            call()
        profiler = Profiler(interval=0.0002)
        profiler.start()
        for _ in range(args.calls):
            call()
        if provider is not None:
            provider.force_flush()
        profiler.stop()
        if args.html:
            args.html.write_text(profiler.output_html())
        else:
            print(profiler.output_text(unicode=True, color=False))
        client.close()
    finally:
        if provider is not None:
            provider.shutdown()
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
