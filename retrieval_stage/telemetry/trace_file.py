"""`OtlpJsonLinesExporter`: spans written to a file as OTLP/JSON, one export request per line.

For the command line when no collector is configured: the file is what an OpenTelemetry
Collector's ``file`` exporter writes and its ``otlpjsonfile`` receiver reads, so a run's spans
can be replayed into Tempo or Phoenix later, or read with ``jq``. Lines follow the OTLP/JSON
encoding: lowerCamelCase field names, trace and span ids as hex strings, enums as integers.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["OtlpJsonLinesExporter", "otlp_json"]

_ID_FIELDS = frozenset({"traceId", "spanId", "parentSpanId"})


def otlp_json(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """The OTLP/JSON form of an ``ExportTraceServiceRequest`` carrying `spans`."""
    message = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    return _hex_ids(message)  # type: ignore[no-any-return]


def _hex_ids(value: Any) -> Any:
    """Protobuf's JSON mapping writes bytes as base64; OTLP/JSON wants ids as hex."""
    if isinstance(value, dict):
        return {
            k: base64.b64decode(v).hex() if k in _ID_FIELDS and isinstance(v, str) else _hex_ids(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_hex_ids(v) for v in value]
    return value


class OtlpJsonLinesExporter(SpanExporter):
    """Append each batch of spans to `path` as one OTLP/JSON line.

    The file is opened on the first export (append mode, created if missing) and flushed after
    every line, so a crash loses at most the batch in flight.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._handle: TextIO | None = None
        self._lock = threading.Lock()
        self._closed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Write one line for `spans`; FAILURE (never an exception) when the file cannot be."""
        if self._closed:
            return SpanExportResult.FAILURE
        if not spans:
            return SpanExportResult.SUCCESS
        line = json.dumps(otlp_json(spans), ensure_ascii=False, separators=(",", ":"))
        with self._lock:
            try:
                if self._handle is None:
                    self._handle = self.path.open("a", encoding="utf-8")
                self._handle.write(line + "\n")
                self._handle.flush()
            except OSError:
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Close the file; later exports fail."""
        with self._lock:
            self._closed = True
            if self._handle is not None:
                self._handle.close()
                self._handle = None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Every line is flushed as it is written."""
        return True
