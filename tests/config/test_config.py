"""Selecting a reranker from ``RERANK_*`` configuration: off, on, fail-open and strict."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from structlog.testing import capture_logs

from retrieval_stage import AsyncRerankClient, NullReranker, RerankClient, validate
from retrieval_stage.config import ENV_KEYS, RerankSettings, make_async_reranker, make_reranker
from retrieval_stage.null import AsyncNullReranker

from ..conftest import WireMock

SECRET = "sk-live-8c1e2f0a-never-log-me"

FULL_ENV = {
    "RERANK_ENDPOINT": "https://rerank.example.com/api",
    "RERANK_PROVIDER": "cohere",
    "RERANK_MODEL": "rerank-v3.5",
    "RERANK_API_KEY": SECRET,
    "RERANK_API_KEY_HEADER": "Authorization",
    "RERANK_TIMEOUT": "12.5",
    "RERANK_BATCH_SIZE": "100",
}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No RERANK_* variable from the machine leaks into a test."""
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)


def config_warnings(logs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [e for e in logs if e["event"] == "rerank.config_invalid"]


# -- off by default -----------------------------------------------------------------------------


@pytest.mark.parametrize("endpoint", [None, "", "   "])
def test_empty_endpoint_selects_the_null_reranker_silently(
    monkeypatch: pytest.MonkeyPatch, endpoint: str | None
) -> None:
    if endpoint is not None:
        monkeypatch.setenv("RERANK_ENDPOINT", endpoint)
    monkeypatch.setenv("RERANK_TIMEOUT", "not read while reranking is off")
    with capture_logs() as logs:
        reranker = make_reranker()
        async_reranker = make_async_reranker(strict=True)
    assert isinstance(reranker, NullReranker)
    assert isinstance(async_reranker, AsyncNullReranker)
    assert logs == []
    assert not RerankSettings.from_env().enabled


# -- every variable read -----------------------------------------------------------------------


def test_every_variable_is_read() -> None:
    settings = RerankSettings.from_env(FULL_ENV)
    assert settings == RerankSettings(
        endpoint="https://rerank.example.com/api",
        provider="cohere",
        model="rerank-v3.5",
        api_key=SECRET,
        api_key_header="Authorization",
        timeout=12.5,
        batch_size=100,
    )


def test_factories_build_clients_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in FULL_ENV.items():
        monkeypatch.setenv(key, value)
    with make_reranker() as reranker:
        assert isinstance(reranker, RerankClient)
        assert (reranker.base_url, reranker.provider, reranker.model) == (
            "https://rerank.example.com/api",
            "cohere",
            "rerank-v3.5",
        )
        assert (reranker.timeout, reranker.batch_size) == (12.5, 100)
        assert SECRET not in repr(reranker)
    assert isinstance(make_async_reranker(), AsyncRerankClient)


def test_only_an_endpoint_gives_the_tei_defaults() -> None:
    settings = RerankSettings.from_env({"RERANK_ENDPOINT": "http://tei:8080"})
    assert dataclasses.astuple(settings) == (
        "http://tei:8080",
        "tei",
        None,
        None,
        "apikey",
        30.0,
        None,
    )
    with make_reranker(settings) as reranker:
        assert isinstance(reranker, RerankClient)
        assert reranker.batch_size == 32
        assert reranker.timeout == 30.0


def test_values_are_trimmed_and_normalised() -> None:
    settings = RerankSettings.from_env(
        {
            "RERANK_ENDPOINT": "  http://tei:8080/ ",
            "RERANK_PROVIDER": " Mixedbread ",
            "RERANK_MODEL": "   ",
            "RERANK_API_KEY": SECRET + "\n",
            "RERANK_TIMEOUT": " 5 ",
            "RERANK_BATCH_SIZE": "AUTO",
        }
    )
    assert settings.endpoint == "http://tei:8080/"
    assert settings.provider == "mixedbread"
    assert settings.model is None
    assert settings.api_key == SECRET
    assert settings.timeout == 5.0
    assert settings.batch_size == "auto"


def test_selected_client_talks_to_the_configured_service(
    monkeypatch: pytest.MonkeyPatch, wm: WireMock
) -> None:
    monkeypatch.setenv("RERANK_ENDPOINT", wm.url + "/cohere/all")
    monkeypatch.setenv("RERANK_PROVIDER", "cohere")
    monkeypatch.setenv("RERANK_MODEL", "rerank-v3.5")
    monkeypatch.setenv("RERANK_API_KEY", SECRET)
    monkeypatch.setenv("RERANK_API_KEY_HEADER", "Authorization")
    with make_reranker(strict=True) as reranker:
        result = reranker.rerank("q", ["a", "b", "c"])
    assert [text for text, _ in result] == ["c", "a", "b"]
    (request,) = wm.requests("/cohere/all/v2/rerank")
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert headers["authorization"] == f"Bearer {SECRET}"


# -- unreadable configuration: fail open, or raise when strict ---------------------------------

BAD = [
    ("RERANK_TIMEOUT", "abc", "must be a number of seconds"),
    ("RERANK_TIMEOUT", "0", "must be a finite number of seconds > 0"),
    ("RERANK_TIMEOUT", "-1", "must be a finite number of seconds > 0"),
    ("RERANK_TIMEOUT", "nan", "must be a finite number of seconds > 0"),
    ("RERANK_TIMEOUT", "inf", "must be a finite number of seconds > 0"),
    ("RERANK_PROVIDER", "openai", "'openai' is not one of: tei, cohere, jina, "),
    ("RERANK_ENDPOINT", "localhost:8080", "has no http:// or https:// in front: add http://"),
    ("RERANK_ENDPOINT", "ftp://files.example.com", "must be an http(s) URL, got scheme 'ftp'"),
    ("RERANK_ENDPOINT", "http://", "must be an http(s) URL with a host and no spaces"),
    ("RERANK_ENDPOINT", "http://tei host:80", "must be an http(s) URL with a host and no spaces"),
    ("RERANK_BATCH_SIZE", "0", "must be a positive integer, 'auto' or empty"),
    ("RERANK_BATCH_SIZE", "-32", "must be a positive integer, 'auto' or empty"),
    ("RERANK_BATCH_SIZE", "1.5", "must be a positive integer, 'auto' or empty"),
    ("RERANK_BATCH_SIZE", "lots", "must be a positive integer, 'auto' or empty"),
    ("RERANK_API_KEY_HEADER", "x api key", "must be an HTTP header name"),
    ("RERANK_API_KEY", "sk-live\t8c1e2f0a", "must not contain control characters"),
    ("RERANK_API_KEY", "sk-live\x1b8c1e2f0a", "must not contain control characters"),
    ("RERANK_API_KEY", "sk-live-\u00e9t\u00e9", "must be ASCII text"),
]
by_bad_value = pytest.mark.parametrize(("key", "value", "reason"), BAD, ids=lambda v: str(v))


def _env(key: str, value: str) -> dict[str, str]:
    env = {"RERANK_ENDPOINT": "http://tei:8080", "RERANK_API_KEY": SECRET}
    env[key] = value
    return env


@by_bad_value
def test_unreadable_value_fails_open_with_one_warning_naming_the_key(
    monkeypatch: pytest.MonkeyPatch, key: str, value: str, reason: str
) -> None:
    for k, v in _env(key, value).items():
        monkeypatch.setenv(k, v)
    with capture_logs() as logs:
        reranker = make_reranker()
    assert isinstance(reranker, NullReranker)
    (warning,) = logs
    assert warning["event"] == "rerank.config_invalid"
    assert warning["log_level"] == "warning"
    assert warning["key"] == key
    assert warning["reason"].startswith(reason)
    assert warning["fallback"] == "NullReranker"
    if key in ("RERANK_API_KEY", "RERANK_ENDPOINT"):
        assert "value" not in warning
    else:
        assert warning["value"] == value
    assert "8c1e2f0a" not in repr(warning)


@by_bad_value
def test_strict_mode_raises_value_error_naming_the_key(key: str, value: str, reason: str) -> None:
    with capture_logs() as logs, pytest.raises(ValueError, match=f"^{key} ") as caught:
        RerankSettings.from_env(_env(key, value), strict=True)
    assert str(caught.value).startswith(f"{key} {reason}")
    assert "8c1e2f0a" not in str(caught.value)
    assert logs == []


def test_strict_factories_raise_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RERANK_ENDPOINT", "http://tei:8080")
    monkeypatch.setenv("RERANK_TIMEOUT", "soon")
    with pytest.raises(ValueError, match=r"^RERANK_TIMEOUT must be a number of seconds$"):
        make_reranker(strict=True)
    with pytest.raises(ValueError, match=r"^RERANK_TIMEOUT must be a number of seconds$"):
        make_async_reranker(strict=True)


async def test_async_factory_fails_open_to_an_awaitable_null_reranker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RERANK_ENDPOINT", "http://tei:8080")
    monkeypatch.setenv("RERANK_PROVIDER", "bogus")
    with capture_logs() as logs:
        reranker = make_async_reranker()
    assert isinstance(reranker, AsyncNullReranker)
    assert await reranker.rerank("q", ["a", "b"]) == [("a", 0.0), ("b", 0.0)]
    assert [w["key"] for w in config_warnings(logs)] == ["RERANK_PROVIDER"]


def test_several_bad_values_still_give_one_warning_listing_them_all() -> None:
    env = {
        "RERANK_ENDPOINT": "http://tei:8080",
        "RERANK_PROVIDER": "bogus",
        "RERANK_TIMEOUT": "x",
        "RERANK_API_KEY": "bad\tkey " + SECRET,
    }
    with capture_logs() as logs:
        settings = RerankSettings.from_env(env)
    assert not settings.enabled
    (warning,) = logs
    assert warning["key"] == "RERANK_PROVIDER"
    assert warning["invalid_keys"] == ["RERANK_PROVIDER", "RERANK_API_KEY", "RERANK_TIMEOUT"]
    assert SECRET not in repr(warning)
    with pytest.raises(ValueError, match=r"^RERANK_PROVIDER 'bogus' is not one of") as caught:
        RerankSettings.from_env(env, strict=True)
    assert str(caught.value).endswith("(also invalid: RERANK_API_KEY, RERANK_TIMEOUT)")
    assert SECRET not in str(caught.value)


def test_explicit_settings_do_not_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RERANK_ENDPOINT", "not a url")
    with capture_logs() as logs, make_reranker(RerankSettings("http://tei:8080")) as reranker:
        assert isinstance(reranker, RerankClient)
    assert logs == []


# -- the settings value ---------------------------------------------------------------------------


def test_settings_repr_hides_the_api_key() -> None:
    settings = RerankSettings("http://tei:8080", api_key=SECRET)
    assert SECRET not in repr(settings)
    assert "api_key='<set>'" in repr(settings)
    assert "api_key=None" in repr(RerankSettings())


def test_settings_are_frozen() -> None:
    settings = RerankSettings("http://tei:8080")
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.timeout = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"endpoint": "tei:8080"}, "RerankSettings.endpoint has no http:// or https:// in front"),
        ({"provider": "openai"}, "RerankSettings.provider 'openai' is not one of: tei"),
        ({"timeout": 0}, "RerankSettings.timeout must be a finite number of seconds > 0"),
        ({"timeout": True}, "RerankSettings.timeout must be a number of seconds, got bool"),
        ({"batch_size": 0}, "RerankSettings.batch_size must be a positive integer"),
        ({"batch_size": "many"}, "RerankSettings.batch_size must be a positive integer"),
        ({"api_key": "has\nnewline"}, "RerankSettings.api_key must not contain control"),
        ({"api_key": "caf\u00e9"}, "RerankSettings.api_key must be ASCII text"),
        ({"api_key_header": "bad header"}, "RerankSettings.api_key_header must be an HTTP"),
    ],
)
def test_settings_built_in_code_refuse_unusable_values(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RerankSettings(**kwargs)


# -- the in-process provider ---------------------------------------------------------------


def test_local_provider_needs_no_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    import retrieval_stage.local as local

    monkeypatch.setattr(local.base, "local_available", lambda: True)
    env = {"RERANK_PROVIDER": "local", "RERANK_MODEL": "/models/my-cross-encoder"}
    settings = RerankSettings.from_env(env)
    assert settings.enabled
    assert (settings.provider, settings.model, settings.endpoint) == (
        "local",
        "/models/my-cross-encoder",
        "",
    )
    reranker = make_reranker(settings)
    assert isinstance(reranker, local.CrossEncoderReranker)
    assert reranker.model == "/models/my-cross-encoder"
    assert reranker._encoder is None, "the model loads on first use, not at selection"
    areranker = make_async_reranker(settings)
    assert isinstance(areranker, local.AsyncCrossEncoderReranker)
    assert areranker.sync.model == "/models/my-cross-encoder"
    with make_reranker(settings) as same_shape:  # every factory result is a context manager
        assert isinstance(same_shape, local.CrossEncoderReranker)


def test_local_provider_defaults_to_the_ms_marco_cross_encoder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import retrieval_stage.local as local

    monkeypatch.setattr(local.base, "local_available", lambda: True)
    reranker = make_reranker(RerankSettings.from_env({"RERANK_PROVIDER": "LOCAL"}))
    assert isinstance(reranker, local.CrossEncoderReranker)
    assert reranker.model == local.DEFAULT_LOCAL_MODEL


def test_local_provider_without_the_extra_fails_open(monkeypatch: pytest.MonkeyPatch) -> None:
    import retrieval_stage.local as local

    monkeypatch.setattr(local.base, "local_available", lambda: False)
    settings = RerankSettings.from_env({"RERANK_PROVIDER": "local"})
    with capture_logs() as logs:
        assert isinstance(make_reranker(settings), NullReranker)
        assert isinstance(make_async_reranker(settings), AsyncNullReranker)
    assert [e["event"] for e in logs] == ["rerank.config_invalid"] * 2
    assert logs[0]["key"] == "RERANK_PROVIDER"
    assert "[torch]" in logs[0]["reason"]  # the cross-encoder's extra, not the light [local]
    with pytest.raises(ValueError, match="RERANK_PROVIDER=local needs sentence-transformers"):
        make_reranker(settings, strict=True)


def test_local_provider_with_an_endpoint_is_unreadable() -> None:
    env = {"RERANK_PROVIDER": "local", "RERANK_ENDPOINT": "http://localhost:8080"}
    with capture_logs() as logs:
        assert not RerankSettings.from_env(env).enabled
    assert logs[0]["key"] == "RERANK_ENDPOINT"
    with pytest.raises(ValueError, match="RERANK_ENDPOINT must be empty"):
        RerankSettings.from_env(env, strict=True)
    with pytest.raises(ValueError, match="endpoint must be empty"):
        RerankSettings(endpoint="http://localhost:8080", provider="local")


@pytest.mark.parametrize(
    ("provider", "header"),
    [("tei", "apikey"), ("sidecar", "apikey"), ("cohere", "Authorization"),
     ("jina", "Authorization"), ("voyage", "Authorization"), ("mixedbread", "Authorization"),
     ("vllm", "Authorization"), ("infinity", "Authorization")],
)  # fmt: skip
def test_unset_key_header_follows_the_providers_convention(provider: str, header: str) -> None:
    env = {"RERANK_ENDPOINT": "https://api.example", "RERANK_PROVIDER": provider}
    env["RERANK_MODEL"] = "m"
    assert RerankSettings.from_env(env).api_key_header == header
    env["RERANK_API_KEY_HEADER"] = "X-Gateway-Key"
    assert RerankSettings.from_env(env).api_key_header == "X-Gateway-Key"


def test_hosted_provider_key_is_sent_as_a_bearer_token(wm: WireMock) -> None:
    wm.stub_json("/cohere-auth/v2/rerank", {"id": "x", "results": [
        {"index": 0, "relevance_score": 0.5}], "meta": {}})  # fmt: skip
    env = {
        "RERANK_ENDPOINT": wm.url + "/cohere-auth",
        "RERANK_PROVIDER": "cohere",
        "RERANK_MODEL": "rerank-v3.5",
        "RERANK_API_KEY": "co-key",
    }
    with make_reranker(RerankSettings.from_env(env)) as reranker:
        reranker.rerank("q", ["a"])
    (request,) = wm.requests("/cohere-auth/v2/rerank")
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert headers["authorization"] == "Bearer co-key"
    assert "apikey" not in headers


# -- one rule per value --------------------------------------------------------------------


@pytest.mark.parametrize("key", ["sk live 8c1e2f0a", "Token abc def", "k"])
def test_a_key_with_inner_spaces_is_accepted_by_every_entry(key: str) -> None:
    """A header value may contain spaces: the settings, the environment and the client agree."""
    assert validate.api_key(key) == key
    assert RerankSettings("http://tei:8080", api_key=key).api_key == key
    env = {"RERANK_ENDPOINT": "http://tei:8080", "RERANK_API_KEY": key}
    with capture_logs() as logs, make_reranker(RerankSettings.from_env(env)) as reranker:
        assert isinstance(reranker, RerankClient)
    assert logs == []
    RerankClient("http://tei:8080", api_key=key).close()


@pytest.mark.parametrize("key", ["a\nb", "a\rb", "tab\tkey", "bell\x07", "caf\u00e9", " lead"])
def test_a_key_that_cannot_be_sent_is_refused_by_the_rule_and_the_client(key: str) -> None:
    with pytest.raises(validate.InvalidSetting) as caught:
        validate.api_key(key)
    assert caught.value.field == "api_key"
    assert key.strip() not in str(caught.value)
    with pytest.raises(ValueError, match="api_key"):
        RerankClient("http://tei:8080", api_key=key)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"timeout": 0}, "timeout"),
        ({"endpoint": "ftp://x"}, "endpoint"),
        ({"endpoint": "http://x/?key=1"}, "endpoint"),
        ({"api_key_header": "a b"}, "api_key_header"),
        ({"batch_size": -1}, "batch_size"),
        ({"provider": "nope"}, "provider"),
        ({"api_key": "a\nb"}, "api_key"),
    ],
)
def test_a_refused_setting_names_its_field_in_an_attribute(
    kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(validate.InvalidSetting) as caught:
        RerankSettings(**kwargs)
    assert caught.value.field == field
    env = {"RERANK_ENDPOINT": "http://tei:8080"}
    env.update({f"RERANK_{k.upper()}": str(v) for k, v in kwargs.items()})
    with pytest.raises(validate.InvalidSetting) as from_env:
        RerankSettings.from_env(env, strict=True)
    assert from_env.value.field == field


@pytest.mark.parametrize(("value", "expected"), [(None, None), (0, None), (3, 3)])
def test_top_k_rule(value: int | None, expected: int | None) -> None:
    assert validate.top_k(value) == expected
    for bad in (-1, True, 1.5, "3"):
        with pytest.raises(validate.InvalidSetting) as caught:
            validate.top_k(bad)
        assert caught.value.field == "top_k"


@pytest.mark.parametrize("provider", ["cohere", "jina", "voyage"])
def test_a_provider_that_requires_a_model_fails_open_without_one(provider: str) -> None:
    """The same rule as the client's constructor, reported like any unusable variable."""
    env = {"RERANK_ENDPOINT": "http://rerank.invalid", "RERANK_PROVIDER": provider}
    with capture_logs() as logs:
        reranker = make_reranker(RerankSettings.from_env(env))
    assert isinstance(reranker, NullReranker)
    (warning,) = [e for e in logs if e["event"] == "rerank.config_invalid"]
    assert warning["key"] == "RERANK_MODEL"
    assert f"provider {provider!r}" in warning["reason"]
    with pytest.raises(validate.InvalidSetting, match=r"^RERANK_MODEL is required") as caught:
        RerankSettings.from_env(env, strict=True)
    assert caught.value.field == "model"
    with pytest.raises(validate.InvalidSetting, match=r"^RerankSettings\.model is required"):
        RerankSettings("http://rerank.invalid", provider=provider)
    assert RerankSettings.from_env({**env, "RERANK_MODEL": "m"}).model == "m"
