"""Connections under a real ``retrieval-stage serve`` (lexical, on loopback) whose open-file
limit is lowered to 256: silent and slow clients are closed after the header timeout, a body
trickled in is answered 408 after the body timeout and its connection closed, a flood
of idle connections never locks a real client out, and running out of descriptors is said in
a few log lines, not megabytes of them."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from retrieval_stage.server.connections import default_max_connections

from .served import Served, start_server

OPEN_FILES = 256
HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 2.0
CLOSE_MARGIN_S = 20.0
"""How much later than the header timeout a busy shared machine may close a connection."""


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("guarded-lexical")
    args = ("--reranker", "lexical", "--header-timeout", str(HEADER_TIMEOUT_S))
    args += ("--body-timeout", str(BODY_TIMEOUT_S))
    with start_server(tmp, *args, open_files=OPEN_FILES) as served:
        yield served


def _connect(served: Served) -> socket.socket:
    host, port = served.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=5.0)


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    """True once the server closes `sock` (EOF or reset) within `within` seconds."""
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _rerank(served: Served) -> httpx.Response:
    body = {"query": "delete a directory", "texts": ["rmtree deletes a directory", "bananas"]}
    return httpx.post(served.url + "/rerank", json=body, timeout=30.0)


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(
    guarded: Served,
) -> None:
    sockets = [_connect(guarded) for _ in range(20)]
    try:
        started = time.monotonic()
        assert all(_closed_by_server(s, HEADER_TIMEOUT_S + CLOSE_MARGIN_S) for s in sockets)
        assert time.monotonic() - started >= HEADER_TIMEOUT_S * 0.9
    finally:
        for s in sockets:
            s.close()


def test_a_header_sent_a_byte_at_a_time_is_cut_off_at_the_header_timeout(
    guarded: Served,
) -> None:
    with contextlib.closing(_connect(guarded)) as sock:
        started = time.monotonic()
        sock.sendall(b"POST /rerank HTTP/1.1\r\nHost: x\r\n")
        deadline = started + HEADER_TIMEOUT_S + CLOSE_MARGIN_S
        closed = False
        while time.monotonic() < deadline and not closed:
            try:
                sock.sendall(b"X")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            closed = _closed_by_server(sock, 0.3)
        assert closed, "the server kept a slow header's connection open"
        assert time.monotonic() - started >= HEADER_TIMEOUT_S * 0.9


def _read_until_closed(sock: socket.socket, within: float) -> tuple[bytes, bool]:
    """What the server sends on `sock` within `within` seconds, and whether it then closed."""
    sock.settimeout(within)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        return data, False
    except ConnectionResetError:
        pass
    return data, True


def test_a_body_trickled_in_is_answered_408_and_its_connection_closed(guarded: Served) -> None:
    head = (
        b"POST /rerank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 4096\r\n\r\n"
    )
    with contextlib.closing(_connect(guarded)) as sock:
        started = time.monotonic()
        sock.sendall(head + b'{"query": "private words", "texts": ["')
        # A byte every 0.3 s: each read the server makes gets something, none completes it.
        answer, closed = b"", False
        while not answer and time.monotonic() < started + BODY_TIMEOUT_S + CLOSE_MARGIN_S:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(b"a")
            answer, closed = _read_until_closed(sock, 0.3)
        if answer and not closed:
            more, closed = _read_until_closed(sock, CLOSE_MARGIN_S)
            answer += more
        took = time.monotonic() - started
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 408"), answer[:200]
    assert closed, "the connection stayed open after the 408"
    body = json.loads(rest.partition(b"\r\n\r\n")[2])
    assert body["error_type"] == "RequestTimeout"
    assert "bytes received" in body["error"]
    assert b"private" not in answer, "the answer echoed what the client sent"
    assert took >= BODY_TIMEOUT_S * 0.9
    assert _rerank(guarded).status_code == 200, "the server still serves everyone else"
    assert any(line.get("status") == 408 for line in guarded.log_lines()), "408 not logged"


def test_a_flood_of_idle_connections_never_locks_a_real_client_out(guarded: Served) -> None:
    cap = default_max_connections(OPEN_FILES)
    flood = [_connect(guarded) for _ in range(cap + 150)]  # far past the descriptors left
    try:
        for _ in range(3):
            reply = _rerank(guarded)
            assert reply.status_code == 200, reply.text
            assert [r["index"] for r in reply.json()] == [0, 1]
        closed = sum(_closed_by_server(s, 0.01) for s in flood[:150])
        assert closed >= 140, "the longest-idle connections make room for newcomers"
    finally:
        for s in flood:
            s.close()
    assert httpx.get(guarded.url + "/health", timeout=10.0).status_code == 200
    lines = guarded.log_lines()
    said = [line for line in lines if line.get("event") == "server.connection_evicted"]
    assert 1 <= len(said) <= 3, said
    flooded = [line for line in lines if "Too many open files" in json.dumps(line)]
    assert len(flooded) <= 3, flooded[:3]
    assert len(guarded.log_text()) < 200_000


def test_running_out_of_descriptors_is_said_in_a_few_lines(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A cap set above the open-file limit: ``accept`` fails for want of descriptors, said at
    most once per ten seconds; once the silent connections time out, clients are served."""
    tmp = tmp_path_factory.mktemp("unbounded-lexical")
    args = ("--reranker", "lexical", "--header-timeout", str(HEADER_TIMEOUT_S))
    args += ("--body-timeout", str(BODY_TIMEOUT_S))
    with start_server(tmp, *args, "--max-connections", "100000", open_files=OPEN_FILES) as served:
        flood = [_connect(served) for _ in range(OPEN_FILES + 100)]
        try:
            time.sleep(1.0)  # the loop keeps trying to accept the ones it cannot
            for s in flood:
                s.close()
            deadline = time.monotonic() + HEADER_TIMEOUT_S + CLOSE_MARGIN_S
            while True:
                try:
                    if _rerank(served).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "the server never recovered"
                time.sleep(0.2)
        finally:
            for s in flood:
                s.close()
        lines = served.log_lines()
        said = [line for line in lines if line.get("event") == "server.accept_failed"]
        assert 1 <= len(said) <= 3, said
        assert said[0]["error"] == "OSError"
        assert not [line for line in lines if "Too many open files" in json.dumps(line)]
        assert len(served.log_text()) < 200_000


CAP = 3
"""`--max-connections` of the capped server below."""


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("capped-lexical")
    args = ("--reranker", "lexical", "--max-connections", str(CAP))
    args += ("--header-timeout", "30", "--body-timeout", "30")
    with start_server(tmp, *args) as served:
        yield served


REFUSAL_S = 5.0
"""Generous: a refused connection is closed as soon as it is accepted."""
HEADS_READ_S = 2.0
"""Generous: how long the server may take to read a request head sent on loopback."""


def test_one_connection_over_the_cap_is_refused_when_none_is_idle(capped: Served) -> None:
    # CAP connections each in the middle of a request body (busy, so none can be evicted):
    # the next one is closed at once, and one more is still one too many.
    head = (
        b"POST /rerank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 4096\r\n\r\n"
    )
    busy = [_connect(capped) for _ in range(CAP)]
    try:
        for sock in busy:
            sock.sendall(head + b'{"query": "q", "texts": ["')
        time.sleep(HEADS_READ_S)  # the server has read their heads: they are busy now
        for _ in range(2):
            with contextlib.closing(_connect(capped)) as extra:
                assert _closed_by_server(extra, REFUSAL_S), "a connection over the cap was kept"
        assert not any(_closed_by_server(s, 0.05) for s in busy), "a busy one was closed"
    finally:
        for sock in busy:
            sock.close()
    assert _rerank(capped).status_code == 200, "room again once they are gone"


def _answered_and_kept(served: Served) -> socket.socket:
    """A keep-alive connection that made one request and read its whole answer."""
    body = json.dumps({"query": "q", "texts": ["a", "b"]}).encode()
    sock = _connect(served)
    sock.sendall(
        b"POST /rerank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    sock.settimeout(CLOSE_MARGIN_S)
    answer = b""
    while not (b"\r\n\r\n" in answer and answer.rstrip().endswith(b"]")):
        chunk = sock.recv(65536)
        assert chunk, f"closed before the answer: {answer[:100]!r}"
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:100]
    return sock


def test_connections_idle_after_their_answer_make_room_for_a_newcomer(capped: Served) -> None:
    # After a response, a kept connection waits for its next request head again: idle, so the
    # longest-idle one is closed for a newcomer at the cap (a mutation that left the idle timer
    # unarmed after a response kept them all and locked the newcomer out: issue 51, point 9).
    kept = [_answered_and_kept(capped) for _ in range(CAP)]
    try:
        reply = _rerank(capped)
        assert reply.status_code == 200, reply.text
        assert _closed_by_server(kept[0], REFUSAL_S), "the longest-idle one was not closed"
    finally:
        for sock in kept:
            sock.close()
