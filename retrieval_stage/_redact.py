"""All masking of credentials and echoes, in one place.

Three promises rest here: an API key never leaves in an error, log line, span or repr (also
half-quoted: any run of `KEY_MIN_CHARS` of it); a URL's ``user:password@``, query and fragment are
never shown; and text a server echoes from what we sent (the query, a document, raw or
JSON-escaped) is replaced before anything quotes it. `client.sanitize` picks a server's own words
out of its body and hands them here; the CLI and the telemetry set-up mask URLs here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from urllib.parse import urlsplit

__all__ = [
    "ECHOED",
    "ECHO_MIN_CHARS",
    "KEY_MIN_CHARS",
    "LIMIT",
    "MASK",
    "masked_url",
    "scrub",
    "scrub_window",
    "scrubbed_message",
    "shown_url",
    "without_key",
    "without_key_bytes",
]

MASK = "***"

ECHO_MIN_CHARS = 10
"""The shortest run of the caller's text that counts as an echo: about two words. Shorter runs
are mostly single words a server's explanation shares with any text ("document", "maximum");
10 characters of a document are already a recognisable fragment of it."""

ECHOED = "<echo removed>"
LIMIT = 300
"""Characters of a server's message kept in an error: enough for any provider's explanation."""

KEY_MIN_CHARS = 8
"""The shortest run of the API key that counts as an echo of it: a server that quotes a key
half-masked (``sk-live-ABCD****6789``) still gives away what it shows."""

_SEP = "\x00"


# -- credentials --------------------------------------------------------------------------


def without_key(text: str, secret: str | None) -> str:
    """`text` with every whole occurrence of `secret` replaced (before any cut could split it)."""
    return text.replace(secret, MASK) if secret else text


def without_key_bytes(content: bytes, secret: str | None) -> bytes:
    """`without_key` on raw bytes, before they are decoded or cut."""
    return content.replace(secret.encode(), MASK.encode()) if secret else content


def masked_url(url: object) -> object:
    """`url` with any ``user:password@`` part replaced, for reprs and messages.

    Whatever stands before the last ``@`` is taken for userinfo, whatever the scheme (``host``
    alone, as gRPC endpoints are written, too) and even when a password holds an unencoded
    ``/`` or ``?``: masking too much is harmless, showing a password is not.
    """
    if not isinstance(url, str) or "@" not in url:
        return url
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    return f"{scheme}{sep}{MASK}@{rest.rsplit('@', 1)[1]}"


def shown_url(url: str) -> str:
    """`url` without ``user:password@``, query or fragment: an endpoint can carry a credential
    in any of them (``?key=...`` for some gateways), and what is shown lands in terminals, CI
    logs and bug reports."""
    return str(masked_url(url)).split("#", 1)[0].split("?", 1)[0]


def scrubbed_message(message: str, url: str | None) -> str:
    """`message` with `url`'s password, query string and fragment replaced by ``***``.

    Error messages can quote the URL (a client's own check, a service echoing the request).
    """
    if not url:
        return message
    parts = urlsplit(url)
    # A token may stand alone as the username (https://TOKEN@host).
    secrets = [url, str(parts.password or parts.username or ""), parts.query, parts.fragment]
    message = message.replace(url, shown_url(url))
    for secret in sorted(secrets[1:], key=len, reverse=True):
        if len(secret) >= 3:  # a one- or two-character "secret" would mangle the message
            message = message.replace(secret, MASK)
    return message


# -- echoes -------------------------------------------------------------------------------


def haystack(sent: Sequence[str]) -> str:
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


def scrub(text: str, sent: Sequence[str], secret: str | None = None, limit: int = LIMIT) -> str:
    """`text` with `secret` and every echo of `sent` replaced, cut to `limit` characters."""
    cleaned = scrub_window(text, haystack(sent), secret, limit * 2)
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 3] + "..."


def scrub_window(text: str, hay: str, secret: str | None, window: int = LIMIT * 2) -> str:
    """`text`'s first `window` characters (all that can be quoted: cutting first bounds the
    work by the window, not by the body's size) with the key and echoes replaced."""
    text = without_key(text, secret)[:window]
    if secret:
        text = _mask_runs(text, secret, KEY_MIN_CHARS, MASK)
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
