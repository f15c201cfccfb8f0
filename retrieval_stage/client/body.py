"""Reading a response body within `max_response_bytes`, on the wire and after decoding.

httpx inflates each network chunk whole (a 1.6 KB brotli body became 2.1 GB), so counting
decoded bytes while iterating comes too late. The clients therefore ask only for what they can
decode with a bound (`ACCEPT_ENCODING`), read the raw bytes (``iter_raw``/``aiter_raw``, or any
transport's raw chunks) and feed them to a `BodyReader`, which inflates incrementally and never
holds more than the limit: over it, `RerankProtocolError` naming the limit, and the caller drops
the connection (a body read only in part cannot be reused). Any encoding we did not ask for,
or more than one, is refused before a byte is decoded.

`read_body` is the whole async loop in one call, for any transport that yields raw chunks (the
httpx client here; an aiohttp transport with ``auto_decompress=False`` can call it too).
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterable, Iterable, Mapping

from ..errors import RerankProtocolError

__all__ = [
    "ACCEPT_ENCODING",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "BodyReader",
    "already_read",
    "read_body",
    "read_body_sync",
]

DEFAULT_MAX_RESPONSE_BYTES = 4 * 1024 * 1024
"""4 MiB. A result is about 40-60 bytes of JSON (``{"index": 9999, "relevance_score":
0.123456789}``), so 10,000 results take about 0.5 MB: the default leaves room for eight times
that (longer scores, ids, a ``document`` field a server adds) while bounding what one response
can cost (decoding 4 MiB of JSON takes ~0.1-0.4 s of CPU and some tens of MB)."""

ACCEPT_ENCODING = "gzip, deflate"
"""What we ask for: the encodings `BodyReader` can inflate with a bound (``identity`` is
always acceptable). Brotli and zstd are not asked for, so never accepted."""

_DECODABLE = frozenset({"gzip", "x-gzip", "deflate"})


def _too_big(limit: int, what: str) -> RerankProtocolError:
    return RerankProtocolError(
        f"the response is larger than max_response_bytes={limit} ({what}); "
        "raise max_response_bytes if the service's answers are really this large"
    )


def _encoding(headers: Mapping[str, str]) -> str | None:
    """The one content coding to undo, None for identity; refuses what we did not ask for."""
    raw = headers.get("content-encoding", "")
    codings = [c.strip().lower() for c in raw.split(",") if c.strip()]
    codings = [c for c in codings if c != "identity"]
    if not codings:
        return None
    if len(codings) > 1 or codings[0] not in _DECODABLE:
        shown = ", ".join(codings)[:40]
        raise RerankProtocolError(
            f"the response has Content-Encoding {shown!r}, which was not asked for "
            f"(Accept-Encoding: {ACCEPT_ENCODING}): refused rather than decoded without a bound"
        )
    return codings[0]


class BodyReader:
    """Accumulates one response body, decoding it incrementally, never past `limit` bytes.

    `feed` each raw chunk as it arrives, then `finish` for the decoded body. Both raise
    `RerankProtocolError` as soon as the wire bytes or the decoded bytes pass the limit, or
    when the body cannot be decoded; nothing past the limit is ever buffered.
    """

    def __init__(self, headers: Mapping[str, str], limit: int) -> None:
        self.limit = limit
        self._coding = _encoding(headers)
        declared = headers.get("content-length")
        if declared is not None and declared.strip().isdigit():
            # A number of any length is compared as a string of digits: no int() of 5,000
            # digits (Python refuses those with a ValueError).
            digits = declared.strip().lstrip("0") or "0"
            if len(digits) > 19 or int(digits) > limit:
                raise _too_big(limit, "as its Content-Length says")
        self._wire = 0
        self._parts: list[bytes] = []
        self._size = 0
        self._inflate: zlib._Decompress | None = None
        self._raw_deflate_tried = False
        if self._coding is not None:
            self._inflate = self._new_inflater()

    def _new_inflater(self) -> zlib._Decompress:
        if self._coding == "deflate":
            return zlib.decompressobj(zlib.MAX_WBITS)  # zlib-wrapped, as RFC 9110 means it
        return zlib.decompressobj(16 + zlib.MAX_WBITS)

    def _keep(self, data: bytes) -> None:
        if not data:
            return
        self._size += len(data)
        if self._size > self.limit:
            raise _too_big(self.limit, "after decoding" if self._coding else "on the wire")
        self._parts.append(data)

    def feed(self, chunk: bytes) -> None:
        """Take the next raw chunk of the body."""
        self._wire += len(chunk)
        if self._wire > self.limit:
            raise _too_big(self.limit, "on the wire")
        if self._inflate is None:
            self._keep(chunk)
            return
        self._inflate_all(chunk)

    def _inflate_all(self, data: bytes) -> None:
        inflate = self._inflate
        assert inflate is not None
        while data:
            room = self.limit - self._size + 1  # one byte more than fits: then we know
            try:
                out = inflate.decompress(data, room)
            except zlib.error as exc:
                if self._coding == "deflate" and not self._raw_deflate_tried and not self._size:
                    # Some servers send raw deflate without the zlib wrapper (as httpx allows).
                    self._raw_deflate_tried = True
                    self._inflate = inflate = zlib.decompressobj(-zlib.MAX_WBITS)
                    continue
                raise RerankProtocolError(
                    f"the {self._coding} body could not be decoded ({type(exc).__name__})"
                ) from None
            self._keep(out)
            data = inflate.unconsumed_tail
            if inflate.eof and inflate.unused_data:
                # Another gzip member follows (concatenated streams decode to concatenation).
                data = inflate.unused_data
                self._inflate = inflate = self._new_inflater()

    def finish(self) -> bytes:
        """The decoded body; refuses a compressed body that ended early."""
        if self._inflate is not None:
            try:
                self._keep(self._inflate.flush())
            except zlib.error as exc:
                raise RerankProtocolError(
                    f"the {self._coding} body could not be decoded ({type(exc).__name__})"
                ) from None
            if self._wire and not self._inflate.eof:
                raise RerankProtocolError(f"the {self._coding} body ended before its end")
        return b"".join(self._parts)


def already_read(content: bytes, limit: int) -> bytes:
    """A body a transport read (and decoded) itself before handing the response over (as
    ``httpx.MockTransport`` does): only its size can still be checked."""
    if len(content) > limit:
        raise _too_big(limit, "as read by the transport")
    return content


def read_body_sync(headers: Mapping[str, str], chunks: Iterable[bytes], limit: int) -> bytes:
    """The decoded body of `chunks` (raw bytes as received), within `limit` bytes."""
    reader = BodyReader(headers, limit)
    for chunk in chunks:
        reader.feed(chunk)
    return reader.finish()


async def read_body(headers: Mapping[str, str], chunks: AsyncIterable[bytes], limit: int) -> bytes:
    """The decoded body of `chunks` (raw bytes as received), within `limit` bytes.

    For any async transport: httpx's ``response.aiter_raw()``, or aiohttp's
    ``response.content.iter_any()`` on a session made with ``auto_decompress=False`` (aiohttp
    would otherwise inflate without a bound). The caller closes the response on an error.
    """
    reader = BodyReader(headers, limit)
    async for chunk in chunks:
        reader.feed(chunk)
    return reader.finish()
