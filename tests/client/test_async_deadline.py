"""The async client's one deadline per call on its default (aiohttp) path, both ways it is kept.

On Python 3.11+ the aiohttp path bounds a call with ``asyncio.timeout_at`` (a fifth of anyio's
cancel scope's CPU, issue 26); before 3.11, and with a caller's ``http_client``, anyio's cancel
scope does. Both are run here against a real loopback server that trickles its answers' headers
a byte at a time (so no per-read timeout ever fires, only the call's deadline can end it): a call
of several concurrent sub-batches ends at its deadline with the deadline's error, every
sub-batch's request is abandoned, and the same client then serves the next call.
"""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from retrieval_stage import AsyncRerankClient, RerankTransportError
from retrieval_stage.client import asynchronous

from .test_aiohttp_io import loopback, response, tei_scores

DEADLINE_S = 0.5
MARGIN_S = 5.0
"""Generous: a loaded 2-core machine may be slow to notice, but not by the hang's length."""

TRICKLE_S = 0.1
"""Between two bytes of a hung answer's headers: 300 of them would take 30 s."""

WAYS = ["asyncio.timeout_at", "anyio cancel scope"]


@pytest.mark.parametrize("way", WAYS)
async def test_a_call_of_hung_sub_batches_ends_at_its_deadline_and_the_client_serves_on(
    way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if way == "anyio cancel scope":
        monkeypatch.setattr(asynchronous, "_timeout_at", None)
    elif sys.version_info < (3, 11):
        pytest.skip("asyncio.timeout_at is Python 3.11+: the anyio way runs instead")
    hang = True

    async def answer(headers: dict[str, str], body: bytes, writer: asyncio.StreamWriter) -> None:
        if hang:
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 300:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(TRICKLE_S)
        writer.write(response(tei_scores(headers, body)))

    texts = [f"t{i}" for i in range(6)]
    async with (
        loopback(answer) as (url, seen),
        AsyncRerankClient(url, batch_size=2, timeout=DEADLINE_S, max_retries=0) as client,
    ):
        started = time.monotonic()
        with pytest.raises(RerankTransportError, match=r"no answer within the 0\.5 s deadline"):
            await client.rerank("q", texts)
        assert time.monotonic() - started < DEADLINE_S + MARGIN_S
        assert len(seen.bodies) == 3, "the three sub-batches were sent side by side"
        hang = False
        got = await client.rerank_response("q", texts)
        assert got.batches == 3
        assert sorted(t for t, _ in got.results) == sorted(texts)
        # The hung connections were dropped, never handed back with an answer still due.
        assert seen.connections == 6
