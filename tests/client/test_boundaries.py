"""Promises an audit with hand-made mutants found unguarded (issue 23, last paragraph).

Each test here fails on the mutant named in its docstring: the `min_score` boundary, an
out-of-range ``index == n`` in the unit and property tests, and the write and connect caps of
the deadline I/O. (The masking gaps are in test_sanitizer_pieces.py.)
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import httpcore
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval_stage import Candidate, NullReranker, RerankProtocolError, RerankStage
from retrieval_stage.client.deadline_io import CALL_DEADLINE, DeadlineBackend
from retrieval_stage.client.providers import PROVIDERS, get_format, parse_response


class _Fixed:
    """A reranker answering fixed scores, to place one exactly on the threshold."""

    def __init__(self, scores: list[float]) -> None:
        self.scores = scores

    def rerank(self, query: str, items: list[Any], **kw: Any) -> list[tuple[Any, float]]:
        return list(zip(items, self.scores, strict=True))


def test_min_score_keeps_a_score_equal_to_it() -> None:
    """Mutant: ``s > min_score`` instead of ``>=``."""
    cands = [Candidate("a", "x"), Candidate("b", "y"), Candidate("c", "z")]
    out = RerankStage(_Fixed([0.5, 0.7, 0.4]), min_score=0.5).run("q", cands)
    assert [o.candidate.id for o in out] == ["b", "a"]
    assert NullReranker  # the null reranker is not involved; the import guards the public name


def _body(fmt_name: str, indices: list[int]) -> Any:
    fmt = get_format(fmt_name)
    if fmt.id_mapped:
        entries = [{"id": str(i), fmt.score_key: 0.5} for i in indices]
    else:
        entries = [{"index": i, fmt.score_key: 0.5} for i in indices]
    return entries if fmt.results_key is None else {fmt.results_key: entries}


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_an_index_equal_to_the_number_of_texts_is_refused(provider: str) -> None:
    """Mutant: ``0 <= index <= n_texts`` (or ``int(raw_id) > n_texts``)."""
    n = 3
    with pytest.raises(RerankProtocolError):
        parse_response(get_format(provider), _body(provider, [0, 1, n]), {}, n_texts=n,
                       expected=n)  # fmt: skip


@settings(deadline=None)  # pure, but CI builds images alongside: no 200 ms deadline
@given(n=st.integers(1, 50), data=st.data())
def test_any_index_at_or_past_the_end_is_refused(n: int, data: st.DataObject) -> None:
    provider = data.draw(st.sampled_from(sorted(PROVIDERS)))
    bad = data.draw(st.integers(n, n + 3))
    indices = [*range(n - 1), bad]
    with pytest.raises(RerankProtocolError):
        parse_response(get_format(provider), _body(provider, indices), {}, n_texts=n, expected=n)


class _Recorder(httpcore.NetworkStream):
    def __init__(self, seen: list[float | None]) -> None:
        self.seen = seen

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self.seen.append(timeout)
        return b""

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.seen.append(timeout)

    def close(self) -> None:
        pass


class _Backend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self.timeouts: list[float | None] = []

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        self.timeouts.append(timeout)
        return _Recorder(self.timeouts)

    def sleep(self, seconds: float) -> None:
        pass


@pytest.mark.parametrize("operation", ["connect", "write", "read"])
def test_every_socket_operation_is_capped_at_the_time_left(operation: str) -> None:
    """Mutant: the cap dropped from connect or write (only read was guarded)."""
    inner = _Backend()
    backend = DeadlineBackend(inner)
    token = CALL_DEADLINE.set(time.monotonic() + 0.5)
    try:
        stream = backend.connect_tcp("127.0.0.1", 1, timeout=30.0)
        if operation == "write":
            stream.write(b"x", timeout=30.0)
        elif operation == "read":
            stream.read(10, timeout=30.0)
    finally:
        CALL_DEADLINE.reset(token)
    capped = inner.timeouts[-1]
    assert capped is not None, inner.timeouts
    assert capped <= 0.5, inner.timeouts
