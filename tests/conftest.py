"""Shared fixtures: one real WireMock per test session, reset between tests.

Where WireMock comes from, in order: ``WIREMOCK_URL`` (one already running, e.g. the compose
stack's), a Docker engine through testcontainers when one is reachable, else the WireMock
standalone jar that the ``wiremock`` PyPI package ships, run under Java. With none of these
the tests fail with a message saying what to install; they never skip silently.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

# Tests never reach the internet: no Hugging Face hub look-ups, not even a DNS query.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

FIXTURES = Path(__file__).parent / "wiremock"
WIREMOCK_IMAGE = "wiremock/wiremock:3.13.2"
STARTUP_SECONDS = 60.0


class WireMock:
    """A thin client for WireMock's admin API (stubs, scenarios, the request journal)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.admin = httpx.Client(base_url=self.url + "/__admin", timeout=10.0)

    def reset(self) -> None:
        """Back to the file mappings under tests/wiremock, with an empty journal."""
        self.admin.post("/reset").raise_for_status()
        self.admin.post("/scenarios/reset").raise_for_status()

    def stub(self, mapping: dict[str, Any]) -> None:
        self.admin.post("/mappings", json=mapping).raise_for_status()

    def stub_json(
        self,
        path: str,
        body: Any,
        *,
        status: int = 200,
        method: str = "POST",
        headers: dict[str, str] | None = None,
        **response: Any,
    ) -> None:
        """Stub `path` to answer `body` as JSON."""
        self.stub(
            {
                "request": {"method": method, "urlPath": path},
                "response": {
                    "status": status,
                    "headers": {"Content-Type": "application/json", **(headers or {})},
                    "body": json.dumps(body),
                    **response,
                },
            }
        )

    def requests(self, path: str | None = None) -> list[dict[str, Any]]:
        """Journal entries (oldest first), optionally only those for `path`."""
        entries = self.admin.get("/requests").json()["requests"]
        found = [e["request"] for e in entries]
        if path is not None:
            found = [r for r in found if r["url"].split("?")[0] == path]
        return list(reversed(found))

    def bodies(self, path: str) -> list[Any]:
        return [json.loads(r["body"]) for r in self.requests(path)]

    def raw_bodies(self, path: str) -> list[bytes]:
        return [base64.b64decode(r["bodyAsBase64"]) for r in self.requests(path)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_ready(url: str, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise RuntimeError(f"WireMock exited with {proc.returncode}:\n{out[-2000:]}")
        try:
            if httpx.get(url + "/__admin/mappings", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"WireMock at {url} did not answer within {STARTUP_SECONDS:.0f}s")


def _docker_engine_reachable() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        done = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _jar_path() -> Path:
    try:
        import wiremock
    except ImportError as exc:  # pragma: no cover - listed in the test extra
        raise RuntimeError(
            "the 'wiremock' package (which ships the WireMock jar) is missing: "
            "pip install -e '.[test]'"
        ) from exc
    jar = Path(wiremock.__file__).parent / "server" / "wiremock-standalone-2.35.1.jar"
    if not jar.exists():
        jars = sorted((Path(wiremock.__file__).parent / "server").glob("wiremock-standalone-*.jar"))
        if not jars:
            raise RuntimeError(f"no WireMock standalone jar found next to {wiremock.__file__}")
        jar = jars[-1]
    return jar


@pytest.fixture(scope="session")
def wiremock_server() -> Iterator[WireMock]:
    """One WireMock for the whole session."""
    external = os.environ.get("WIREMOCK_URL")
    if external:
        _wait_ready(external.rstrip("/"))
        yield WireMock(external)
        return
    if _docker_engine_reachable():  # pragma: no cover - no Docker engine on CI machines
        from testcontainers.core.container import DockerContainer

        container = (
            DockerContainer(WIREMOCK_IMAGE)
            .with_exposed_ports(8080)
            .with_volume_mapping(str(FIXTURES), "/home/wiremock", "ro")
        )
        container.start()
        try:
            url = f"http://{container.get_container_host_ip()}:{container.get_exposed_port(8080)}"
            _wait_ready(url)
            yield WireMock(url)
        finally:
            container.stop()
        return
    java = shutil.which("java")
    if java is None:
        pytest.fail(
            "WireMock needs Java or a Docker engine: install a JRE (Debian: "
            "apt-get install -y default-jre-headless), or set WIREMOCK_URL to a running WireMock.",
            pytrace=False,
        )
    port = _free_port()
    proc = subprocess.Popen(
        [
            java,
            "-jar",
            str(_jar_path()),
            "--port",
            str(port),
            "--bind-address",
            "127.0.0.1",
            "--root-dir",
            str(FIXTURES),
            "--disable-banner",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc)
        yield WireMock(url)
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def wm(wiremock_server: WireMock) -> WireMock:
    """The session's WireMock, reset to the file fixtures and an empty journal."""
    wiremock_server.reset()
    return wiremock_server


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """A default-limit SDK TracerProvider (128 attributes) exporting to memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()
