"""The OTLP/HTTP span exporter `configure_tracing` builds: the SDK's, with our fast encoder.

`FastOTLPSpanExporter` is the SDK's `OTLPSpanExporter` (same constructor keywords, same
endpoint/header/timeout/compression resolution from ``OTEL_EXPORTER_OTLP_*``, the same HTTP
session, retries with backoff, deadline, gzip/deflate, size limit and exporter metrics); only
the bytes are produced by `retrieval_stage.telemetry.otlp_encoder.serialize_spans`, which is
byte-identical to the SDK's encoder and falls back to it for anything it does not handle.

Turn the fast encoder off with ``fast_encoding=False`` or ``RETRIEVAL_STAGE_FAST_OTLP=0``: the
exporter is then exactly the SDK's.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.http._common import (
    RequestPayloadTooLargeError,
    _is_request_too_large,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.semconv.attributes.http_attributes import HTTP_RESPONSE_STATUS_CODE

from ..validate import InvalidSetting, env_flag
from .otlp_encoder import serialize_spans

__all__ = ["FAST_OTLP_ENV", "FastOTLPSpanExporter", "fast_encoding_default"]

FAST_OTLP_ENV = "RETRIEVAL_STAGE_FAST_OTLP"
"""Environment switch: ``0``/``false``/``no``/``off`` makes the exporter use the SDK's encoder."""

_logger = logging.getLogger(__name__)

# The SDK exporter state that `_export_serialized` reads: checked at construction.
_SDK_STATE = ("_shutdown", "_metrics", "_max_request_size", "_client")


def fast_encoding_default() -> bool:
    """Whether the fast encoder is on when the constructor does not say (``FAST_OTLP_ENV``).

    Unset means on; an unparseable value warns and keeps it on.
    """
    try:
        value = env_flag(FAST_OTLP_ENV)
    except InvalidSetting:
        raw = os.environ.get(FAST_OTLP_ENV, "").strip().lower()
        _logger.warning("ignoring %s=%r: expected 0 or 1", FAST_OTLP_ENV, raw)
        return True
    return True if value is None else value


class FastOTLPSpanExporter(OTLPSpanExporter):
    """The SDK's OTLP/HTTP span exporter, encoding with `otlp_encoder.serialize_spans`.

    Takes every keyword `OTLPSpanExporter` takes, plus `fast_encoding` (None: the
    ``RETRIEVAL_STAGE_FAST_OTLP`` environment variable, default on).
    """

    def __init__(self, *args: Any, fast_encoding: bool | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        wanted = fast_encoding_default() if fast_encoding is None else fast_encoding
        missing = [name for name in _SDK_STATE if not hasattr(self, name)]
        if wanted and missing:
            _logger.warning(
                "fast OTLP encoding off: this SDK's exporter lacks %s", ", ".join(missing)
            )
        self.fast_encoding = wanted and not missing

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Export `spans`; the SDK's own `export` when the fast encoder is off."""
        if not self.fast_encoding:
            return super().export(spans)
        return self._export_serialized(spans)

    def _export_serialized(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """The SDK's `OTLPSpanExporter.export` (1.45.2) with `serialize_spans` as the encoder.

        It relies on the SDK exporter's private state (listed with the library's other private
        reads in docs/architecture.md, "Private reads of dependencies"). The SDK serialises
        inside `export`, so its remaining steps (metrics, size limit, POST with retries) are
        mirrored here line for line; `tests/telemetry/test_otlp_encoder.py` pins the SDK's `export`
        source and fails when it changes, so this copy is re-checked on every SDK upgrade.
        """
        sdk: Any = self
        if sdk._shutdown:
            _logger.warning("Exporter already shutdown, ignoring batch")
            return SpanExportResult.FAILURE

        with sdk._metrics.export_operation(len(spans)) as result:
            try:
                serialized_data = serialize_spans(spans)
            except Exception as error:  # as the SDK: a failed encode fails the batch
                _logger.error("Failed to encode span batch: %s", error)
                result.error = error
                return SpanExportResult.FAILURE

            if _is_request_too_large(serialized_data, sdk._max_request_size):
                _logger.warning(
                    "Dropping span batch: serialized size %d bytes exceeds "
                    "max_request_size %d bytes.",
                    len(serialized_data),
                    sdk._max_request_size,
                )
                result.error = RequestPayloadTooLargeError(
                    f"Serialized span request size {len(serialized_data)} "
                    f"bytes exceeds max_request_size "
                    f"{sdk._max_request_size} bytes."
                )
                return SpanExportResult.FAILURE

            export_result = sdk._client.export(serialized_data)
            if not export_result.success:
                result.error = export_result.error
                result.error_attrs = (
                    {HTTP_RESPONSE_STATUS_CODE: export_result.status_code}
                    if export_result.status_code is not None
                    else None
                )
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS
