"""Shared fixtures: one real WireMock per test session, reset between tests.

Where WireMock comes from, in order: ``WIREMOCK_URL`` (one already running, e.g. the compose
stack's); a Docker engine, when one answers, running the image ``WIREMOCK_IMAGE`` (default
``wiremock/wiremock:3.13.2``; docker/wiremock/build.sh builds it where no registry answers)
through testcontainers, published on 127.0.0.1 only; else the WireMock standalone jar that the
``wiremock`` PyPI package ships, run under Java on 127.0.0.1. With none of these the tests fail
with a message saying what to install; they never skip silently. pytest's header says which one
the session uses (``wiremock: docker ... at http://127.0.0.1:PORT``).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

# One real Arize Phoenix per session for every test asking for `phoenix` (tests/phoenix_server.py).
from .phoenix_server import phoenix, start_early, stop_early  # noqa: F401

# Tests never reach the internet: no Hugging Face hub look-ups, not even a DNS query.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# testcontainers reads these when it is imported. Ryuk (its reaper container) would be pulled
# first and no registry answers on CI; the fixture removes its own container instead. These
# machines have /.dockerenv, where testcontainers would connect to the bridge gateway (a
# 172.17.x address): tests talk only to loopback, where the container's port is published.
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
os.environ.setdefault("TESTCONTAINERS_HOST_OVERRIDE", "127.0.0.1")

FIXTURES = Path(__file__).parent / "wiremock"
WIREMOCK_IMAGE = os.environ.get("WIREMOCK_IMAGE", "wiremock/wiremock:3.13.2")
STARTUP_SECONDS = 60.0
DOCKER_PING_SECONDS = 5.0
DOCKER_PULL_SECONDS = 120.0


class WireMock:
    """A thin client for WireMock's admin API (stubs, scenarios, the request journal)."""

    def __init__(self, url: str, route: str = "unknown") -> None:
        self.url = url.rstrip("/")
        # How the tests reach it: "direct" (the jar on loopback), "docker-proxy" (a port Docker
        # publishes: its proxy turns a reset into a clean close) or "unknown" (WIREMOCK_URL).
        self.route = route
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


def _wait_ready(url: str, exited: Callable[[], str | None] = lambda: None) -> None:
    """Poll the admin API until it answers; `exited` says why the server died, if it did."""
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        reason = exited()
        if reason is not None:
            raise RuntimeError(f"WireMock exited before answering at {url}:\n{reason}")
        try:
            if httpx.get(url + "/__admin/mappings", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"WireMock at {url} did not answer within {STARTUP_SECONDS:.0f}s")


def _docker_image_available(image: str) -> str | None:
    """None when a Docker engine answers and has (or can pull) `image`, else why not."""
    try:
        import docker
    except ImportError:
        return "the 'docker' package is missing"
    try:
        client = docker.from_env(timeout=DOCKER_PING_SECONDS)
        client.ping()
    except Exception as exc:  # no engine: any of docker's, requests' or OS errors
        return f"no Docker engine answers ({type(exc).__name__})"
    try:
        try:
            client.images.get(image)
            return None
        except docker.errors.ImageNotFound:
            pass
        try:
            docker.from_env(timeout=DOCKER_PULL_SECONDS).images.pull(image)
            return None
        except Exception as exc:
            return (
                f"image {image} is not present and cannot be pulled ({type(exc).__name__}); "
                "build it with docker/wiremock/build.sh"
            )
    finally:
        client.close()


def _jar_path() -> Path:
    try:
        import wiremock
    except ImportError as exc:  # pragma: no cover - listed in the test extra
        raise RuntimeError(
            "the 'wiremock' package (which ships the WireMock jar) is missing: "
            "pip install -e '.[test]'"
        ) from exc
    jars = sorted((Path(wiremock.__file__).parent / "server").glob("wiremock-standalone-*.jar"))
    if not jars:
        raise RuntimeError(f"no WireMock standalone jar found next to {wiremock.__file__}")
    return jars[-1]


@dataclass(frozen=True)
class WireMockPlan:
    """Where this session's WireMock comes from, decided once before any test runs.

    `kind` is "external", "docker" or "jar"; `url` is where the tests will reach it (the port
    is chosen up front so the header can show it); `why` says why Docker was not used.
    """

    kind: str
    url: str
    detail: str = ""
    why: str = ""

    def header(self) -> str:
        if self.kind == "external":
            return f"wiremock: external at {self.url} (WIREMOCK_URL)"
        if self.kind == "docker":
            return f"wiremock: docker {self.detail} at {self.url}"
        if shutil.which("java") is None:
            return (
                f"wiremock: none: {self.why}, and no java on PATH to run the {self.detail} "
                "(install a JRE, or start a Docker engine with the image: docker/wiremock/build.sh)"
            )
        return f"wiremock: {self.detail} under java at {self.url} ({self.why})"


def _plan() -> WireMockPlan:
    external = os.environ.get("WIREMOCK_URL")
    if external:
        return WireMockPlan("external", external.rstrip("/"))
    url = f"http://127.0.0.1:{_free_port()}"
    why = _docker_image_available(WIREMOCK_IMAGE)
    if why is None:
        return WireMockPlan("docker", url, WIREMOCK_IMAGE)
    try:
        version = _jar_path().stem.removeprefix("wiremock-standalone-")
    except RuntimeError:
        version = "?"
    return WireMockPlan("jar", url, f"jar {version}", why)


_PLAN_KEY = pytest.StashKey[WireMockPlan]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_PLAN_KEY] = _plan()


def pytest_report_header(config: pytest.Config) -> str:
    return config.stash[_PLAN_KEY].header()


def pytest_collection_finish(session: pytest.Session) -> None:
    """The run's tests are known: start the servers they need that take long to start."""
    if not session.config.option.collectonly:
        start_early(session.items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    stop_early()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under `-q` (as `make test` runs) pytest prints no header: name the WireMock anyway."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and not reporter.showheader:
        reporter.write_line(session.config.stash[_PLAN_KEY].header())


def _run_in_docker(plan: WireMockPlan) -> Iterator[WireMock]:
    from testcontainers.core.container import DockerContainer

    port = int(plan.url.rsplit(":", 1)[1])
    container = (
        DockerContainer(plan.detail)
        .with_volume_mapping(str(FIXTURES), "/home/wiremock", "ro")
        .with_command("--disable-banner")
    )
    # Published on loopback only: `with_bind_ports` would bind every interface. The mapping
    # goes to docker-py's `ports=` as is, which takes (host address, host port).
    container.ports["8080/tcp"] = ("127.0.0.1", port)  # type: ignore[assignment]
    from testcontainers.core.config import testcontainers_config

    # Read here as well as at import: the fixture removes its own container, no reaper needed.
    testcontainers_config.ryuk_disabled = os.environ.get(
        "TESTCONTAINERS_RYUK_DISABLED", "true"
    ).lower() in {"true", "1", "yes"}
    container.start()

    def exited() -> str | None:
        wrapped = container.get_wrapped_container()
        wrapped.reload()
        if wrapped.status in {"exited", "dead"}:
            logs: bytes = wrapped.logs(tail=40)
            return logs.decode(errors="replace")
        return None

    try:
        _wait_ready(plan.url, exited)
        yield WireMock(plan.url, route="docker-proxy")
    finally:
        container.stop()  # stops and removes it


def _run_jar(plan: WireMockPlan) -> Iterator[WireMock]:
    java = shutil.which("java")
    if java is None:
        pytest.fail(
            f"WireMock needs Java or a Docker engine ({plan.why}): install a JRE (Debian: "
            "apt-get install -y default-jre-headless), or set WIREMOCK_URL to a running WireMock.",
            pytrace=False,
        )
    port = plan.url.rsplit(":", 1)[1]
    # WireMock's output goes to a file, not a pipe nobody reads: each unmatched request writes
    # about 1 KB, and a full 64 KiB pipe would block WireMock's request threads.
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below
    proc = subprocess.Popen(
        [
            java,
            "-jar",
            str(_jar_path()),
            "--port",
            port,
            "--bind-address",
            "127.0.0.1",
            "--root-dir",
            str(FIXTURES),
            "--disable-banner",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def exited() -> str | None:
        if proc.poll() is None:
            return None
        log.seek(0)
        out = log.read().decode(errors="replace")
        return f"java exited with {proc.returncode}:\n{out[-2000:]}"

    try:
        _wait_ready(plan.url, exited)
        yield WireMock(plan.url, route="direct")
    finally:
        proc.kill()
        proc.wait(timeout=10)
        log.close()


@pytest.fixture(scope="session")
def wiremock_server(pytestconfig: pytest.Config) -> Iterator[WireMock]:
    """One WireMock for the whole session, from the source the header names."""
    plan = pytestconfig.stash[_PLAN_KEY]
    if plan.kind == "external":
        _wait_ready(plan.url)
        yield WireMock(plan.url)
    elif plan.kind == "docker":
        yield from _run_in_docker(plan)
    else:
        yield from _run_jar(plan)


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


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """Each test starts from, and leaves behind, the same logging set-up.

    The CLI configures structlog (and bridges the OpenTelemetry SDK's loggers) into the stream
    it was given, which for an in-process CliRunner is closed after the command: left in place,
    the next test's log line would hit a closed file.
    """
    import logging

    import structlog

    saved = structlog.get_config()
    loggers = [logging.getLogger(n) for n in ("opentelemetry", "opentelemetry.exporter")]
    state = [(lg, list(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    yield
    structlog.configure(**saved)
    for lg, handlers, level, propagate in state:
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate
