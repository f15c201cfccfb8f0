"""Rerank metrics through the OpenTelemetry metrics API.

The library only asks for a meter; it never installs a MeterProvider. Until the application
configures one (for example with :func:`configure_metrics`), every instrument is a no-op, so a
library user who does not want metrics pays almost nothing for them.

Instrument names follow the OpenTelemetry naming conventions and share their vocabulary with the
span attributes the stage emits (``retrieval_stage.documents``, ``retrieval_stage.fallback``, ...).
The collector's Prometheus exporter turns them into ``retrieval_stage_rerank_duration_seconds_*``,
``retrieval_stage_rerank_requests_total`` and so on; the Grafana dashboard queries those names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry import metrics

from .spans.keys import ATTR_PROVIDER

__all__ = ["RerankMetrics"]

METER_NAME = "retrieval_stage"

DURATION = "retrieval_stage.rerank.duration"
DOCUMENTS = "retrieval_stage.rerank.documents"
BATCHES = "retrieval_stage.rerank.batches"
REQUESTS = "retrieval_stage.rerank.requests"
RETRIES = "retrieval_stage.rerank.retries"
FALLBACKS = "retrieval_stage.rerank.fallbacks"
TOP1_CHANGES = "retrieval_stage.rerank.top1_changes"

ATTR_MODEL = "retrieval_stage.model"
ATTR_OUTCOME = "retrieval_stage.outcome"

# A local cross-encoder answers a small batch in ~5 ms; a remote one under load, with retries,
# can take the whole 30 s deadline. The SDK's default boundaries (0..10000, meant for
# milliseconds) would put every call in the first two buckets.
DURATION_BUCKETS_S: Sequence[float] = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 30.0,
)  # fmt: skip
# Candidates per call: recall stages hand over tens to a few hundred documents.
DOCUMENT_BUCKETS: Sequence[float] = (1, 5, 10, 20, 50, 100, 200, 500, 1000)
# Provider sub-batches per call (TEI splits at 32 by default, others at 100-1000).
BATCH_BUCKETS: Sequence[float] = (1, 2, 3, 4, 5, 8, 16, 32)


class RerankMetrics:
    """Rerank instruments; no-ops unless a MeterProvider is configured.

    One instance per stage is enough: instruments are created once and ``record`` only adds
    data points. With the API's default provider the meter is a proxy, so metrics start flowing
    as soon as the application installs a real global provider, even after this was built.
    """

    def __init__(self, meter_provider: metrics.MeterProvider | None = None) -> None:
        provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        meter = provider.get_meter(METER_NAME)
        self._duration = meter.create_histogram(
            DURATION,
            unit="s",
            description="Wall time of one rerank call, retries and fallback included.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )
        self._documents = meter.create_histogram(
            DOCUMENTS,
            unit="{document}",
            description="Candidates handed to one rerank call.",
            explicit_bucket_boundaries_advisory=DOCUMENT_BUCKETS,
        )
        self._batches = meter.create_histogram(
            BATCHES,
            unit="{batch}",
            description="Provider sub-batches one rerank call was split into.",
            explicit_bucket_boundaries_advisory=BATCH_BUCKETS,
        )
        self._requests = meter.create_counter(
            REQUESTS, unit="{request}", description="HTTP requests sent to the rerank provider."
        )
        self._retries = meter.create_counter(
            RETRIES, unit="{retry}", description="Requests that were retries of a failed one."
        )
        self._fallbacks = meter.create_counter(
            FALLBACKS,
            unit="{fallback}",
            description="Rerank calls that degraded to recall order instead of failing.",
        )
        self._top1_changes = meter.create_counter(
            TOP1_CHANGES,
            unit="{change}",
            description="Reranked calls whose first result differs from recall's first.",
        )

    def record(
        self,
        *,
        duration_s: float,
        documents: int,
        batches: int,
        requests: int,
        retries: int,
        outcome: str,
        fallback: bool,
        top1_changed: bool | None,
        model: str | None,
        provider: str | None,
    ) -> None:
        """Record one finished rerank call.

        ``outcome`` is ``"ok"``, ``"fallback"`` or ``"error"``; it and the model and provider
        (omitted when None) label every point. The fallback counter is added to even when
        ``fallback`` is False, and the top-1 counter whenever ``top1_changed`` is known, so
        that their series exist and a rate reads 0 rather than "no data". ``top1_changed`` is
        None when nothing was reranked (empty input, fallback, error).
        """
        attributes: dict[str, str] = {ATTR_OUTCOME: outcome}
        if model is not None:
            attributes[ATTR_MODEL] = model
        if provider is not None:
            attributes[ATTR_PROVIDER] = provider
        self._duration.record(duration_s, attributes)
        self._documents.record(documents, attributes)
        self._batches.record(batches, attributes)
        self._requests.add(requests, attributes)
        self._retries.add(retries, attributes)
        self._fallbacks.add(1 if fallback else 0, attributes)
        if top1_changed is not None:
            self._top1_changes.add(1 if top1_changed else 0, attributes)


def __getattr__(name: str) -> Any:
    """`configure_metrics` lives in `retrieval_stage.telemetry.metrics` (set-up, for
    applications); it is still importable from here, loaded only when asked for."""
    if name == "configure_metrics":
        from .telemetry.metrics import configure_metrics

        return configure_metrics
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
