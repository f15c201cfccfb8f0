"""The server's settings, checked once where they enter (`ServerSettings`)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from .. import validate

__all__ = ["PRECISIONS", "RERANKERS", "ServerSettings", "is_loopback"]

RERANKERS = ("embedding", "local", "lexical")
"""``--reranker`` values: the packaged embedding model (default), a cross-encoder, lexical."""

PRECISIONS = ("fp32", "int8", "bf16")
"""``precision`` values (`retrieval_stage.local.embedding.PRECISIONS`, not imported here: the
settings must not import the model's packages)."""


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and any loopback address (127.0.0.0/8, ::1)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: only "localhost" is known to stay on this machine
        return False


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """What the server serves and how it batches. Defaults follow TEI where TEI has the knob,
    but for the client cap.

    `max_client_batch_size`: texts one request may hold (128, where TEI's default is 32: a
    50-100-candidate request, the common size, is served in one call, as clients that cannot
    split need; more are refused with TEI's wording, so clients learn the cap).
    `max_batch_tokens` (TEI's 16384) and `max_batch_pairs` bound one model batch.
    `max_request_tokens` bounds one request's work (its texts' tokens as the model reads them,
    and the query's where it is read apart; a lexical "token" is a word): one more is refused
    with TEI's 422 before it is queued, so no request holds the model thread longer than that
    much work takes. `max_queue` requests may
    wait (TEI's ``--max-concurrent-requests``, 512); one more gets 429. `batch_wait_ms` is how
    long an idle model waits for more requests to share a batch. `payload_limit` bounds a
    request body in bytes (TEI's 2,000,000), `body_timeout` the seconds it may take to arrive
    after the request head (then 408: a client trickling its body cannot hold a handler and a
    connection for ever; the head itself is bounded by the connection guard's
    ``header_timeout``). `model_batch_size` is the model's own forward-pass
    size.
    `embedding_cache` keeps that many document embeddings (0: none). `model_threads` sets
    torch's threads for this process (None: torch's default, one per core); on a machine
    whose cores are busy with other work, 1 is much faster than several fighting for them.
    `precision` is the embedding model's (``fp32``; ``int8``: the ``[int8]`` extra's
    onnxruntime graph; ``bf16``: the ``[bf16]`` extra's OpenVINO; either about half the CPU
    time; where it cannot run, float32 runs and says why once, and ``/info``'s
    ``model_dtype`` says what runs).
    `trace_content` puts the query and the texts on the RERANKER span the server writes for a
    caller without one of its own (``--trace-content``; off: positions and scores only, since
    the texts may be private and the caller did not ask for them to be kept).
    """

    reranker: str = "embedding"
    model: str | None = None
    max_client_batch_size: int = 128
    max_batch_tokens: int = 16384
    max_batch_pairs: int = 256
    max_request_tokens: int = 131_072
    max_queue: int = 512
    batch_wait_ms: float = 2.0
    payload_limit: int = 2_000_000
    body_timeout: float = 30.0
    model_batch_size: int = 32
    embedding_cache: int = 0
    model_threads: int | None = None
    trace_content: bool = False
    precision: str = "fp32"

    def __post_init__(self) -> None:
        if self.reranker not in RERANKERS:
            raise ValueError(
                f"reranker must be one of {', '.join(RERANKERS)}, got {self.reranker!r}"
            )
        for name in (
            "max_client_batch_size",
            "max_batch_tokens",
            "max_batch_pairs",
            "max_request_tokens",
            "max_queue",
            "payload_limit",
            "model_batch_size",
        ):
            validate.count(getattr(self, name), name)
        if self.precision not in PRECISIONS:
            raise ValueError(
                f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}"
            )
        if self.precision != "fp32" and self.reranker != "embedding":
            raise ValueError(
                f"precision {self.precision!r} applies to the embedding reranker only, "
                f"not {self.reranker!r}"
            )
        if not isinstance(self.trace_content, bool):
            raise ValueError(f"trace_content must be a boolean, got {self.trace_content!r}")
        if self.model_threads is not None:
            validate.count(self.model_threads, "model_threads")
        if isinstance(self.embedding_cache, bool) or self.embedding_cache < 0:
            raise ValueError(f"embedding_cache must be >= 0, got {self.embedding_cache!r}")
        body_timeout = validate.finite_number(self.body_timeout, "body_timeout")
        if not body_timeout > 0:
            raise validate.InvalidSetting(
                "body_timeout", f"must be > 0 seconds, got {body_timeout!r}"
            )
        wait = validate.finite_number(self.batch_wait_ms, "batch_wait_ms")
        if not 0 <= wait <= 1000:
            raise ValueError(f"batch_wait_ms must be between 0 and 1000, got {wait!r}")
