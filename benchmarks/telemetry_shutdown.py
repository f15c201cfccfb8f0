"""How long exit takes with the collector absent, down or stuck: traces and metrics together.

    python benchmarks/telemetry_shutdown.py            # all cases, a table on stdout
    python benchmarks/telemetry_shutdown.py --case silent --at-exit --log

Each case configures tracing and metrics, records one span and one metric point, then shuts
down (explicitly with `shutdown_telemetry`, or with `--at-exit` by leaving it to the exit hook)
and prints one JSON line: the case and the seconds shutdown took. Cases: ``none`` (no
exporter: ``OTEL_*_EXPORTER=none``), ``ok`` (a collector answering 200 at once), ``closed``
(a closed port), ``silent`` (a port this process listens on and never answers). The tests run
it in a subprocess.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's retrieval_stage

CASES = ("none", "ok", "closed", "silent")


class _Accepting(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return None


def _endpoint(case: str, keep: list[socket.socket]) -> str | None:
    if case == "none":
        return None
    if case == "ok":
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Accepting)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return f"http://user:secret@127.0.0.1:{server.server_address[1]}"
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    if case == "silent":
        s.listen(64)  # the kernel accepts; nobody ever reads or answers
        keep.append(s)
    else:
        s.close()
    return f"http://user:secret@127.0.0.1:{port}"


def run_case(case: str, *, at_exit: bool, log: bool, timeout: float) -> None:
    keep: list[socket.socket] = []
    endpoint = _endpoint(case, keep)
    if endpoint is None:
        os.environ["OTEL_TRACES_EXPORTER"] = "none"
        os.environ["OTEL_METRICS_EXPORTER"] = "none"
    from retrieval_stage.metrics import RerankMetrics
    from retrieval_stage.telemetry import (
        configure_logging,
        configure_metrics,
        configure_tracing,
        shutdown_telemetry,
    )

    if log:
        configure_logging()
    tracer_provider = configure_tracing(
        "shutdown-timing", endpoint=endpoint, export_timeout=10.0, shutdown_timeout=timeout
    )
    meter_provider = configure_metrics(
        "shutdown-timing", endpoint=endpoint, export_timeout=10.0, shutdown_timeout=timeout
    )
    with tracer_provider.get_tracer("timing").start_as_current_span("one"):
        pass
    RerankMetrics(meter_provider).record(
        duration_s=0.01, documents=3, batches=1, requests=1, retries=0, outcome="ok",
        fallback=False, top1_changed=True, model="m", provider="tei",
    )  # fmt: skip
    started = time.monotonic()
    if not at_exit:
        shutdown_telemetry(tracer_provider, meter_provider, timeout=timeout)
    print(json.dumps({"case": case, "shutdown_s": round(time.monotonic() - started, 3)}))
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=CASES)
    parser.add_argument("--at-exit", action="store_true")
    parser.add_argument("--log", action="store_true")
    parser.add_argument("--timeout", type=float, default=1.0)
    args = parser.parse_args()
    if args.case:
        run_case(args.case, at_exit=args.at_exit, log=args.log, timeout=args.timeout)
        return
    print("| case | explicit shutdown_telemetry (s) | whole process, exit hook (s) |")
    print("|---|---|---|")
    for case in CASES:
        explicit = subprocess.run(
            [sys.executable, __file__, "--case", case], capture_output=True, text=True, check=True
        )
        started = time.monotonic()
        subprocess.run(
            [sys.executable, __file__, "--case", case, "--at-exit"],
            capture_output=True,
            text=True,
            check=True,
        )
        whole = time.monotonic() - started
        print(f"| {case} | {json.loads(explicit.stdout)['shutdown_s']:.2f} | {whole:.2f} |")


if __name__ == "__main__":
    main()
