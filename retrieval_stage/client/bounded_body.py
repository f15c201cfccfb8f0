"""A response body read under a byte cap, its encodings undone without unbounded inflation.

A hostile or broken server can answer with a body of any size, or a few KB of gzip that
inflate to gigabytes. A client reads through `CappedBody`: chunks in, never more than `cap`
bytes of any layer's output held, and `BodyRefused` (naming ``max_response_bytes`` or the
encoding) the moment the cap would be passed. We ask for gzip and deflate only
(`ACCEPT_ENCODING`); any other content-encoding is refused before a byte of it is decoded.
Transport-neutral (zlib only), so any driver can read through it.
"""

from __future__ import annotations

import zlib
from typing import Any

__all__ = ["ACCEPT_ENCODING", "BodyRefused", "CappedBody", "decoders", "too_large"]

ACCEPT_ENCODING = "gzip, deflate"
"""What we ask for; a response in any other encoding is refused rather than decoded."""

_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_IDENTITY = ("", "identity")


class BodyRefused(Exception):
    """The response cannot be read within our bounds: too large, or in an encoding we did
    not offer. The message says which, naming the limit or the encoding."""


def too_large(cap: int, what: str = "", detail: str = "") -> BodyRefused:
    """The refusal of a body over `cap` bytes; names the setting, so the fix is plain."""
    return BodyRefused(f"the {what}response body is larger than max_response_bytes={cap}{detail}")


def decoders(content_encoding: str) -> list[Any]:
    """zlib decoders for a Content-Encoding header, in the order to apply them (the last
    encoding applied is undone first); `BodyRefused` for an encoding we did not ask for."""
    layers = [part.strip().lower() for part in content_encoding.split(",")]
    layers = [layer for layer in layers if layer not in _IDENTITY]
    for layer in layers:
        if layer not in _WBITS:
            raise BodyRefused(
                f"Content-Encoding {content_encoding!r}, which we did not ask for "
                f"(Accept-Encoding: {ACCEPT_ENCODING})"
            )
    return [zlib.decompressobj(_WBITS[layer]) for layer in reversed(layers)]


class CappedBody:
    """Collects a body, undoing its encodings, never holding more than `cap` bytes of any
    layer's output."""

    def __init__(self, cap: int, content_encoding: str) -> None:
        self.cap = cap
        self._decoders = decoders(content_encoding)
        self._produced = [0] * len(self._decoders)
        self._parts: list[bytes] = []
        self._size = 0

    def _too_large(self) -> BodyRefused:
        return too_large(self.cap, "decoded " if self._decoders else "")

    def feed(self, data: bytes) -> None:
        for i, decoder in enumerate(self._decoders):
            # At most one byte past the cap out of any call: a bomb never inflates further.
            data = decoder.decompress(data, self.cap - self._produced[i] + 1)
            self._produced[i] += len(data)
            if self._produced[i] > self.cap:
                raise self._too_large()
        self._add(data)

    def _add(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > self.cap:
            raise self._too_large()
        if data:
            self._parts.append(data)

    def finish(self) -> bytes:
        for i, decoder in enumerate(self._decoders):
            # Every layer consumed all its input under the cap, so what it still holds is
            # small; push it through the layers after it.
            data = decoder.flush()
            for later in self._decoders[i + 1 :]:
                data = later.decompress(data, self.cap + 1)
            self._add(data)
        return b"".join(self._parts)
