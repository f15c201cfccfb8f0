"""Choosing a reranker from configuration: `RerankSettings` and the factories.

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
                           (`chain_config`: the list's form, ``RERANK_API_KEY_<n>``,
                           ``RERANK_CHAIN_TIMEOUT``, ``RERANK_BREAKER_*``)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from . import validate
from ._log import get_logger
from ._redact import masked_url
from .client import AsyncRerankClient, RerankClient
from .client.providers import PROVIDERS, check_required_fields
from .null import AsyncNullReranker, NullReranker
from .validate import BatchSize, InvalidSetting

__all__ = [
    "ENV_KEYS",
    "RerankSettings",
    "make_async_reranker",
    "make_reranker",
]

log = get_logger("retrieval_stage.config")

_L = TypeVar("_L")

if TYPE_CHECKING:
    from .chain import AsyncRerankerChain, RerankerChain
    from .local import AsyncCrossEncoderReranker, CrossEncoderReranker

ENDPOINT = "RERANK_ENDPOINT"
PROVIDER = "RERANK_PROVIDER"
MODEL = "RERANK_MODEL"
API_KEY = "RERANK_API_KEY"
API_KEY_HEADER = "RERANK_API_KEY_HEADER"
TIMEOUT = "RERANK_TIMEOUT"
BATCH_SIZE = "RERANK_BATCH_SIZE"
FALLBACKS = "RERANK_FALLBACKS"

LOCAL = validate.LOCAL_PROVIDER
"""The provider that runs a cross-encoder in process (the [local] extra); takes no endpoint."""

_KNOWN_PROVIDERS = (*PROVIDERS, LOCAL)

ENV_KEYS = (ENDPOINT, PROVIDER, MODEL, API_KEY, API_KEY_HEADER, TIMEOUT, BATCH_SIZE)
"""Every environment variable `RerankSettings.from_env` reads."""

_FIELD_OF = {
    ENDPOINT: "endpoint",
    PROVIDER: "provider",
    MODEL: "model",
    API_KEY: "api_key",
    API_KEY_HEADER: "api_key_header",
    TIMEOUT: "timeout",
    BATCH_SIZE: "batch_size",
}

_SHOW_VALUE = frozenset({PROVIDER, API_KEY_HEADER, TIMEOUT, BATCH_SIZE})
"""Variables whose bad value may appear in a warning: never the key, never the endpoint (it
may carry credentials in its userinfo)."""

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
            return 30.0
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


_CHECKS: dict[str, Callable[[Any], Any]] = {
    ENDPOINT: _endpoint,
    PROVIDER: _provider,
    MODEL: _model,
    API_KEY: _api_key,
    API_KEY_HEADER: _api_key_header,
    TIMEOUT: _timeout,
    BATCH_SIZE: _batch_size,
}


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
    timeout: float = 30.0
    batch_size: BatchSize = None

    def __post_init__(self) -> None:
        for key, check in _CHECKS.items():
            name = _FIELD_OF[key]
            try:
                value = check(getattr(self, name))
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
        for key, check in _CHECKS.items():
            raw = environ.get(key, "")
            try:
                values[_FIELD_OF[key]] = check(raw)
            except InvalidSetting as exc:
                problems.append((key, exc.reason))
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
            raise InvalidSetting(_FIELD_OF[key], reason + more, key)
        fields: dict[str, Any] = {"key": key, "reason": reason, "fallback": "NullReranker"}
        if key in _SHOW_VALUE:
            fields["value"] = environ.get(key, "")[:60]
        if len(problems) > 1:
            fields["invalid_keys"] = [k for k, _ in problems]
        log.warning("rerank.config_invalid", **fields)
        return cls()


def make_reranker(
    settings: RerankSettings | None = None, *, strict: bool = False
) -> RerankClient | NullReranker | CrossEncoderReranker | RerankerChain:
    """A `RerankClient` for `settings` (default: `RerankSettings.from_env`), else `NullReranker`.

    ``RERANK_PROVIDER=local`` (no endpoint) gives the in-process `CrossEncoderReranker` with
    ``RERANK_MODEL`` (default ``cross-encoder/ms-marco-MiniLM-L-6-v2``); without the [local]
    extra that fails open to `NullReranker` like any unreadable configuration.

    Read from the environment with ``RERANK_FALLBACKS`` set, the result is a `RerankerChain`
    over the primary and the fallbacks (`chain_config.make_chain`).

    `strict` applies when reading the environment: see `RerankSettings.from_env`. Close the
    result when done (``with make_reranker() as reranker: ...`` works for both kinds).
    """
    if settings is None and os.environ.get(FALLBACKS, "").strip():
        from .chain_config import make_chain

        return make_chain(strict=strict)
    if settings is None:
        settings = RerankSettings.from_env(strict=strict)
    if not settings.enabled:
        return NullReranker()
    if settings.provider == LOCAL:
        from .local import CrossEncoderReranker

        return _local(CrossEncoderReranker, settings, strict) or NullReranker()
    return RerankClient(settings.endpoint, **settings.client_kwargs())


def make_async_reranker(
    settings: RerankSettings | None = None, *, strict: bool = False
) -> AsyncRerankClient | AsyncNullReranker | AsyncCrossEncoderReranker | AsyncRerankerChain:
    """The awaitable twin of `make_reranker`: `AsyncRerankClient`, else `AsyncNullReranker`.

    The null choice is awaitable too, so ``await reranker.rerank(...)`` works whichever is
    configured (``async with make_async_reranker() as reranker: ...`` as well).
    """
    if settings is None and os.environ.get(FALLBACKS, "").strip():
        from .chain_config import make_async_chain

        return make_async_chain(strict=strict)
    if settings is None:
        settings = RerankSettings.from_env(strict=strict)
    if not settings.enabled:
        return AsyncNullReranker()
    if settings.provider == LOCAL:
        from .local import AsyncCrossEncoderReranker

        return _local(AsyncCrossEncoderReranker, settings, strict) or AsyncNullReranker()
    return AsyncRerankClient(settings.endpoint, **settings.client_kwargs())


def _local(factory: Callable[..., _L], settings: RerankSettings, strict: bool) -> _L | None:
    """The in-process cross-encoder (loaded lazily), or None when its extra is missing."""
    from .local import DEFAULT_LOCAL_MODEL, TORCH_INSTALL_HINT

    try:
        return factory(settings.model or DEFAULT_LOCAL_MODEL)
    except ImportError:
        reason = f"needs sentence-transformers (the [torch] extra): {TORCH_INSTALL_HINT}"
        if strict:
            raise InvalidSetting("provider", reason, f"{PROVIDER}=local") from None
        log.warning(
            "rerank.config_invalid",
            key=PROVIDER,
            value=LOCAL,
            reason=reason,
            fallback="NullReranker",
        )
        return None
