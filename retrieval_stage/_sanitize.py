"""The one place a server's words are made safe to quote in an error, a log line or a span.

A server's error may echo what it was sent: FastAPI's validation errors carry the submitted
documents in ``input``, TEI and others quote a too-long query. The README promises that logs
and spans carry no query or document text (also with ``OPENINFERENCE_HIDE_INPUTS``), so every
text from a server goes through `server_text` before any `RerankError` quotes it:

- the API key is replaced first, in the raw bytes and after decoding (a server may echo it,
  JSON-escaped or not), before anything cuts the text (a cut key would survive); then any run
  of `KEY_MIN_CHARS` characters of it (a half-masked quote of the key);
- the provider's own message is picked out (`providers.error_message`: status words, error
  type, FastAPI's ``msg``) with FastAPI's ``input`` fields dropped;
- in its free text (not FastAPI's ``type`` and ``loc``, the server's own names), any run of
  `ECHO_MIN_CHARS` or more characters that also occurs in the query or in a
  submitted text (raw or JSON-escaped) is replaced by `ECHOED`;
- the rest is cut to `LIMIT` characters.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from .providers import error_message

__all__ = ["ECHOED", "ECHO_MIN_CHARS", "KEY_MIN_CHARS", "LIMIT", "scrub", "server_text"]

ECHO_MIN_CHARS = 10
"""The shortest run of the caller's text that counts as an echo: about two words. Shorter runs
are mostly single words a server's explanation shares with any text ("document", "maximum");
10 characters of a document are already a recognisable fragment of it."""

ECHOED = "<echo removed>"
LIMIT = 300
"""Characters of a server's message kept in an error: enough for any provider's explanation."""

_SEP = "\x00"


def _haystack(sent: Sequence[str]) -> str:
    """Everything we sent, raw and as JSON would escape it, joined by a separator that no
    window can straddle."""
    forms: list[str] = []
    for text in sent:
        forms.append(text)
        for ascii_only in (True, False):
            escaped = json.dumps(text, ensure_ascii=ascii_only)[1:-1]
            if escaped != text:
                forms.append(escaped)
    return _SEP.join(forms)


KEY_MIN_CHARS = 8
"""The shortest run of the API key that counts as an echo of it: a server that quotes a key
half-masked (``sk-live-ABCD****6789``) still gives away what it shows."""


def scrub(text: str, sent: Sequence[str], secret: str | None = None, limit: int = LIMIT) -> str:
    """`text` with `secret` and every echo of `sent` replaced, cut to `limit` characters."""
    cleaned = _scrub(text, _haystack(sent), secret, limit * 2)
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 3] + "..."


def _scrub(text: str, hay: str, secret: str | None, window: int = LIMIT * 2) -> str:
    """`text`'s first `window` characters (all that can be quoted: cutting first bounds the
    work by the window, not by the body's size) with the key and echoes replaced."""
    if secret:
        text = text.replace(secret, "***")  # whole, before the cut can split it
    text = text[:window]
    if secret:
        text = _mask_runs(text, secret, KEY_MIN_CHARS, "***")
    return _mask_runs(text, hay, ECHO_MIN_CHARS, ECHOED)


def _mask_runs(text: str, hay: str, n: int, replacement: str) -> str:
    """`text` with every run of `n` or more characters that also occurs in `hay` replaced."""
    if not hay or len(text) < n:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        if i + n <= len(text) and _SEP not in text[i : i + n] and text[i : i + n] in hay:
            j = i + n
            while j < len(text) and text[i : j + 1] in hay:
                j += 1
            out.append(replacement)
            i = j
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def server_text(content: bytes, sent: Sequence[str], secret: str | None = None) -> str:
    """A server's error body reduced to its own explanation, safe to quote (see module doc)."""
    if secret:
        content = content.replace(secret.encode(), b"***")
    hay = _haystack(sent)
    text = error_message(content, limit=LIMIT * 2, clean=lambda t: _scrub(t, hay, secret))
    return text if len(text) <= LIMIT else text[: LIMIT - 3] + "..."
