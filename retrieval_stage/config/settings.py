"""How to reach one rerank service: `RerankSettings`, and its reading of ``RERANK_*``.

Reranking is off until an operator sets ``RERANK_ENDPOINT``: an empty endpoint selects the
`NullReranker`, which keeps the caller's order. Configuration that cannot be read (a bad
number, an unknown provider, an endpoint that is not an http(s) URL) fails open to the
`NullReranker` too, with one structured warning (``rerank.config_invalid``) naming the
variable, so a typo degrades ranking quality instead of taking search down; ``strict=True``
raises `ValueError` instead, for deployments that prefer to fail at start-up. The API key's
value is never logged, never put in an exception and never shown by ``repr``.

Variables (all optional):

``RERANK_ENDPOINT``        base URL of the rerank service; empty: reranking off
``RERANK_PROVIDER``        wire format: tei (default), cohere, jina, voyage, vllm, infinity,
                           mixedbread, sidecar; or ``local``: a cross-encoder in process
                           (the [local] extra), which needs no endpoint
``RERANK_MODEL``           model name sent to APIs that take one and recorded on spans
``RERANK_API_KEY``         credential, sent in ``RERANK_API_KEY_HEADER``
``RERANK_API_KEY_HEADER``  header for the key (default: the provider's convention, ``apikey``
                           for tei and sidecar (gateways), ``Authorization`` for the hosted
                           APIs, vLLM and Infinity; ``Authorization`` sends
                           ``Bearer <key>``)
``RERANK_TIMEOUT``         seconds for a whole call, retries included (default 30)
``RERANK_BATCH_SIZE``      texts per request: a positive integer, ``auto`` (ask TEI's
                           ``/info``), or empty for the provider's documented cap
``RERANK_FALLBACKS``       tiers tried after this one, each behind a circuit breaker
                           (`config.fallbacks`: the list's form, ``RERANK_API_KEY_<n>``,
                           ``RERANK_CHAIN_TIMEOUT``, ``RERANK_BREAKER_*``)

The factories that turn settings into a reranker are in `config.factories`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import validate
from .._log import get_logger
from .._redact import masked_url
from ..client.providers import PROVIDERS, check_required_fields
from ..validate import BatchSize, InvalidSetting

__all__ = [
    "API_KEY",
    "API_KEY_HEADER",
    "BATCH_SIZE",
    "DEFAULT_TIMEOUT_S",
    "ENDPOINT",
    "ENV_KEYS",
    "LOCAL",
    "MODEL",
    "PROVIDER",
    "TIMEOUT",
    "RerankSettings",
]

log = get_logger("retrieval_stage.config")

ENDPOINT = "RERANK_ENDPOINT"
PROVIDER = "RERANK_PROVIDER"
MODEL = "RERANK_MODEL"
API_KEY = "RERANK_API_KEY"
API_KEY_HEADER = "RERANK_API_KEY_HEADER"
TIMEOUT = "RERANK_TIMEOUT"
BATCH_SIZE = "RERANK_BATCH_SIZE"

LOCAL = validate.LOCAL_PROVIDER
"""The provider that runs a cross-encoder in process (the [local] extra); takes no endpoint."""

_KNOWN_PROVIDERS = (*PROVIDERS, LOCAL)

DEFAULT_TIMEOUT_S = 30.0
"""Seconds for a whole call when ``RERANK_TIMEOUT`` is unset (the clients' own default)."""

# -- one check per field, shared by the dataclass and the environment reader -------------------
# Text from the environment (or a str given to the dataclass) is normalised here (stripped,
# numbers parsed; empty means "not set"); the rule for each value is `validate`'s, the same
# the clients and the CLI apply.


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidSetting(field, f"must be a str, got {type(value).__name__}")
    return value.strip()


def _endpoint(value: Any) -> str:
    url = _text(value, "endpoint")
    return validate.endpoint(url) if url else ""


def _provider(value: Any) -> str:
    return validate.provider(value, _KNOWN_PROVIDERS)


def _model(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidSetting("model", f"must be a str or None, got {type(value).__name__}")
    return value.strip() or None


def _api_key(value: Any) -> str | None:
    if isinstance(value, str):
        value = value.strip() or None  # empty: no key; a newline from a secrets file goes
    return validate.api_key(value)


def _api_key_header(value: Any) -> str:
    header = _text(value, "api_key_header")
    # Unset: the provider's convention, resolved with the provider.
    return validate.header_name(header) if header else ""


def _timeout(value: Any) -> float:
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return DEFAULT_TIMEOUT_S
        try:
            value = float(text)
        except ValueError:
            raise InvalidSetting("timeout", "must be a number of seconds") from None
    return validate.timeout(value)


def _batch_size(value: Any) -> BatchSize:
    if isinstance(value, str):
        text = value.strip().lower()
        if not text:
            return None
        if text != "auto":
            try:
                value = int(text)
            except ValueError:
                raise InvalidSetting(
                    "batch_size", "must be a positive integer, 'auto' or empty"
                ) from None
        else:
            value = "auto"
    return validate.batch_size(value)


@dataclass(frozen=True, slots=True)
class _Variable:
    """One ``RERANK_*`` variable: the `RerankSettings` field it sets, the check that reads
    it, and whether its bad value may appear in a warning (never the key, never the endpoint:
    it may carry credentials in its userinfo)."""

    key: str
    field: str
    check: Callable[[Any], Any]
    show_value: bool


_VARIABLES = (
    _Variable(ENDPOINT, "endpoint", _endpoint, show_value=False),
    _Variable(PROVIDER, "provider", _provider, show_value=True),
    _Variable(MODEL, "model", _model, show_value=False),
    _Variable(API_KEY, "api_key", _api_key, show_value=False),
    _Variable(API_KEY_HEADER, "api_key_header", _api_key_header, show_value=True),
    _Variable(TIMEOUT, "timeout", _timeout, show_value=True),
    _Variable(BATCH_SIZE, "batch_size", _batch_size, show_value=True),
)
"""Every variable `RerankSettings.from_env` reads, in the order it checks them."""

_BY_KEY = {v.key: v for v in _VARIABLES}

ENV_KEYS = tuple(_BY_KEY)
"""Every environment variable `RerankSettings.from_env` reads."""


@dataclass(frozen=True, slots=True, repr=False)
class RerankSettings:
    """How to reach the rerank service; an empty `endpoint` means reranking is off.

    Values are checked (and strings normalised: stripped, provider lower-cased) on
    construction with `validate`'s rules; a value that cannot be used raises
    `validate.InvalidSetting` (a `ValueError`) whose ``field`` names it.
    `from_env` builds one from ``RERANK_*`` variables.
    """

    endpoint: str = ""
    provider: str = "tei"
    model: str | None = None
    api_key: str | None = None
    api_key_header: str = ""
    timeout: float = DEFAULT_TIMEOUT_S
    batch_size: BatchSize = None

    def __post_init__(self) -> None:
        for variable in _VARIABLES:
            name = variable.field
            try:
                value = variable.check(getattr(self, name))
            except InvalidSetting as exc:
                raise validate.relabelled(exc, f"RerankSettings.{name}") from None
            object.__setattr__(self, name, value)
        if not self.api_key_header:  # unset: the provider's convention
            fmt = PROVIDERS.get(self.provider)
            object.__setattr__(self, "api_key_header", fmt.auth_header if fmt else "apikey")
        fmt = PROVIDERS.get(self.provider)
        if fmt is not None and self.endpoint:
            check_required_fields(fmt, model=self.model, label="RerankSettings.model")
        if self.provider == LOCAL and self.endpoint:
            raise InvalidSetting(
                "endpoint",
                "must be empty with provider 'local' (the model runs in process)",
                "RerankSettings.endpoint",
            )

    def __repr__(self) -> str:
        key = None if self.api_key is None else "'<set>'"
        return (
            f"RerankSettings(endpoint={masked_url(self.endpoint)!r}, provider={self.provider!r}, "
            f"model={self.model!r}, api_key={key}, api_key_header={self.api_key_header!r}, "
            f"timeout={self.timeout!r}, batch_size={self.batch_size!r})"
        )

    @property
    def enabled(self) -> bool:
        """Whether reranking is on: an endpoint is configured, or the in-process provider."""
        return bool(self.endpoint) or self.provider == LOCAL

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `RerankClient` / `AsyncRerankClient` besides the base URL."""
        return {
            "provider": self.provider,
            "model": self.model,
            "api_key": self.api_key,
            "api_key_header": self.api_key_header,
            "timeout": self.timeout,
            "batch_size": self.batch_size,
        }

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] = os.environ, *, strict: bool = False
    ) -> RerankSettings:
        """Settings from the ``RERANK_*`` variables in `environ`.

        An empty or unset ``RERANK_ENDPOINT`` gives disabled settings and the other variables
        are not read. A variable that cannot be used gives disabled settings and logs one
        ``rerank.config_invalid`` warning whose ``key`` names it (``invalid_keys`` lists all
        when several are bad); with ``strict=True`` it raises `ValueError` naming it instead.
        """
        local = environ.get(PROVIDER, "").strip().lower() == LOCAL
        if not environ.get(ENDPOINT, "").strip() and not local:
            return cls()
        values: dict[str, Any] = {}
        problems: list[tuple[str, str]] = []
        for variable in _VARIABLES:
            raw = environ.get(variable.key, "")
            try:
                values[variable.field] = variable.check(raw)
            except InvalidSetting as exc:
                problems.append((variable.key, exc.reason))
        if local and values.get("endpoint"):
            problems.append((ENDPOINT, "must be empty with RERANK_PROVIDER=local"))
        fmt = PROVIDERS.get(values.get("provider", ""))
        if fmt is not None and not any(k == MODEL for k, _ in problems):
            try:
                check_required_fields(fmt, model=values.get("model"))
            except InvalidSetting as exc:
                problems.append((MODEL, exc.reason))
        if not problems:
            return cls(**values)
        key, reason = problems[0]
        if strict:
            others = ", ".join(k for k, _ in problems[1:])
            more = f" (also invalid: {others})" if others else ""
            raise InvalidSetting(_BY_KEY[key].field, reason + more, key)
        fields: dict[str, Any] = {"key": key, "reason": reason, "fallback": "NullReranker"}
        if _BY_KEY[key].show_value:
            fields["value"] = environ.get(key, "")[:60]
        if len(problems) > 1:
            fields["invalid_keys"] = [k for k, _ in problems]
        log.warning("rerank.config_invalid", **fields)
        return cls()
