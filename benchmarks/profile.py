"""Profile the hot paths against the benchmark's local server.

``python -m benchmarks.profile [--what WHAT] [--calls N] [--delay-ms MS] [--html PATH]``

WHAT is one of:

- ``traced``, ``sampled-out``, ``client``: N sync calls of 50 documents (TEI shape);
- ``async-raw``, ``async-raw-aiohttp``, ``async-client``, ``async-sampled-out``,
  ``async-traced``: N async calls at 64 concurrent (raw httpx ``AsyncClient`` or raw
  ``aiohttp.ClientSession`` + ``json.loads``, ``AsyncRerankClient.rerank``, or
  ``RerankStage.arun``), behind ``--delay-ms`` of server latency (default 20, the throughput
  target's setting).

pyinstrument prints the main thread's call tree. It does not sample the BatchSpanProcessor's
exporter thread; for CPU in every thread run the workload under py-spy and summarise it::

    py-spy record --rate 500 --format raw -o /tmp/spy.txt -- \\
        python -m benchmarks.profile --what traced --no-profiler
    python -m benchmarks.profile --summarize /tmp/spy.txt [--under Thread.run]

``--summarize`` prints the top functions by own samples and by inclusive samples, as shares
of all samples (idle threads excluded, since py-spy records only active ones by default).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from . import guard
from .fixtures import DOCS, QUERY, LocalServer, candidates, sampled_out_provider, traced_provider
from .harness import drive

SYNC = ("traced", "sampled-out", "client")
ASYNC = ("async-raw", "async-raw-aiohttp", "async-client", "async-sampled-out", "async-traced")


def summarize(path: Path, top: int = 25, under: str | None = None) -> str:
    """Top functions of a py-spy ``--format raw`` file (collapsed stacks, one count per line).

    `under` keeps only stacks with a frame containing that text (``Thread.run`` for the
    exporter thread, ``drive`` for the async workload), leaving start-up imports out.
    """
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or (under is not None and under not in stack):
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    lines = [f"{total} samples", "", "own samples:"]
    lines += [f"{100 * n / total:5.1f}%  {frame}" for frame, n in own.most_common(top)]
    lines += ["", "inclusive samples:"]
    lines += [f"{100 * n / total:5.1f}%  {frame}" for frame, n in inclusive.most_common(top)]
    return "\n".join(lines)


def _sync_call(what: str, server: LocalServer, client: Any, provider: Any) -> Callable[[], object]:
    from retrieval_stage import RerankStage

    cands = candidates(DOCS)
    texts = [c.text for c in cands]
    if what == "client":
        return lambda: client.rerank(QUERY, texts)
    stage = RerankStage(client, tracer_provider=provider or sampled_out_provider())
    return lambda: stage.run(QUERY, cands)


def _async_workload(what: str, base_url: str, provider: Any, calls: int) -> Callable[[], None]:
    """One asyncio.run of `calls` calls at 64 concurrent, built fresh inside its loop."""
    import httpx

    from retrieval_stage import AsyncRerankClient, RerankStage

    cands = candidates(DOCS)
    texts = [c.text for c in cands]

    async def main() -> None:
        fn: Callable[[], Awaitable[object]]
        close: Callable[[], Awaitable[object]]
        if what == "async-raw":
            http = httpx.AsyncClient()

            async def raw() -> object:
                response = await http.post(
                    base_url + "/rerank", json={"query": QUERY, "texts": texts}
                )
                return json.loads(response.content)

            fn, close = raw, http.aclose
        elif what == "async-raw-aiohttp":
            import aiohttp

            session = aiohttp.ClientSession()
            payload = {"query": QUERY, "texts": texts}

            async def raw_aiohttp() -> object:
                async with session.post(base_url + "/rerank", json=payload) as response:
                    return json.loads(await response.read())

            fn, close = raw_aiohttp, session.close
        elif what == "async-client":
            client = AsyncRerankClient(base_url, batch_size=DOCS)

            async def rerank() -> object:
                return await client.rerank(QUERY, texts)

            fn, close = rerank, client.aclose
        else:
            stage = RerankStage(
                AsyncRerankClient(base_url, batch_size=DOCS),
                tracer_provider=provider or sampled_out_provider(),
            )

            async def arun() -> object:
                return await stage.arun(QUERY, cands)

            fn, close = arun, stage.reranker.aclose
        try:
            await drive(fn, calls, 64)
        finally:
            await close()

    return lambda: asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    """Command line: profile one variant and print (or save) the call tree."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__)
    parser.add_argument("--what", choices=SYNC + ASYNC, default="traced")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--delay-ms", type=int, default=20, help="async variants only")
    parser.add_argument("--html", type=Path, help="write pyinstrument's HTML report here")
    parser.add_argument("--no-profiler", action="store_true", help="just run (for py-spy)")
    parser.add_argument("--summarize", type=Path, help="summarise a py-spy raw file and exit")
    parser.add_argument("--under", help="with --summarize: only stacks through this frame")
    args = parser.parse_args(argv)
    if args.summarize:
        print(summarize(args.summarize, under=args.under))
        return 0
    guard.install()
    from retrieval_stage import RerankClient

    server = LocalServer(max_seconds=600)
    provider = None
    client = None
    try:
        if "traced" in args.what:
            provider = traced_provider(server)
        if args.what in SYNC:
            client = RerankClient(server.url, batch_size=DOCS)
            call = _sync_call(args.what, server, client, provider)
            for _ in range(50):
                call()

            def workload() -> None:
                for _ in range(args.calls):
                    call()

        else:
            base = server.delayed(args.delay_ms) if args.delay_ms else server.url
            _async_workload(args.what, base, provider, 256)()  # warm-up
            workload = _async_workload(args.what, base, provider, args.calls)
        if provider is not None:
            provider.force_flush()
        if args.no_profiler:
            workload()
            if provider is not None:
                provider.force_flush()
            return 0
        try:
            from pyinstrument import Profiler
        except ImportError:
            parser.error("pyinstrument is missing: pip install -e '.[bench]'")
        profiler = Profiler(interval=0.0002, async_mode="disabled")
        profiler.start()
        workload()
        if provider is not None:
            provider.force_flush()
        profiler.stop()
        if args.html:
            args.html.write_text(profiler.output_html())
        else:
            print(profiler.output_text(unicode=True, color=False))
    finally:
        if client is not None:
            client.close()
        if provider is not None:
            provider.shutdown()
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
