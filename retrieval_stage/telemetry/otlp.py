"""Where OTLP goes: one resolution of endpoint, protocol, headers and timeout for every signal.

The SDK's exporters resolve their own environment only partly (``OTEL_EXPORTER_OTLP_PROTOCOL``
is read by auto-configuration alone), and traces and metrics must follow the same rules, so
both `configure_tracing` and `configure_metrics` ask `otlp_target` and pass
the result to the exporter explicitly. The rules are the OpenTelemetry specification's:

- protocol: the argument, else ``OTEL_EXPORTER_OTLP_<SIGNAL>_PROTOCOL``, else
  ``OTEL_EXPORTER_OTLP_PROTOCOL``, else ``http/protobuf``; ``grpc`` is the other one accepted.
- endpoint over HTTP: an argument is a base URL (``/v1/<signal>`` appended unless already
  there); ``OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT`` is used as given;
  ``OTEL_EXPORTER_OTLP_ENDPOINT`` gets ``/v1/<signal>``; the default is
  ``http://localhost:4318/v1/<signal>``. Over gRPC every form is used as given (default
  ``http://localhost:4317``).
- headers: the argument, else ``OTEL_EXPORTER_OTLP_<SIGNAL>_HEADERS``, else
  ``OTEL_EXPORTER_OTLP_HEADERS`` (``key=value,key2=value2``, URL-encoded values).
- timeout (seconds, as the Python SDK reads these variables): the argument, else
  ``OTEL_EXPORTER_OTLP_<SIGNAL>_TIMEOUT``, else ``OTEL_EXPORTER_OTLP_TIMEOUT``, else the
  caller's default.

The gRPC exporters need ``grpcio``, an optional extra: they are imported only when asked for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from opentelemetry.util.re import parse_env_headers

from .._install import install_hint
from .._redact import shown_url

__all__ = [
    "DEFAULT_EXPORT_TIMEOUT_S",
    "DEFAULT_SERVICE_NAME",
    "GRPC_EXTRA_HINT",
    "OtlpExtraMissingError",
    "OtlpTarget",
    "Signal",
    "exporter_off",
    "otlp_endpoint_configured",
    "otlp_target",
]

Signal = Literal["traces", "metrics"]
Protocol = Literal["http/protobuf", "grpc"]

DEFAULT_SERVICE_NAME = "retrieval-stage"
DEFAULT_EXPORT_TIMEOUT_S = 5.0

GRPC_EXTRA_HINT = install_hint("grpc")
"""What to run when OTLP over gRPC is asked for without grpcio installed."""

_DEFAULT_HTTP_BASE = "http://localhost:4318"
_DEFAULT_GRPC_ENDPOINT = "http://localhost:4317"
_HTTP_ALIASES = frozenset({"http/protobuf", "http"})


class OtlpExtraMissingError(ImportError):
    """OTLP over gRPC was asked for, but the ``[grpc]`` extra (grpcio) is not installed."""


@dataclass(frozen=True, slots=True)
class OtlpTarget:
    """One signal's resolved OTLP destination; `endpoint` is the full URL the exporter posts to."""

    signal: Signal
    protocol: Protocol
    endpoint: str
    timeout: float
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def shown(self) -> str:
        """The endpoint as it may appear in logs: credentials, query and fragment removed."""
        return shown_url(self.endpoint)


def _env(signal: Signal, suffix: str) -> str | None:
    """``OTEL_EXPORTER_OTLP_<SIGNAL>_<suffix>`` if set and not blank, else the generic one."""
    for name in (f"OTEL_EXPORTER_OTLP_{signal.upper()}_{suffix}", f"OTEL_EXPORTER_OTLP_{suffix}"):
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


def _protocol(signal: Signal, given: str | None) -> Protocol:
    chosen = (given or _env(signal, "PROTOCOL") or "http/protobuf").strip().lower()
    if chosen == "grpc":
        return "grpc"
    if chosen in _HTTP_ALIASES:
        return "http/protobuf"
    raise ValueError(f"unsupported OTLP protocol {chosen!r}: use 'http/protobuf' or 'grpc'")


def _with_path(base: str, path: str) -> str:
    """`base` with the signal's path appended unless it already ends with it."""
    trimmed = base.rstrip("/")
    return trimmed if trimmed.endswith(path) else trimmed + path


def _endpoint(signal: Signal, protocol: Protocol, given: str | None) -> str:
    path = f"/v1/{signal}"
    specific = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT", "").strip()
    generic = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if protocol == "grpc":
        return given or specific or generic or _DEFAULT_GRPC_ENDPOINT
    if given:
        return _with_path(given, path)
    if specific:
        return specific
    return _with_path(generic or _DEFAULT_HTTP_BASE, path)


def _timeout(signal: Signal, given: float | None, default: float) -> float:
    if given is not None:
        return given
    raw = _env(signal, "TIMEOUT")
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        return default
    return value if value > 0 else default


def otlp_target(
    signal: Signal,
    *,
    endpoint: str | None = None,
    protocol: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float | None = None,
    default_timeout: float = 5.0,
) -> OtlpTarget:
    """Resolve `signal`'s destination from the arguments, then the environment (module doc).

    An unknown protocol (``http/json``) is a ValueError: sending protobuf to an endpoint set up
    for something else would fail on every export, silently.
    """
    chosen = _protocol(signal, protocol)
    if headers is None:
        raw = _env(signal, "HEADERS")
        headers = parse_env_headers(raw, liberal=True) if raw else {}
    return OtlpTarget(
        signal=signal,
        protocol=chosen,
        endpoint=_endpoint(signal, chosen, endpoint),
        timeout=_timeout(signal, timeout, default_timeout),
        headers=dict(headers),
    )


def otlp_endpoint_configured(signal: Signal) -> bool:
    """Whether the environment names an OTLP endpoint for `signal` (the CLI exports only then)."""
    return bool(
        os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT", "").strip()
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    )


def exporter_off(signal: str) -> bool:
    """``OTEL_<SIGNAL>_EXPORTER=none``: the standard way to switch one signal's export off."""
    return os.environ.get(f"OTEL_{signal}_EXPORTER", "").strip().lower() == "none"
