"""A server's error body reduced to its own words, safe to quote in an error, log or span.

A server's error may echo what it was sent: FastAPI's validation errors carry the submitted
documents in ``input``, TEI and others quote a too-long query. The README promises that logs
and spans carry no query or document text (also with ``OPENINFERENCE_HIDE_INPUTS``), so every
error body goes through `server_text` before any `RerankError` quotes it:

- the API key is replaced first, in the raw bytes and after decoding (a server may echo it,
  JSON-escaped or not), before anything cuts the text (a cut key would survive); then any run
  of `KEY_MIN_CHARS` characters of it (a half-masked quote of the key);
- the provider's own message is picked out (`providers.error_message`: status words, error
  type, FastAPI's ``msg``) with FastAPI's ``input`` fields dropped;
- in its free text (not FastAPI's ``type`` and ``loc``, the server's own names), any run of
  `ECHO_MIN_CHARS` or more characters that also occurs in the query or in a
  submitted text (raw or JSON-escaped) is replaced by `ECHOED`;
- the rest is cut to `LIMIT` characters.

The masking itself lives in `retrieval_stage._redact`, shared with the CLI and telemetry set-up.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._redact import LIMIT, haystack, scrub_window, without_key_bytes
from .providers import error_message

__all__ = ["server_text"]


def server_text(content: bytes, sent: Sequence[str], secret: str | None = None) -> str:
    """A server's error body reduced to its own explanation, safe to quote (see module doc)."""
    content = without_key_bytes(content, secret)
    hay = haystack(sent)
    text = error_message(content, limit=LIMIT * 2, clean=lambda t: scrub_window(t, hay, secret))
    return text if len(text) <= LIMIT else text[: LIMIT - 3] + "..."
