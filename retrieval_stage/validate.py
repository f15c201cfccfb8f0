"""One rule per setting, checked once where the value enters the library.

`RerankSettings` (and through it the CLI and the environment), the clients, the stage, the
chain's breakers and the server apply these functions, so a value accepted in one place is
accepted everywhere. A refusal raises
`InvalidSetting`, a `ValueError` whose `field` names the setting, so callers (the CLI maps it to
an option, ``config`` to a variable) never parse the message. Messages never repeat an API key
or an endpoint (either may carry a credential).
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Mapping
from typing import Any, Literal, TypeAlias
from urllib.parse import unquote, urlsplit

__all__ = [
    "BatchSize",
    "InvalidSetting",
    "api_key",
    "batch_size",
    "count",
    "endpoint",
    "env_flag",
    "finite_number",
    "header_name",
    "max_content_length",
    "max_response_bytes",
    "min_score",
    "on_error",
    "provider",
    "relabelled",
    "seconds",
    "split_credentials",
    "stage_options",
    "timeout",
    "top_k",
]

BatchSize: TypeAlias = int | Literal["auto"] | None

LOCAL_PROVIDER = "local"
"""The provider that runs a model in process (the [local] extra); it takes no endpoint."""

_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""An HTTP header field name (RFC 9110 token)."""

_UNSENDABLE = re.compile(r"[\x00-\x1f\x7f]")
"""Control characters (CR and LF among them): they would end or corrupt the header line."""


class InvalidSetting(ValueError):
    """A setting that cannot be used. `field` names it (``api_key``, ``timeout``...), `reason`
    says why without repeating the value; ``str()`` is ``"<label> <reason>"``, where `label`
    (default: `field`) is the name the user gave it (``RERANK_TIMEOUT``, ``--timeout``)."""

    def __init__(self, field: str, reason: str, label: str | None = None) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{label or field} {reason}")


def finite_number(
    value: Any,
    field: str,
    *,
    positive: bool = False,
    nonnegative: bool = False,
    noun: str = "number",
) -> float:
    """`value` as a float: an int or float, not a bool, finite (and > 0 when `positive`,
    >= 0 when `nonnegative`).

    `noun` names what the number is in messages (``number of seconds``).
    """
    bound = " > 0" if positive else " >= 0" if nonnegative else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidSetting(field, f"must be a {noun}, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        number = math.inf
    if not math.isfinite(number) or (positive and number <= 0) or (nonnegative and number < 0):
        raise InvalidSetting(field, f"must be a finite {noun}{bound}")
    return number


def count(value: Any, field: str) -> int:
    """A count of at least one (failures that open a circuit, texts per batch, queue places):
    an int >= 1, not a bool."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidSetting(field, f"must be an integer >= 1, got {value!r}")
    return value


def seconds(value: Any, field: str) -> float:
    """A span of time that may be zero (a breaker's cooldown): a finite number >= 0."""
    return finite_number(value, field, nonnegative=True, noun="number of seconds")


def api_key(value: Any, field: str = "api_key") -> str | None:
    """An API key that can be sent as a header value; None (or ``""``) means no key.

    A header value may contain spaces, so a key may; what cannot be sent is refused:
    surrounding whitespace (HTTP strips it; a trailing newline from a secrets file is the
    usual cause), control characters (CR/LF would split the header) and non-ASCII characters
    (httpx encodes a str header value as ASCII, so such a key would fail at request time).
    """
    if value is None or value == "":
        return None  # empty means no key, as an unset RERANK_API_KEY does
    if not isinstance(value, str):
        raise InvalidSetting(field, f"must be a str or None, got {type(value).__name__}")
    if value != value.strip():
        raise InvalidSetting(
            field,
            "must not start or end with whitespace (a trailing newline from a file?)",
        )
    if _UNSENDABLE.search(value):
        raise InvalidSetting(field, "must not contain control characters (CR, LF, tab...)")
    if not value.isascii():
        raise InvalidSetting(
            field,
            "must be ASCII text (an HTTP header value sent by httpx cannot carry more)",
        )
    return value


_RESERVED_HEADERS = frozenset(
    {
        "host", "content-length", "content-type", "content-encoding", "transfer-encoding",
        "connection", "keep-alive", "upgrade", "te", "trailer", "expect", "accept",
        "accept-encoding", "proxy-authorization", "proxy-connection", "cookie",
        "traceparent", "tracestate", "baggage",
    }
)  # fmt: skip
"""Headers the request itself needs (framing, routing, negotiation, trace context): a key sent
under one of them would break or redirect the request, or be overwritten."""


def header_name(value: Any, field: str = "api_key_header") -> str:
    """An HTTP header name (an RFC 9110 token such as ``apikey`` or ``Authorization``) that
    can carry a key: not one the request itself needs (``Host``, ``Content-Length``...)."""
    if not isinstance(value, str):
        raise InvalidSetting(field, f"must be a str, got {type(value).__name__}")
    if not _HEADER_NAME.fullmatch(value):
        raise InvalidSetting(field, "must be an HTTP header name (letters, digits, - and _...)")
    if value.lower() in _RESERVED_HEADERS:
        raise InvalidSetting(
            field, f"must not be {value!r}: the request needs that header for itself"
        )
    return value


def max_response_bytes(value: Any, field: str = "max_response_bytes") -> int:
    """The most bytes one response may take, on the wire or decoded: an int >= 1024."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1024:
        raise InvalidSetting(field, "must be an int >= 1024 (bytes)")
    return value


def split_credentials(url: str) -> tuple[str, str | None]:
    """`url` without its ``user:password@`` part, and that part percent-decoded
    (``user:password``), or None when there is none.

    Credentials left in a URL are printed by whatever logs the request line (httpx's own INFO
    line does), so the client sends them as the ``Authorization: Basic`` header they mean.
    """
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    if not sep or "@" not in netloc:
        return url, None
    userinfo, _, host = netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    credentials = unquote(user) + (":" + unquote(password) if colon else ":")
    return f"{scheme}://{host}{slash}{path}", credentials


def endpoint(value: Any, field: str = "endpoint") -> str:
    """A rerank service's base URL: http(s), a host, no spaces, no query string or fragment
    (the provider's path is appended to it)."""
    if not isinstance(value, str):
        raise InvalidSetting(field, f"must be a str, got {type(value).__name__}")
    url = value.strip()
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        raise InvalidSetting(field, "must be an http(s) URL (it cannot be parsed)") from None
    if "://" not in url:  # "localhost:8080" parses as scheme "localhost"
        raise InvalidSetting(
            field, "has no http:// or https:// in front: add http:// (e.g. http://localhost:8080)"
        )
    if parts.scheme not in ("http", "https"):
        raise InvalidSetting(field, f"must be an http(s) URL, got scheme {parts.scheme!r}")
    if not host or any(c.isspace() for c in url):
        raise InvalidSetting(field, "must be an http(s) URL with a host and no spaces")
    if "?" in url or "#" in url:
        raise InvalidSetting(
            field,
            "must not have a query string or fragment (the provider's path is appended to it; "
            "pass a key as the API key)",
        )
    return url


def did_you_mean(value: str, known: Any) -> str:
    """`` (did you mean 'cohere'?)`` when one of `known` is close to `value`, else ``""``."""
    close = difflib.get_close_matches(value.strip().lower(), [str(k) for k in known], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def provider(value: Any, known: Any, field: str = "provider") -> str:
    """A provider name among `known` (the wire formats, and ``local`` where allowed), or
    empty for ``tei``; returned lower-cased."""
    if not isinstance(value, str):
        raise InvalidSetting(field, f"must be a str, got {type(value).__name__}")
    name = value.strip().lower() or "tei"
    if name not in known:
        raise InvalidSetting(
            field, f"{value!r} is not one of: {', '.join(known)}{did_you_mean(value, known)}"
        )
    return name


def timeout(value: Any, field: str = "timeout") -> float:
    """Seconds for a whole call, retries included: a finite number > 0."""
    return finite_number(value, field, positive=True, noun="number of seconds")


def batch_size(value: Any, field: str = "batch_size") -> BatchSize:
    """Texts per request: a positive int (a ceiling no server raises), ``"auto"`` (ask TEI's
    ``/info`` on the first call), or None (the provider's documented cap, replaced by TEI's
    ``/info`` once a call has read it: `retrieval_stage.client.plan.Learned`)."""
    if value is None or value == "auto":
        return value  # type: ignore[no-any-return]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidSetting(field, "must be a positive integer, 'auto' or empty")
    return value


def top_k(value: Any, field: str = "top_k") -> int | None:
    """How many results to keep: None or 0 mean all, a positive int caps."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSetting(field, f"must be an int >= 0 or None, got {type(value).__name__}")
    if value < 0:
        raise InvalidSetting(field, f"must be >= 0 (0 means all), got {value}")
    return value or None


ON_ERROR = ("fallback", "raise")
"""What a stage does when its reranker fails: recall order, or re-raise."""

MIN_CONTENT_BYTES = 16
"""The smallest cap on a document's content on a span: room for a few characters and the
truncation mark."""


def on_error(value: Any, field: str = "on_error") -> str:
    """The stage's failure mode: ``"fallback"`` (recall order) or ``"raise"``."""
    if value not in ON_ERROR:
        raise InvalidSetting(field, f"must be 'fallback' or 'raise', got {value!r}")
    return str(value)


def min_score(value: Any, field: str = "min_score") -> float | None:
    """The score below which reranked outputs are dropped: None (keep all) or finite."""
    if value is not None and not math.isfinite(value):
        raise InvalidSetting(field, f"must be a finite number, got {value!r}")
    return value  # type: ignore[no-any-return]


def max_content_length(value: Any, field: str = "max_content_length") -> int:
    """The cap on each document's content on a span, in UTF-8 bytes: at least 16."""
    if value < MIN_CONTENT_BYTES:
        raise InvalidSetting(field, f"must be >= {MIN_CONTENT_BYTES} bytes, got {value}")
    return value  # type: ignore[no-any-return]


def stage_options(options: Mapping[str, Any]) -> None:
    """Check a `RerankStage`'s keyword options (``top_k``, ``on_error``, ``min_score``,
    ``max_content_length``) with the stage's own rules, without building a stage: an adapter
    checks them where it is constructed. Other options pass unchecked here."""
    top_k(options.get("top_k"))
    on_error(options.get("on_error", "fallback"))
    min_score(options.get("min_score"))
    if "max_content_length" in options:
        max_content_length(options["max_content_length"])


def relabelled(exc: InvalidSetting, label: str) -> InvalidSetting:
    """`exc` with its message naming the setting as the user gave it (``RERANK_TIMEOUT``)."""
    return InvalidSetting(exc.field, exc.reason, label)


_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
_FALSE_WORDS = frozenset({"0", "false", "no", "off"})


def env_flag(name: str) -> bool | None:
    """The boolean environment variable `name` (``1``/``true``/``yes``/``on`` or ``0``/``false``/
    ``no``/``off``, any case), None when unset or empty; `InvalidSetting` for anything else, so
    each caller decides whether to warn and keep its default."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return None
    if raw in _TRUE_WORDS:
        return True
    if raw in _FALSE_WORDS:
        return False
    raise InvalidSetting(name, f"must be 0 or 1 (or true/false, yes/no, on/off), got {raw!r}")
