"""A chain's settings from configuration: the primary from ``RERANK_*``, fallbacks from a list.

The primary tier is what `RerankSettings.from_env` reads today (``RERANK_ENDPOINT``,
``RERANK_PROVIDER``, ``RERANK_MODEL``, ``RERANK_API_KEY``...). ``RERANK_FALLBACKS`` lists the
tiers tried after it, in order: entries separated by ``;`` (or new lines), each a
comma-separated list of ``field=value`` pairs, where a field without ``=`` is the endpoint::

    RERANK_FALLBACKS="endpoint=https://api.cohere.com,provider=cohere,model=rerank-v3.5;
                      http://tei-2:8080"

Fields: ``endpoint``, ``provider`` (default tei; ``local`` for a cross-encoder in process, with
no endpoint), ``model``, ``timeout`` (default: the primary's ``RERANK_TIMEOUT``),
``batch_size``, ``api_key_header``; each checked by `RerankSettings`' rules. An entry's API key
never goes in the list (which may be shown in errors and logs): it is read from
``RERANK_API_KEY_<n>``, n the entry's 1-based position (``RERANK_API_KEY_1`` for the first
fallback). The chain's own settings: ``RERANK_CHAIN_TIMEOUT`` (the deadline all tiers share,
default 30 s), ``RERANK_BREAKER_FAILURES`` (consecutive failures that open a tier's circuit,
default 3), ``RERANK_BREAKER_COOLDOWN`` (seconds before an open circuit lets one probe through,
default 30).

As for the primary, configuration that cannot be read fails open: a bad entry is left out with
one ``rerank.config_invalid`` warning naming it (``RERANK_FALLBACKS entry 2 (http://tei-2:8080):
provider 'tie' is not one of: ...``; never a key, and an endpoint only without credentials), a
bad chain setting keeps its default; ``strict=True`` raises `InvalidSetting` instead. The list
is read only when the primary is configured: an empty ``RERANK_ENDPOINT`` turns reranking off,
whatever else is set. `config.factories.make_chain` builds the chain from these settings.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import validate
from .._log import get_logger
from .._redact import shown_url
from ..failover import DEFAULT_CHAIN_TIMEOUT_S, DEFAULT_COOLDOWN_S, DEFAULT_FAILURE_THRESHOLD
from ..validate import InvalidSetting
from .settings import DEFAULT_TIMEOUT_S, LOCAL, RerankSettings

__all__ = [
    "BREAKER_COOLDOWN",
    "BREAKER_FAILURES",
    "CHAIN_ENV_KEYS",
    "CHAIN_TIMEOUT",
    "ENTRY_FIELDS",
    "FALLBACKS",
    "FALLBACK_API_KEY",
    "ChainSettings",
    "chain_values",
    "parse_fallbacks",
]

log = get_logger("retrieval_stage.config")

FALLBACKS = "RERANK_FALLBACKS"
"""The tiers tried after the primary, in order (the list's form: this module's docstring)."""
CHAIN_TIMEOUT = "RERANK_CHAIN_TIMEOUT"
BREAKER_FAILURES = "RERANK_BREAKER_FAILURES"
BREAKER_COOLDOWN = "RERANK_BREAKER_COOLDOWN"
FALLBACK_API_KEY = "RERANK_API_KEY_{n}"
"""Where the n-th fallback's API key is read from (1-based), never from the list itself."""

CHAIN_ENV_KEYS = (FALLBACKS, CHAIN_TIMEOUT, BREAKER_FAILURES, BREAKER_COOLDOWN)
"""The chain's own variables (besides `settings.ENV_KEYS` and ``RERANK_API_KEY_<n>``)."""

ENTRY_FIELDS = ("endpoint", "provider", "model", "timeout", "batch_size", "api_key_header")
"""The fields a ``RERANK_FALLBACKS`` entry may set."""

_ENTRIES = re.compile(r"[;\n]")


@dataclass(frozen=True, slots=True, repr=False)
class ChainSettings:
    """The tiers of a chain, primary first, and the chain's deadline and breaker settings."""

    tiers: tuple[RerankSettings, ...]
    timeout: float = DEFAULT_CHAIN_TIMEOUT_S
    failure_threshold: int = DEFAULT_FAILURE_THRESHOLD
    cooldown: float = DEFAULT_COOLDOWN_S

    def __repr__(self) -> str:  # the tiers' reprs mask their keys and URL credentials
        return (
            f"ChainSettings(tiers={list(self.tiers)!r}, timeout={self.timeout!r}, "
            f"failure_threshold={self.failure_threshold!r}, cooldown={self.cooldown!r})"
        )

    def chain_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `RerankerChain` / `AsyncRerankerChain` besides the tiers."""
        return {
            "timeout": self.timeout,
            "failure_threshold": self.failure_threshold,
            "cooldown": self.cooldown,
        }

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] = os.environ, *, strict: bool = False
    ) -> ChainSettings:
        """The primary from ``RERANK_*`` (`RerankSettings.from_env`), the fallbacks from
        ``RERANK_FALLBACKS``; no tiers at all when the primary is not configured."""
        primary = RerankSettings.from_env(environ, strict=strict)
        if not primary.enabled:
            return cls(tiers=())
        fallbacks, bad = parse_fallbacks(
            environ.get(FALLBACKS, ""), environ, timeout=primary.timeout
        )
        chain, unreadable = chain_values(environ)
        problems = [(FALLBACKS, p) for p in bad] + unreadable
        for key, problem in problems:
            if strict:
                raise problem
            entry = key == FALLBACKS
            log.warning(
                "rerank.config_invalid",
                key=key,
                reason=str(problem).removeprefix(f"{key} "),
                fallback="the other tiers (this one left out)" if entry else "the default",
            )
        return cls(tiers=(primary, *fallbacks), **chain)


def chain_values(
    environ: Mapping[str, str],
) -> tuple[dict[str, Any], list[tuple[str, InvalidSetting]]]:
    """`ChainSettings`' own fields from ``RERANK_CHAIN_TIMEOUT`` and ``RERANK_BREAKER_*``
    (those set and readable), and (variable, refusal) for each that cannot be read."""
    values: dict[str, Any] = {}
    problems: list[tuple[str, InvalidSetting]] = []
    for key, field, parse in (
        (CHAIN_TIMEOUT, "timeout", _seconds_above_zero),
        (BREAKER_FAILURES, "failure_threshold", _count),
        (BREAKER_COOLDOWN, "cooldown", _seconds),
    ):
        raw = environ.get(key, "").strip()
        if not raw:
            continue
        try:
            values[field] = parse(raw, key)
        except InvalidSetting as exc:
            problems.append((key, exc))
    return values, problems


def parse_fallbacks(
    text: str, environ: Mapping[str, str] = os.environ, *, timeout: float = DEFAULT_TIMEOUT_S
) -> tuple[list[RerankSettings], list[InvalidSetting]]:
    """The tiers ``RERANK_FALLBACKS`` lists, and an `InvalidSetting` for each entry that
    cannot be used (its message names the entry: ``RERANK_FALLBACKS entry 2 (URL): ...``).
    `timeout` is what an entry without ``timeout=`` gets (the primary's)."""
    tiers: list[RerankSettings] = []
    problems: list[InvalidSetting] = []
    entries = [e.strip() for e in _ENTRIES.split(text) if e.strip()]
    for n, entry in enumerate(entries, start=1):
        try:
            tiers.append(_entry(n, entry, environ, timeout))
        except InvalidSetting as exc:
            problems.append(exc)
    return tiers, problems


def _entry(n: int, entry: str, environ: Mapping[str, str], timeout: float) -> RerankSettings:
    fields: dict[str, str] = {}
    label = f"{FALLBACKS} entry {n}"
    for part in (p.strip() for p in entry.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or "://" in key:  # a bare URL is the endpoint
            key, value = "endpoint", part
        key = key.strip().lower()
        if key == "api_key":
            raise InvalidSetting(
                "api_key",
                f"must not be in the list: set {FALLBACK_API_KEY.format(n=n)} instead",
                f"{label}: api_key",
            )
        if key not in ENTRY_FIELDS:
            raise InvalidSetting(
                key, f"is not a field (known: {', '.join(ENTRY_FIELDS)})", f"{label}: {key!r}"
            )
        if key in fields:
            raise InvalidSetting(key, "is given twice", f"{label}: {key}")
        fields[key] = value.strip()
    endpoint = fields.get("endpoint", "")
    where = f"{label} ({shown_url(endpoint)})" if endpoint else label
    if not endpoint and fields.get("provider", "").lower() != LOCAL:
        raise InvalidSetting(
            "endpoint", "is missing (or give provider=local)", f"{where}: endpoint"
        )
    try:
        return RerankSettings(
            endpoint=endpoint,
            provider=fields.get("provider", ""),
            model=fields.get("model"),
            api_key=environ.get(FALLBACK_API_KEY.format(n=n), ""),
            api_key_header=fields.get("api_key_header", ""),
            timeout=fields.get("timeout") or timeout,  # type: ignore[arg-type] # text: parsed
            batch_size=fields.get("batch_size", ""),  # type: ignore[arg-type] # text: parsed
        )
    except InvalidSetting as exc:
        field = "api_key" if exc.field == "api_key" else exc.field
        name = FALLBACK_API_KEY.format(n=n) if field == "api_key" else field
        raise InvalidSetting(field, exc.reason, f"{where}: {name}") from None


def _seconds_above_zero(raw: str, key: str) -> float:
    return validate.timeout(_number(raw, key), key)


def _seconds(raw: str, key: str) -> float:
    return validate.seconds(_number(raw, key), key)


def _count(raw: str, key: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise InvalidSetting(key, "must be an integer >= 1", key) from None
    return validate.count(value, key)


def _number(raw: str, key: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise InvalidSetting(key, "must be a number of seconds", key) from None
    return validate.finite_number(value, key, noun="number of seconds")
