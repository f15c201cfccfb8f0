"""``python -m benchmarks.serve_precision``: the rerank server on the embedding model at a given
precision, for `benchmarks.sections.rerank_server` until ``serve --precision`` exists.

The same `retrieval_stage.server.run.serve` the command runs, with the few settings the
benchmark passes (``--port``, ``--model``, ``--max-client-batch-size``, ``--model-threads``,
``--log-level``) and ``--precision`` (``fp32``, ``int8``, ``bf16``), which becomes
`ServerSettings(precision=...)`.
"""

from __future__ import annotations

import argparse

from retrieval_stage.server import ServerSettings
from retrieval_stage.server.run import serve
from retrieval_stage.server.settings import PRECISIONS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model")
    parser.add_argument("--max-client-batch-size", type=int, default=128)
    parser.add_argument("--model-threads", type=int)
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32")
    args = parser.parse_args(argv)
    settings = ServerSettings(
        reranker="embedding",
        model=args.model,
        max_client_batch_size=args.max_client_batch_size,
        model_threads=args.model_threads,
        precision=args.precision,
    )
    return serve(settings, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    raise SystemExit(main())
