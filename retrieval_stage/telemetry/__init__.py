"""Telemetry set-up for applications (and our CLI): tracing, metrics and logs.

Library code never calls these: it asks `trace.get_tracer`, `metrics.get_meter` and
`structlog.get_logger` and lets the application decide. An application calls
`configure_tracing()` (and `configure_metrics()`, `configure_logging()`) once at start-up;
`shutdown_telemetry()` flushes everything under one deadline.

- `tracing`: `configure_tracing`, `BoundedBatchSpanProcessor`;
- `metrics`: `configure_metrics`;
- `logs`: `configure_logging`, `add_trace_context`;
- `otlp`: where OTLP goes (endpoint, protocol, headers, timeout) for every signal;
- `exporters`: exporters with delivery counts; `otlp_exporter`, `otlp_encoder`: the fast
  OTLP/protobuf span exporter;
- `shutdown`: one shutdown deadline for all telemetry configured here;
- `trace_file`: spans to a file as OTLP/JSON, for the command line without a collector.
"""

from .logs import add_trace_context, configure_logging
from .metrics import configure_metrics
from .otlp import OtlpExtraMissingError
from .shutdown import DEFAULT_SHUTDOWN_TIMEOUT_S, ShutdownReport, shutdown_telemetry
from .tracing import (
    DEFAULT_SPAN_ATTRIBUTE_LIMIT,
    PROJECT_NAME,
    BoundedBatchSpanProcessor,
    configure_tracing,
    otlp_span_exporter,
)

__all__ = [
    "DEFAULT_SHUTDOWN_TIMEOUT_S",
    "DEFAULT_SPAN_ATTRIBUTE_LIMIT",
    "PROJECT_NAME",
    "BoundedBatchSpanProcessor",
    "OtlpExtraMissingError",
    "ShutdownReport",
    "add_trace_context",
    "configure_logging",
    "configure_metrics",
    "configure_tracing",
    "otlp_span_exporter",
    "shutdown_telemetry",
]
