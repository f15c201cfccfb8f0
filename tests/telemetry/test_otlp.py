"""`otlp_target`: one set of rules for where traces and metrics go, and the optional gRPC extra."""

from __future__ import annotations

import subprocess
import sys

import pytest

from retrieval_stage._redact import shown_url as shown_endpoint
from retrieval_stage.telemetry.otlp import OtlpExtraMissingError, otlp_target

OTLP_ENV = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTLP_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("env", "given", "traces", "metrics"),
    [
        ({}, None, "http://localhost:4318/v1/traces", "http://localhost:4318/v1/metrics"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
            None,
            "http://c:4318/v1/traces",
            "http://c:4318/v1/metrics",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/base/"},
            None,
            "http://c:4318/base/v1/traces",
            "http://c:4318/base/v1/metrics",
        ),
        (  # the signal's own variable is used as given and wins for that signal only
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://phoenix:6006/v1/traces",
            },
            None,
            "http://phoenix:6006/v1/traces",
            "http://c:4318/v1/metrics",
        ),
        (
            {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m:9/custom"},
            None,
            "http://localhost:4318/v1/traces",
            "http://m:9/custom",
        ),
        (  # an argument is a base URL and wins over everything
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x:1/v1/traces"},
            "http://arg:4318/",
            "http://arg:4318/v1/traces",
            "http://arg:4318/v1/metrics",
        ),
    ],
)
def test_http_endpoints_follow_the_spec_suffix_rules(
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    given: str | None,
    traces: str,
    metrics: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    assert otlp_target("traces", endpoint=given).endpoint == traces
    assert otlp_target("metrics", endpoint=given).endpoint == metrics


def test_an_argument_already_ending_in_the_signal_path_is_kept() -> None:
    target = otlp_target("metrics", endpoint="http://c:4318/v1/metrics")
    assert target.endpoint == "http://c:4318/v1/metrics"


def test_grpc_endpoints_are_used_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    assert otlp_target("traces").endpoint == "http://localhost:4317"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317")
    assert otlp_target("metrics").endpoint == "http://c:4317"
    assert otlp_target("traces", endpoint="c:4317").endpoint == "c:4317"


@pytest.mark.parametrize(
    ("env", "traces", "metrics"),
    [
        ({}, "http/protobuf", "http/protobuf"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "grpc", "grpc"),
        ({"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc"}, "http/protobuf", "grpc"),
        (
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            },
            "http/protobuf",
            "grpc",
        ),
    ],
)
def test_protocol_signal_variable_wins_over_the_generic_one(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], traces: str, metrics: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    assert otlp_target("traces").protocol == traces
    assert otlp_target("metrics").protocol == metrics


def test_an_unsupported_protocol_is_refused() -> None:
    with pytest.raises(ValueError, match="http/json"):
        otlp_target("traces", protocol="http/json")


def test_headers_and_timeout_come_from_the_signal_then_the_generic_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "api-key=generic,x-team=search%20team")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "api-key=metrics")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "3")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "2.5")

    traces = otlp_target("traces")
    metrics = otlp_target("metrics")

    assert dict(traces.headers) == {"api-key": "generic", "x-team": "search team"}
    assert dict(metrics.headers) == {"api-key": "metrics"}
    assert (traces.timeout, metrics.timeout) == (2.5, 3.0)
    assert otlp_target("traces", headers={"a": "b"}, timeout=0.5).timeout == 0.5
    assert "generic" not in repr(traces)  # headers carry credentials


def test_an_unparseable_timeout_keeps_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "soon")
    assert otlp_target("traces", default_timeout=4.0).timeout == 4.0


def test_shown_endpoint_masks_credentials_query_and_fragment() -> None:
    url = "https://user:secret@collector:4318/v1/traces?key=sk-live#frag"
    assert shown_endpoint(url) == "https://***@collector:4318/v1/traces"
    assert otlp_target("traces", endpoint="http://u:p@c:4318").shown == (
        "http://***@c:4318/v1/traces"
    )


WITHOUT_GRPC = """
import importlib.abc, sys

class NoGrpc(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "grpc" or name.startswith(("grpc.", "opentelemetry.exporter.otlp.proto.grpc")):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, NoGrpc())
import retrieval_stage.telemetry as telemetry  # must work without grpcio
import retrieval_stage.metrics as metrics_module
from retrieval_stage.telemetry.otlp import OtlpExtraMissingError

provider = telemetry.configure_tracing("no-grpc", endpoint="http://127.0.0.1:9")  # http works
for build in (
    lambda: telemetry.otlp_span_exporter(protocol="grpc"),
    lambda: telemetry.configure_metrics(protocol="grpc"),
):
    try:
        build()
    except OtlpExtraMissingError as exc:
        print(exc)
assert not any(m == "grpc" or m.startswith("grpc.") for m in sys.modules), "grpc was imported"
"""


def test_without_grpcio_the_package_imports_and_grpc_names_the_extra() -> None:
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_GRPC],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2, result.stdout
    for line in lines:
        assert "-m pip install -e " in line
        assert "[grpc]'" in line
    assert issubclass(OtlpExtraMissingError, ImportError)


def test_http_telemetry_does_not_import_grpc() -> None:
    code = (
        "import sys, retrieval_stage.telemetry as t\n"
        "t.configure_tracing('x', endpoint='http://127.0.0.1:9')\n"
        "t.configure_metrics('x', endpoint='http://127.0.0.1:9')\n"
        "print(any(m == 'grpc' or m.startswith('grpc.') for m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ("user:secret@collector:4317", "***@collector:4317"),
        ("collector:4317", "collector:4317"),
        ("http://u:p@h:4318/v1/traces?key=k#f", "http://***@h:4318/v1/traces"),
        ("https://u:pa/ss@h/v1/traces", "https://***@h/v1/traces"),
        ("https://TOKEN@h/x", "https://***@h/x"),
        ("http://h:4318", "http://h:4318"),
    ],
)
def test_shown_endpoint_never_shows_credentials(given: str, shown: str) -> None:
    from retrieval_stage._redact import shown_url as shown_endpoint

    assert shown_endpoint(given) == shown
