"""Rerank metrics through the OpenTelemetry metrics API.

The library only asks for a meter; it never installs a MeterProvider. Until the application
configures one (for example with `retrieval_stage.telemetry.configure_metrics`), every
instrument is a no-op, so a library user who does not want metrics pays almost nothing for them.
`metrics_configured` and `global_meter_provider` tell whether one is set, cheaply enough to
ask on every call. The instrument names are in `retrieval_stage.spans.keys`.

Instrument names follow the OpenTelemetry naming conventions and share their vocabulary with the
span attributes the stage emits (``retrieval_stage.documents``, ``retrieval_stage.fallback``, ...).
The collector's Prometheus exporter turns them into ``retrieval_stage_rerank_duration_seconds_*``,
``retrieval_stage_rerank_requests_total`` and so on; the Grafana dashboard queries those names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from opentelemetry import metrics
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.metrics import _internal as _metrics_api
from opentelemetry.metrics._internal import _ProxyMeterProvider
from opentelemetry.util.types import AttributeValue

from ._version import __version__
from .spans.keys import (
    ATTR_MODEL,
    ATTR_OUTCOME,
    ATTR_PROVIDER,
    ATTR_TIER,
    METER_NAME,
    METRIC_BATCHES,
    METRIC_BREAKER_OPENINGS,
    METRIC_DOCUMENTS,
    METRIC_DURATION,
    METRIC_FALLBACKS,
    METRIC_GEN_AI_CLIENT_OPERATION_DURATION,
    METRIC_KENDALL_TAU,
    METRIC_KENDALL_TAU_DEPRECATED,
    METRIC_MAX_PROMOTION,
    METRIC_RBO,
    METRIC_REQUESTS,
    METRIC_RETRIES,
    METRIC_SCORE_MARGIN,
    METRIC_SCORE_SPREAD,
    METRIC_TIER_CALLS,
    METRIC_TOP1_CHANGES,
    METRIC_TOP_SCORE,
    METRIC_TOPK_OVERLAP,
)

if TYPE_CHECKING:
    from .quality import RerankQuality

__all__ = ["ChainMetrics", "RerankMetrics", "global_meter_provider", "metrics_configured"]

# A local cross-encoder answers a small batch in ~5 ms; a remote one under load, with retries,
# can take the whole 30 s deadline. The SDK's default boundaries (0..10000, meant for
# milliseconds) would put every call in the first two buckets.
DURATION_BUCKETS_S: Sequence[float] = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 30.0,
)  # fmt: skip
# OpenTelemetry's advice for ``gen_ai.client.operation.duration`` (its GenAI metrics
# conventions), kept as given so the histogram compares with other GenAI clients'.
GEN_AI_DURATION_BUCKETS_S: Sequence[float] = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
# Candidates per call: recall stages hand over tens to a few hundred documents.
DOCUMENT_BUCKETS: Sequence[float] = (1, 5, 10, 20, 50, 100, 200, 500, 1000)
# Provider sub-batches per call (TEI splits at 32 by default, others at 100-1000).
BATCH_BUCKETS: Sequence[float] = (1, 2, 3, 4, 5, 8, 16, 32)
# The quality signals (retrieval_stage/quality.py). OpenTelemetry histograms take no negative
# values (the SDK drops them with a warning), so the tau histogram records (1 + tau) / 2, the
# share of candidate pairs left in recall's order when nothing ties: 1 unchanged, 0.5
# unrelated, 0 reversed; a negative top score (raw cross-encoder logits) is counted as 0, in
# the lowest bucket. The span attributes keep the exact values. The last boundary below 1
# (0.99995, tau 0.9999) puts tau = 1 and overlap = 1 (nothing changed) alone in the top
# bucket, and the margin's first boundary (0.0001) puts tied top scores alone in the lowest:
# the alert rules (telemetry/rerank-quality.rules.yml) count those buckets. A single swap among
# more than ~140 candidates moves tau by less than 0.0001, so it reads as unchanged there.
TAU_BUCKETS: Sequence[float] = (  # as (1 + tau) / 2: tau -0.5, 0, 0.2, ... 0.99, 0.9999
    0.25, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.975, 0.995, 0.99995,
)  # fmt: skip
TOPK_OVERLAP_BUCKETS: Sequence[float] = (
    0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.9999,
)  # fmt: skip
PROMOTION_BUCKETS: Sequence[float] = (1, 2, 3, 5, 10, 15, 20, 30, 50, 100, 200, 500, 1000)
# Scores are model-specific: most providers' relevance scores are sigmoids in [0, 1], cosine
# scores lie in [-1, 1], raw cross-encoder logits in about [-12, 12].
TOP_SCORE_BUCKETS: Sequence[float] = (
    0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip
MARGIN_BUCKETS: Sequence[float] = (
    0.0001, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
)  # fmt: skip
# Rank-biased overlap lies in [0, 1] like the overlap; its last boundary below 1 puts an
# unchanged top k (RBO 1) alone in the top bucket, as the overlap's does.
RBO_BUCKETS: Sequence[float] = TOPK_OVERLAP_BUCKETS
# The spread of the top-k scores is at least the margin and reaches ~20 for raw logits; the
# first boundary puts a top k scored all alike (collapse across the head) alone in the lowest.
SPREAD_BUCKETS: Sequence[float] = (
    0.0001, 0.001, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 20.0,
)  # fmt: skip


class RerankMetrics:
    """Rerank instruments; no-ops unless a MeterProvider is configured.

    One instance per stage is enough: instruments are created once and ``record`` only adds
    data points. With the API's default provider the meter is a proxy, so metrics start flowing
    as soon as the application installs a real global provider, even after this was built.

    `genai` True (the stage's GenAI opt-in, `retrieval_stage.spans.genai`) also creates
    OpenTelemetry's ``gen_ai.client.operation.duration`` histogram, which
    `record_operation_duration` records; without it the instrument does not exist.
    """

    def __init__(
        self, meter_provider: metrics.MeterProvider | None = None, *, genai: bool = False
    ) -> None:
        self._meter_provider = meter_provider
        self._given_enabled = meter_provider is not None and metrics_configured(meter_provider)
        self._global_seen: metrics.MeterProvider | None = None
        self._global_enabled = False
        # The API's own lookup: `meter_provider`, else the global one (a proxy until set).
        meter = metrics.get_meter(METER_NAME, __version__, meter_provider)
        self._duration = meter.create_histogram(
            METRIC_DURATION,
            unit="s",
            description="Wall time of one rerank call, retries and fallback included.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )
        self._documents = meter.create_histogram(
            METRIC_DOCUMENTS,
            unit="{document}",
            description="Candidates handed to one rerank call.",
            explicit_bucket_boundaries_advisory=DOCUMENT_BUCKETS,
        )
        self._batches = meter.create_histogram(
            METRIC_BATCHES,
            unit="{batch}",
            description="Provider sub-batches one rerank call was split into.",
            explicit_bucket_boundaries_advisory=BATCH_BUCKETS,
        )
        self._requests = meter.create_counter(
            METRIC_REQUESTS,
            unit="{request}",
            description="HTTP requests sent to the rerank provider.",
        )
        self._retries = meter.create_counter(
            METRIC_RETRIES,
            unit="{retry}",
            description="Requests that were retries of a failed one.",
        )
        self._fallbacks = meter.create_counter(
            METRIC_FALLBACKS,
            unit="{fallback}",
            description="Rerank calls that degraded to recall order instead of failing.",
        )
        self._top1_changes = meter.create_counter(
            METRIC_TOP1_CHANGES,
            unit="{change}",
            description="Reranked calls whose first result differs from recall's first.",
        )
        tau_description = (
            "(1 + τ)/2, in [0, 1]: Kendall's tau-b between recall's order and the reranker's, "
            "normalized, per call: 1 when the reranker kept recall's order, 0.5 unrelated, 0 "
            "reversed (histograms take no negative values)."
        )
        self._kendall_tau = meter.create_histogram(
            METRIC_KENDALL_TAU,
            description=tau_description,
            explicit_bucket_boundaries_advisory=TAU_BUCKETS,
        )
        # The same points under the old name, for one release, so that users' dashboards and
        # alerts on it keep their data while they move (docs/quality.md, "Renamed").
        self._kendall_tau_deprecated = meter.create_histogram(
            METRIC_KENDALL_TAU_DEPRECATED,
            description=f"Deprecated, use {METRIC_KENDALL_TAU}: {tau_description}",
            explicit_bucket_boundaries_advisory=TAU_BUCKETS,
        )
        self._topk_overlap = meter.create_histogram(
            METRIC_TOPK_OVERLAP,
            description="Share of the reranker's top k that was in recall's top k, per call.",
            explicit_bucket_boundaries_advisory=TOPK_OVERLAP_BUCKETS,
        )
        self._max_promotion = meter.create_histogram(
            METRIC_MAX_PROMOTION,
            unit="{rank}",
            description="Deepest 1-based recall rank that reached the reranker's top k.",
            explicit_bucket_boundaries_advisory=PROMOTION_BUCKETS,
        )
        self._top_score = meter.create_histogram(
            METRIC_TOP_SCORE,
            description="The reranker's best score per call (model-specific scale; a negative "
            "one counts as 0).",
            explicit_bucket_boundaries_advisory=TOP_SCORE_BUCKETS,
        )
        self._score_margin = meter.create_histogram(
            METRIC_SCORE_MARGIN,
            description="The reranker's best score minus its second best, per call.",
            explicit_bucket_boundaries_advisory=MARGIN_BUCKETS,
        )
        self._rbo = meter.create_histogram(
            METRIC_RBO,
            description="Rank-biased overlap (RBO_ext, p = 0.9) of recall's top k and the "
            "reranker's, per call: 1 the same top k in the same order, 0 disjoint.",
            explicit_bucket_boundaries_advisory=RBO_BUCKETS,
        )
        self._score_spread = meter.create_histogram(
            METRIC_SCORE_SPREAD,
            description="The reranker's best top-k score minus its worst, per call.",
            explicit_bucket_boundaries_advisory=SPREAD_BUCKETS,
        )
        self._operation_duration = (
            meter.create_histogram(
                METRIC_GEN_AI_CLIENT_OPERATION_DURATION,
                unit="s",
                description="GenAI operation duration.",
                explicit_bucket_boundaries_advisory=GEN_AI_DURATION_BUCKETS_S,
            )
            if genai
            else None
        )

    @property
    def enabled(self) -> bool:
        """True when recorded points can reach a reader (a real MeterProvider is configured,
        given or global); the stage computes the quality signals only then, or for a span.

        Asked on every call, so it is kept cheap: a given provider's answer is worked out
        once, the global one's once per provider set (it can be set only once)."""
        if self._meter_provider is not None:
            return self._given_enabled
        provider = global_meter_provider()
        if provider is None:
            return False
        if provider is not self._global_seen:
            self._global_enabled = metrics_configured(provider)
            self._global_seen = provider
        return self._global_enabled

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

    def record_quality(
        self, quality: RerankQuality, *, model: str | None, provider: str | None
    ) -> None:
        """Record one reranked call's quality signals; an undefined one (None) is left out.

        Histograms take no negative values, so tau is recorded as (1 + tau) / 2 (under
        `METRIC_KENDALL_TAU`, ``kendall_tau_normalized``, and for one release also under the
        deprecated old name) and a negative top score as 0 (see `TAU_BUCKETS`).

        ``model`` is the configured model (the stage's `model_name`, else the reranker's), so
        the series stay few whatever a server reports; it and the provider label each point.
        """
        attributes: dict[str, str] = {}
        if model is not None:
            attributes[ATTR_MODEL] = model
        if provider is not None:
            attributes[ATTR_PROVIDER] = provider
        tau, top = quality.kendall_tau, quality.top_score
        normalized = None if tau is None else (1.0 + tau) / 2.0
        for histogram, value in (
            (self._kendall_tau, normalized),
            (self._kendall_tau_deprecated, normalized),
            (self._topk_overlap, quality.topk_overlap),
            (self._max_promotion, quality.max_promotion),
            (self._top_score, None if top is None else max(top, 0.0)),
            (self._score_margin, quality.score_margin),
            (self._rbo, quality.rbo),
            (self._score_spread, quality.score_spread),
        ):
            if value is not None:
                histogram.record(value, attributes)

    def record_operation_duration(
        self, duration_s: float, attributes: Mapping[str, AttributeValue]
    ) -> None:
        """Record one call's ``gen_ai.client.operation.duration`` with its GenAI attributes
        (operation, provider, request model, server, ``error.type`` on failure); nothing when
        this was built without `genai`."""
        if self._operation_duration is not None:
            self._operation_duration.record(duration_s, attributes)


class ChainMetrics:
    """A `RerankerChain`'s instruments: what each tier was asked and how it went, and how
    often a tier's circuit opened. No-ops unless a MeterProvider is configured.

    Every point carries the tier's index (`ATTR_TIER`), its provider and its configured model
    (never a server's string); a tier call's ``retrieval_stage.outcome`` is ``ok``, ``error``
    (a `RerankError`), ``skipped_circuit_open`` (its circuit was open: no request) or
    ``skipped_deadline`` (the chain's deadline had run out before its turn).
    """

    def __init__(self, meter_provider: metrics.MeterProvider | None = None) -> None:
        meter = metrics.get_meter(METER_NAME, __version__, meter_provider)
        self._calls = meter.create_counter(
            METRIC_TIER_CALLS,
            unit="{call}",
            description="Calls a reranker chain made (or skipped) per tier, by outcome.",
        )
        self._openings = meter.create_counter(
            METRIC_BREAKER_OPENINGS,
            unit="{opening}",
            description="Times a reranker chain's tier circuit opened (its tier then skipped).",
        )

    def tier_call(
        self, tier: int, outcome: str, *, provider: str | None, model: str | None
    ) -> None:
        """Count one call of (or skip over) `tier`."""
        self._calls.add(1, {**_tier_labels(tier, provider, model), ATTR_OUTCOME: outcome})

    def breaker_opened(self, tier: int, *, provider: str | None, model: str | None) -> None:
        """Count one opening of `tier`'s circuit."""
        self._openings.add(1, _tier_labels(tier, provider, model))


def _tier_labels(tier: int, provider: str | None, model: str | None) -> dict[str, str | int]:
    labels: dict[str, str | int] = {ATTR_TIER: tier}
    if provider is not None:
        labels[ATTR_PROVIDER] = provider
    if model is not None:
        labels[ATTR_MODEL] = model
    return labels


def metrics_configured(meter_provider: metrics.MeterProvider | None) -> bool:
    """True when points recorded through `meter_provider` (None: the global one, as it is now)
    can reach a reader: not the API's no-op provider, nor its placeholder for a global
    provider nobody has set yet.

    The API has no public way to ask this: its placeholder is the private
    ``_ProxyMeterProvider`` (pinned by tests/telemetry/test_metrics.py)."""
    provider = metrics.get_meter_provider() if meter_provider is None else meter_provider
    return not isinstance(provider, (NoOpMeterProvider, _ProxyMeterProvider))


def global_meter_provider() -> metrics.MeterProvider | None:
    """The global MeterProvider an application set, or None while none is set.

    `metrics.get_meter_provider` answers the same, but while none is set it looks
    ``OTEL_PYTHON_METER_PROVIDER`` up in ``os.environ`` on every call (to load a provider
    named there), which a per-call check cannot afford; so this reads the API's private slot
    ``_METER_PROVIDER`` (pinned by tests/telemetry/test_metrics.py). That variable is honoured
    all the same: the API loads the provider it names at its first lookup, which
    `RerankMetrics` makes when it is built.
    """
    provider: metrics.MeterProvider | None = _metrics_api._METER_PROVIDER
    return provider
