"""All masking of credentials and echoes, in one place.

Three promises rest here: an API key (or URL credential) never leaves in an error, log line,
span, metric or repr (also JSON-escaped, once or twice, or half-quoted: any run of
`KEY_MIN_CHARS` of it); a URL's ``user:password@``, query and fragment are never shown; and text
a server echoes from what we sent (the query, a document, raw or JSON-escaped) is replaced
before anything quotes it. Every byte of server text that can reach an error, log, span or
metric goes through `clean` (via `scrub`, or `client.sanitize.server_text` for a body): status
and header lines, transport messages, the model string, TEI's ``/info``.

What is cleaned is assembled first and cleaned once (pieces each too short to count as an echo
cannot join into one afterwards). The echo search costs (characters quoted) x (characters
sent); `CLEAN_BUDGET_CHARS` bounds that product, so against megabytes of documents fewer
characters are quoted, never more shown unchecked. `client.sanitize` picks a server's own words
out of its body and hands them here; the CLI and the telemetry set-up mask URLs here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TypeAlias
from urllib.parse import urlsplit

__all__ = [
    "CLEAN_BUDGET_CHARS",
    "ECHOED",
    "ECHO_MIN_CHARS",
    "KEY_MIN_CHARS",
    "LIMIT",
    "MASK",
    "WITHHELD",
    "Hay",
    "Secrets",
    "clean",
    "masked_url",
    "scrub",
    "scrubbed_message",
    "shown_url",
    "without_key",
    "without_key_bytes",
    "without_secrets_bytes",
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

CLEAN_BUDGET_CHARS = 60_000_000
"""The most characters the echo search may scan for one text (each quoted position may cost a
scan of everything sent, twice): tens of milliseconds of CPU at worst. Up to ~50 KB sent, the
whole quote is checked; beyond, the quote shrinks in proportion, to nothing (`WITHHELD`)."""

WITHHELD = "<message withheld: too much text was sent to check it for echoes>"

Secrets: TypeAlias = "str | Sequence[str] | None"
"""One secret, several (the key and URL credentials), or none."""

_SEPARATORS = "\x00\ufffe\uffff\U0010fffe\U0010ffff"


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


def _escaped(text: str) -> list[str]:
    """`text` and the forms JSON escaping gives it (ASCII-only or not, once or twice)."""
    forms = [text]
    for ascii_only in (True, False):
        once = json.dumps(text, ensure_ascii=ascii_only)[1:-1]
        forms += [once, json.dumps(once, ensure_ascii=ascii_only)[1:-1]]
    return list(dict.fromkeys(forms))


def _separator(texts: Sequence[str]) -> str:
    """A character in none of `texts`: joined by it, no window can straddle two of them (a
    document holding NUL is masked like any other)."""
    for sep in _SEPARATORS:
        if not any(sep in t for t in texts):
            return sep
    code = 0xE000  # the private use area: a text holding all of it is no real text
    while any(chr(code) in t for t in texts):
        code += 1
    return chr(code)


class Hay:
    """Everything sent (or every secret), in every form, joined by a separator none holds."""

    __slots__ = ("sep", "text")

    def __init__(self, texts: Sequence[str]) -> None:
        forms = [form for text in texts if text for form in _escaped(text)]
        self.sep = _separator(forms)
        self.text = self.sep.join(forms)


def haystack(sent: Sequence[str]) -> Hay:
    """`Hay` of what was sent: build it once per batch, clean many texts against it."""
    return Hay(sent)


def _secrets(secret: Secrets) -> list[str]:
    if secret is None:
        return []
    if isinstance(secret, str):
        return [secret] if secret else []
    return [s for s in secret if s]


def _secret_forms(secrets: list[str]) -> list[str]:
    return sorted({f for s in secrets for f in _escaped(s)}, key=len, reverse=True)


def without_secrets_bytes(content: bytes, secret: Secrets) -> bytes:
    """`content` with every form of every secret replaced, before it is decoded or cut."""
    for form in _secret_forms(_secrets(secret)):
        content = content.replace(form.encode("utf-8", "surrogatepass"), MASK.encode())
    return content


def _mask_runs(text: str, hay: Hay, n: int, replacement: str) -> str:
    """`text` with every run of `n` or more characters that also occurs in `hay` replaced."""
    haystack, sep = hay.text, hay.sep
    if not haystack or len(text) < n:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        window = text[i : i + n]
        if len(window) == n and sep not in window and window in haystack:
            j = i + n
            while j < len(text) and text[j] != sep and text[i : j + 1] in haystack:
                j += 1
            out.append(replacement)
            i = j
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def quotable(hay: Hay, wanted: int) -> int:
    """How many characters can be checked against `hay` within `CLEAN_BUDGET_CHARS`."""
    return min(wanted, CLEAN_BUDGET_CHARS // (2 * len(hay.text) + 1))


def clean(text: str, hay: Hay, secret: Secrets = None, limit: int = LIMIT) -> str:
    """`text` with every secret and every echo of `hay` replaced, cut to `limit` characters.

    Secrets go first and whole (a cut would leave part of one), then the text is cut to what
    can be checked, then runs of the secrets and echoes of what was sent are masked.
    """
    secrets = _secrets(secret)
    for form in _secret_forms(secrets):
        text = text.replace(form, MASK)
    window = quotable(hay, limit * 2)
    if text and hay.text and window < ECHO_MIN_CHARS:
        return WITHHELD
    cut = len(text) > window
    text = text[:window]
    if secrets:
        text = _mask_runs(text, Hay(secrets), KEY_MIN_CHARS, MASK)
    text = _mask_runs(text, hay, ECHO_MIN_CHARS, ECHOED)
    if len(text) > limit:
        return text[: limit - 3] + "..."
    return text + "..." if cut else text


def scrub(text: str, sent: Sequence[str], secret: Secrets = None, limit: int = LIMIT) -> str:
    """`text` (any server text: a header, a status line, a model name, a transport message)
    with every secret and every echo of `sent` replaced, cut to `limit` characters."""
    return clean(text, Hay(sent), secret, limit)
