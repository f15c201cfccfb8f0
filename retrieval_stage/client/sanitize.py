"""A server's error body reduced to its own words, safe to quote in an error, log or span.

A server's error may echo what it was sent: FastAPI's validation errors carry the submitted
documents in ``input``, TEI and others quote a too-long query. docs/library.md promises that logs
and spans carry no query or document text (also with ``OPENINFERENCE_HIDE_INPUTS``), so every
error body goes through `server_text` before any `RerankError` quotes it:

- every secret (the API key, URL credentials) is replaced in the raw bytes, in every form JSON
  escaping gives it, before anything decodes or cuts the body;
- the provider's own message is picked out and assembled (`error_bodies.error_message`: status
  words, error type, FastAPI's ``type: msg (at loc)``) with FastAPI's ``input`` fields dropped;
- the assembled message is cleaned once by `retrieval_stage._redact.clean` (secrets again, runs
  of them, echoes of the query and the submitted texts) and cut to `LIMIT` characters.

Cleaning after assembling means pieces each too short to count as an echo cannot join into
one, and a list of a thousand entries costs one cleaning, not a thousand.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._redact import (
    ECHO_MIN_CHARS,
    ECHOED,
    LIMIT,
    Hay,
    Secrets,
    clean,
    haystack,
    quotable,
    without_secrets_bytes,
)
from .error_bodies import error_message

__all__ = ["ECHOED", "ECHO_MIN_CHARS", "LIMIT", "server_text"]


def server_text(content: bytes, sent: Sequence[str] | Hay, secret: Secrets = None) -> str:
    """A server's error body reduced to its own explanation, safe to quote (see module doc).
    `sent` is what was sent, or its `Hay` when one is at hand."""
    content = without_secrets_bytes(content, secret)
    hay = sent if isinstance(sent, Hay) else haystack(sent)
    # Assembled up to what can be checked (plus room for secrets to shrink), cleaned once.
    message = error_message(content, limit=max(quotable(hay, LIMIT * 2), ECHO_MIN_CHARS) * 2)
    return clean(message, hay, secret, LIMIT)
