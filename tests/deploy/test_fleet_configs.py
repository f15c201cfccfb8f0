"""The fleet-mode collectors (gateway + sampling tier) and compose profile, checked offline.

No collector can run here (its image cannot be pulled), so these tests hold every component
name and field of telemetry/otel-gateway*.yaml and telemetry/otel-sampler.yaml to an
allow-list vendored from the pinned collector-contrib version (collector_v0_150_0.yaml, with
its sources), check that the pipelines are wired as docs/scaling.md says, and run the
document-content pattern against the attribute keys a real traced stage emits.
"""

from __future__ import annotations

import copy
import functools
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from ruamel.yaml import YAML

from retrieval_stage import Candidate, RerankStage
from retrieval_stage.pipeline import Pipeline
from retrieval_stage.spans import keys

from ..fakes import ByLength

ROOT = Path(__file__).resolve().parents[2]
TELEMETRY = ROOT / "telemetry"
COMPOSE = ROOT / "docker" / "compose.yaml"
GATEWAY = TELEMETRY / "otel-gateway.yaml"
KEEP = TELEMETRY / "otel-gateway.keep-content.yaml"
DROP = TELEMETRY / "otel-gateway.drop-content.yaml"
SAMPLER = TELEMETRY / "otel-sampler.yaml"
SINGLE = TELEMETRY / "otel-collector.yaml"
PROMETHEUS = TELEMETRY / "prometheus.yml"
SCHEMA = Path(__file__).with_name("collector_v0_150_0.yaml")

KINDS = ("receivers", "processors", "exporters", "connectors", "extensions")
ENV_REF = re.compile(r"\$\{env:([A-Z_][A-Z0-9_]*)\}")

TIER_KEY = keys.ATTR_TIER  # the answering tier of a RerankerChain (0 is the primary)


def load(path: Path) -> Any:
    """A fresh copy of the parsed file (parsed once: ruamel's pure parser is slow)."""
    return copy.deepcopy(_parsed(path))


@functools.cache
def _parsed(path: Path) -> Any:
    with path.open(encoding="utf-8") as f:
        return YAML(typ="safe", pure=True).load(f)


def merged(*configs: dict[str, Any]) -> dict[str, Any]:
    """Configs merged as the collector merges repeated --config files: maps key by key, any
    other value (a list too) replaced by the later file's."""

    def merge(a: Any, b: Any) -> Any:
        if isinstance(a, dict) and isinstance(b, dict):
            out = dict(a)
            for key, value in b.items():
                out[key] = merge(a[key], value) if key in a else value
            return out
        return b

    result: dict[str, Any] = {}
    for config in configs:
        result = merge(result, config)
    return result


def schema() -> dict[str, Any]:
    found: dict[str, Any] = load(SCHEMA)
    return found


def fleet_configs() -> dict[str, dict[str, Any]]:
    """Every configuration a fleet collector can start with."""
    gateway = load(GATEWAY)
    return {
        "gateway": gateway,
        "gateway+keep": merged(gateway, load(KEEP)),
        "gateway+drop": merged(gateway, load(DROP)),
        "sampler": load(SAMPLER),
    }


# -- the allow-list check -----------------------------------------------------------------


def unknown_keys(value: Any, shape: Any, where: str) -> Iterator[str]:
    """Every key in `value` that `shape` (collector_v0_150_0.yaml's notation) does not allow."""
    if shape == "*" or shape is None:
        if shape is None and isinstance(value, dict):
            yield f"{where}: a mapping where a plain value belongs"
        return
    if not isinstance(value, dict):
        yield f"{where}: {value!r} where a mapping belongs"
        return
    for key, sub in value.items():
        if key not in shape:
            yield f"{where}.{key}"
            continue
        allowed = shape[key]
        if isinstance(allowed, dict) and "_items" in allowed:
            if not isinstance(sub, list):
                yield f"{where}.{key}: not a list"
                continue
            for i, item in enumerate(sub):
                yield from unknown_keys(item, allowed["_items"], f"{where}.{key}[{i}]")
        elif sub is not None:
            yield from unknown_keys(sub, allowed, f"{where}.{key}")


def problems(config: dict[str, Any]) -> list[str]:
    """What the pinned collector would refuse (or warn about) in `config`."""
    spec = schema()
    found = []
    for kind in KINDS:
        for name, body in (config.get(kind) or {}).items():
            component_type = name.split("/")[0]
            if component_type in spec["not_yet"]:
                old = spec["not_yet"][component_type]
                found.append(f"{kind}.{name}: not in v{spec['version']}; it is `{old}` there")
                continue
            if kind == "exporters" and component_type in spec["deprecated_exporters"]:
                new = spec["deprecated_exporters"][component_type]
                found.append(f"{kind}.{name}: deprecated alias of `{new}`")
                continue
            shapes = spec["components"].get(kind, {})
            if component_type not in shapes:
                found.append(f"{kind}.{name}: no such component type in v{spec['version']}")
                continue
            found.extend(unknown_keys(body or {}, shapes[component_type], f"{kind}.{name}"))
    return found


@pytest.mark.parametrize("name", ["gateway", "gateway+keep", "gateway+drop", "sampler"])
def test_every_component_and_field_is_one_the_pinned_collector_knows(name: str) -> None:
    assert problems(fleet_configs()[name]) == []


def test_the_single_collector_passes_the_same_allow_list() -> None:
    # The vendored list also describes the file in use today: a check of the checker.
    assert problems(load(SINGLE)) == []


def test_the_allow_list_catches_renamed_components_and_unknown_fields() -> None:
    gateway = load(GATEWAY)
    renamed = dict(gateway, connectors={"span_metrics": gateway["connectors"]["spanmetrics"]})
    typo = merged(gateway, {"exporters": {"loadbalancing": {"routingkey": "traceID"}}})
    nested = merged(
        load(SAMPLER),
        {"processors": {"tail_sampling": {"policies": [{"name": "x", "latency": {"ms": 1}}]}}},
    )

    assert any("span_metrics" in p and "spanmetrics" in p for p in problems(renamed))
    assert problems(typo) == ["exporters.loadbalancing.routingkey"]
    assert problems(nested) == ["processors.tail_sampling.policies[0].latency.ms"]
    assert problems({"exporters": {"otlp/tempo": {}}}) == [
        "exporters.otlp/tempo: deprecated alias of `otlp_grpc`"
    ]


def test_every_collector_image_is_the_version_the_allow_list_describes() -> None:
    services = load(COMPOSE)["services"]
    images = {services[n]["image"] for n in ("otel-collector", "otel-gateway", "otel-sampler")}

    assert images == {f"otel/opentelemetry-collector-contrib:{schema()['version']}"}
    for path in (GATEWAY, SAMPLER):
        assert f"collector-contrib:{schema()['version']}" in path.read_text(encoding="utf-8")


def test_enumerated_values_are_ones_the_pinned_collector_accepts() -> None:
    values = schema()["values"]
    sampler = load(SAMPLER)["processors"]["tail_sampling"]
    drop = load(DROP)["processors"]["attributes/drop_document_content"]

    assert (
        load(GATEWAY)["exporters"]["loadbalancing"]["routing_key"]
        in values["loadbalancing.routing_key"]
    )
    for policy in sampler["policies"]:
        assert policy["type"] in values["tail_sampling.policy.type"], policy["name"]
        assert set(policy) == {"name", "type", policy["type"]}, policy["name"]
        for code in policy.get("status_code", {}).get("status_codes", []):
            assert code in values["tail_sampling.status_code"]
    for action in drop["actions"]:
        assert action["action"] in values["attributes.action"]


# -- pipelines ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gateway", "gateway+keep", "gateway+drop", "sampler"])
def test_pipelines_use_only_defined_components_and_every_one_is_used(name: str) -> None:
    config = fleet_configs()[name]
    defined = {kind: set(config.get(kind) or {}) for kind in KINDS}
    used: dict[str, set[str]] = {kind: set() for kind in KINDS}

    for pipeline_id, pipeline in config["service"]["pipelines"].items():
        assert pipeline_id.split("/")[0] in {"traces", "metrics", "logs"}, pipeline_id
        assert pipeline.get("receivers"), pipeline_id
        assert pipeline.get("exporters"), pipeline_id
        for role in ("receivers", "processors", "exporters"):
            for component in pipeline.get(role) or []:
                kind = "connectors" if component in defined["connectors"] else role
                assert component in defined[kind], f"{pipeline_id}: {component} is not defined"
                used[kind].add(component)
    used["extensions"] = set(config["service"].get("extensions") or [])

    assert defined == used


def test_the_gateway_routes_by_trace_id_to_the_sampling_tier() -> None:
    lb = load(GATEWAY)["exporters"]["loadbalancing"]
    sampler_grpc = load(SAMPLER)["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    services = load(COMPOSE)["services"]

    assert lb["routing_key"] == "traceID"
    assert "endpoint" not in lb["protocol"]["otlp"], "the resolver gives the endpoints"
    (resolver,) = lb["resolver"].values()
    assert lb["resolver"]["dns"] is resolver
    assert resolver["hostname"] in services, "resolves the compose service's replicas"
    assert services[resolver["hostname"]]["deploy"]["replicas"] >= 2
    assert str(resolver["port"]) == sampler_grpc.rpartition(":")[2]


def test_red_metrics_are_computed_at_the_gateway_before_sampling() -> None:
    for name, config in fleet_configs().items():
        if name == "sampler":
            continue
        traces = config["service"]["pipelines"]["traces"]
        # The connector sees every span the gateway receives, beside the export to the tier;
        # nothing at the gateway samples.
        assert "spanmetrics" in traces["exporters"], name
        assert "loadbalancing" in traces["exporters"], name
        assert not any(p.startswith("tail_sampling") for p in config.get("processors", {}))
        metrics = config["service"]["pipelines"]["metrics"]
        assert "spanmetrics" in metrics["receivers"]
        assert "prometheus" in metrics["exporters"]
    sampler = load(SAMPLER)
    assert "connectors" not in sampler, "span metrics after sampling would undercount"
    assert sampler["service"]["pipelines"]["traces"]["processors"][0] == "tail_sampling"


def test_fleet_mode_feeds_the_dashboards_the_same_series() -> None:
    gateway, single = load(GATEWAY), load(SINGLE)
    targets = [
        (config.get("dns_sd_configs") or [{}])[0]
        for config in load(PROMETHEUS)["scrape_configs"]
        if config["job_name"] == "otel-gateway"
    ]

    # Same connector and exporter settings: same names, units, buckets and labels.
    assert gateway["connectors"]["spanmetrics"] == single["connectors"]["spanmetrics"]
    assert gateway["exporters"]["prometheus"] == single["exporters"]["prometheus"]
    # Prometheus scrapes the gateway where it runs, keeping job/instance from the resource.
    (target,) = targets
    assert target["names"] == ["otel-gateway"]
    assert str(target["port"]) == gateway["exporters"]["prometheus"]["endpoint"].rpartition(":")[2]
    (job,) = [c for c in load(PROMETHEUS)["scrape_configs"] if c["job_name"] == "otel-gateway"]
    assert job["honor_labels"] is True


# -- the tail-sampling policies -----------------------------------------------------------


def scalars(node: Any) -> Iterator[str]:
    """Every scalar value in a parsed config, as text (comments are not values)."""
    if isinstance(node, dict):
        for value in node.values():
            yield from scalars(value)
    elif isinstance(node, list):
        for item in node:
            yield from scalars(item)
    elif node is not None:
        yield str(node)


def policies() -> dict[str, dict[str, Any]]:
    found = load(SAMPLER)["processors"]["tail_sampling"]["policies"]
    return {p["type"] + ":" + p["name"]: p for p in found}


def test_the_sampling_tier_keeps_errors_fallbacks_retries_slow_calls_and_a_baseline() -> None:
    by_type: dict[str, list[dict[str, Any]]] = {}
    for policy in policies().values():
        by_type.setdefault(policy["type"], []).append(policy)

    (errors,) = by_type["status_code"]
    assert errors["status_code"]["status_codes"] == ["ERROR"]
    (fallback,) = by_type["boolean_attribute"]
    assert fallback["boolean_attribute"] == {"key": keys.ATTR_FALLBACK, "value": True}
    numeric = {
        p["numeric_attribute"]["key"]: p["numeric_attribute"] for p in by_type["numeric_attribute"]
    }
    assert numeric[keys.ATTR_RETRIES]["min_value"] == 1
    assert numeric[keys.ATTR_RETRIES]["max_value"] >= 1000
    assert numeric[TIER_KEY]["min_value"] == 1
    (slow,) = by_type["latency"]
    assert ENV_REF.fullmatch(str(slow["latency"]["threshold_ms"]))
    (baseline,) = by_type["probabilistic"]
    assert ENV_REF.fullmatch(str(baseline["probabilistic"]["sampling_percentage"]))
    assert set(by_type) == {
        "status_code",
        "boolean_attribute",
        "numeric_attribute",
        "latency",
        "probabilistic",
    }


def test_sampler_settings_come_from_compose_with_documented_defaults() -> None:
    text = SAMPLER.read_text(encoding="utf-8")
    referenced = {name for value in scalars(load(SAMPLER)) for name in ENV_REF.findall(value)}
    environment = load(COMPOSE)["services"]["otel-sampler"]["environment"]
    defaults = {
        name: re.fullmatch(r"\$\{" + name + r":-([^}]*)\}", str(value))
        for name, value in environment.items()
    }

    assert referenced == set(environment), "every ${env:...} is set by compose, and only those"
    assert all(defaults.values()), environment
    values = {name: match.group(1) for name, match in defaults.items() if match}
    assert values == {
        "SAMPLER_LATENCY_THRESHOLD_MS": "2000",
        "SAMPLER_BASELINE_PERCENT": "5",
        "SAMPLER_DECISION_WAIT": "10s",
    }
    docs = (ROOT / "docs" / "scaling.md").read_text(encoding="utf-8")
    for name, value in values.items():
        assert name in docs, name
        assert name in text, name
        assert value in text, f"{name}'s default {value} is not stated in {SAMPLER.name}"


def test_the_attributes_the_policies_and_dimensions_read_are_project_keys() -> None:
    project = {v for k, v in vars(keys).items() if k.startswith("ATTR_")}
    read = {p["numeric_attribute"]["key"] for p in policies().values() if "numeric_attribute" in p}
    read |= {p["boolean_attribute"]["key"] for p in policies().values() if "boolean_attribute" in p}
    dims = {d["name"] for d in load(GATEWAY)["connectors"]["spanmetrics"]["dimensions"]}

    assert read <= project, read - project
    assert {d for d in dims if d.startswith("retrieval_stage.")} <= project


# -- deleting document content at the gateway ----------------------------------------------


@pytest.fixture(scope="module")
def emitted_keys() -> set[str]:
    """Attribute keys of real CHAIN, RETRIEVER and RERANKER spans of one traced pipeline run."""

    class FixedRecall:
        def recall(self, query: str, k: int) -> list[Candidate]:
            return [
                Candidate(f"d{i}", "text " * (i + 1), score=1.0 - i / 20, metadata={"n": i})
                for i in range(12)
            ][:k]

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    stage = RerankStage(
        ByLength(provider="fake", model_name="m"), top_k=11, tracer_provider=provider
    )
    Pipeline(FixedRecall(), stage, recall_k=12, tracer_provider=provider).run("query")
    found: set[str] = set()
    for span in exporter.get_finished_spans():
        found |= set(span.attributes or {})
    provider.shutdown()
    return found


def drop_patterns() -> list[re.Pattern[str]]:
    actions = load(DROP)["processors"]["attributes/drop_document_content"]["actions"]
    assert all(a["action"] == "delete" and "key" not in a for a in actions)
    return [re.compile(a["pattern"]) for a in actions]


def deleted(key: str) -> bool:
    # Go's regexp MatchString, as the processor applies it: unanchored search (the pattern
    # anchors itself); this pattern uses no syntax where Python's re and RE2 differ.
    return any(p.search(key) for p in drop_patterns())


def test_the_drop_pattern_deletes_every_document_content_key_and_nothing_else(
    emitted_keys: set[str],
) -> None:
    content = {k for k in emitted_keys if k.endswith(".document.content")}
    kinds = {k.split(".")[0] + "." + k.split(".")[1] for k in content}

    assert {"reranker.input_documents", "reranker.output_documents", "retrieval.documents"} <= kinds
    assert any(".11.document.content" in k for k in content), "two-digit indexes too"
    assert {k for k in emitted_keys if deleted(k)} == content
    kept = emitted_keys - content
    assert {"reranker.query", "reranker.input_documents.0.document.id"} <= kept
    assert "reranker.input_documents.0.document.score" in kept


def test_the_drop_pattern_is_anchored() -> None:
    for key in (
        "my.reranker.input_documents.0.document.content",
        "reranker.input_documents.0.document.content.length",
        "reranker.input_documents.x.document.content",
        "reranker.input_documents.0.document.contents",
    ):
        assert not deleted(key), key
    assert deleted("reranker.output_documents.199.document.content")


def test_the_drop_overlay_runs_first_and_keep_changes_nothing() -> None:
    gateway = load(GATEWAY)
    drop = merged(gateway, load(DROP))["service"]["pipelines"]["traces"]["processors"]

    assert drop[0] == "attributes/drop_document_content"
    assert drop[1:] == gateway["service"]["pipelines"]["traces"]["processors"]
    assert merged(gateway, load(KEEP)) == gateway


# -- compose ------------------------------------------------------------------------------


def test_the_fleet_profile_runs_two_apps_a_gateway_and_a_sampling_tier() -> None:
    services = load(COMPOSE)["services"]
    fleet = {name for name, s in services.items() if "fleet" in s.get("profiles", [])}
    app, single_app = services["app-fleet"], services["app"]
    gateway = services["otel-gateway"]

    assert fleet == {"app-fleet", "otel-gateway", "otel-sampler"}
    assert app["deploy"]["replicas"] == 2
    assert app["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-gateway:4318"
    assert app["command"] == single_app["command"]
    assert app["build"] == single_app["build"]
    for shared in ("tempo", "prometheus", "grafana"):
        assert "profiles" not in services[shared], f"{shared} runs in every mode"
    assert "tempo:4317" in SAMPLER.read_text(encoding="utf-8")
    # The gateway's configs: the base file plus the overlay GATEWAY_DOCUMENT_CONTENT names.
    base, overlay = gateway["command"]
    mounts = dict(v.rsplit(":", 1)[0].split(":", 1)[::-1] for v in gateway["volumes"])
    assert mounts[base.removeprefix("--config=")] == "../telemetry/otel-gateway.yaml"
    assert "${GATEWAY_DOCUMENT_CONTENT:-keep}" in overlay
    for choice, path in (("keep", KEEP), ("drop", DROP)):
        chosen = overlay.removeprefix("--config=").replace(
            "${GATEWAY_DOCUMENT_CONTENT:-keep}", choice
        )
        assert mounts[chosen] == f"../telemetry/{path.name}"
    assert not gateway.get("ports")
    assert not services["otel-sampler"].get("ports")


def compose_v2() -> list[str] | None:
    """A Compose v2 command line, if one is installed (the plugin or a v2 docker-compose)."""
    candidates = []
    docker, legacy = shutil.which("docker"), shutil.which("docker-compose")
    if docker:
        candidates.append([docker, "compose"])
    if legacy:
        candidates.append([legacy])
    for command in candidates:
        try:
            version = subprocess.run(
                [*command, "version", "--short"], capture_output=True, text=True, timeout=20
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if version.returncode == 0 and version.stdout.strip().lstrip("v").startswith("2"):
            return command
    return None


def test_docker_compose_resolves_the_fleet_profile(tmp_path: Path) -> None:
    command = compose_v2()
    if command is None:
        pytest.skip("no Docker Compose v2 here (`docker compose` or a v2 docker-compose)")
    # Only what compose needs: no variable of this shell changes the resolved file.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GF_ADMIN_PASSWORD": "offline"}
    result = subprocess.run(
        [*command, "-f", str(COMPOSE), "--profile", "fleet", "config", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr

    import json

    services = json.loads(result.stdout)["services"]
    assert {"app-fleet", "otel-gateway", "otel-sampler", "tempo", "grafana"} <= set(services)
    assert services["otel-gateway"]["command"][1].endswith("gateway.keep-content.yaml")
    assert services["otel-sampler"]["environment"]["SAMPLER_BASELINE_PERCENT"] == "5"
