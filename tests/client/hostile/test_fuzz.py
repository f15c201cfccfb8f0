"""A bounded fuzz run over every provider's response handling and the sanitiser (issue 23).

Arbitrary and structure-aware answers (status, headers, body) go through the sync client on an
in-memory transport, which is pure logic from the response onwards: the parser, the policy and
the sanitiser. Only `RerankError`s may come out, and no echo of the key, the query or a document
may survive into the message. ``RETRIEVAL_STAGE_FUZZ_EXAMPLES`` sets the examples per test (CI
runs the default: about a minute in all on a 2-CPU machine).
"""

from __future__ import annotations

import json
import os
from typing import Any
from unittest import mock

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retrieval_stage import PROVIDERS, RerankClient, RerankError
from retrieval_stage.client.sanitize import server_text
from tests.client.hostile.echo import DMARK, DOCS, KEY, QMARK, QUERY, leaked

from ...hooks import hooked

EXAMPLES = int(os.environ.get("RETRIEVAL_STAGE_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)

ECHOES = [KEY, QUERY, DOCS[1], QMARK, DMARK, KEY[:12] + "****", json.dumps(DOCS[1])[1:-1]]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 5),
    st.integers(),
    st.sampled_from([10**400, -(10**30), 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(ECHOES),
    st.sampled_from(["1" + "0" * 4999, "0", "1", "01", "-1", "1e400", "inf"]),
)
json_values = st.recursive(
    scalars,
    lambda kids: st.one_of(
        st.lists(kids, max_size=6),
        st.dictionaries(
            st.sampled_from(
                [
                    "index",
                    "id",
                    "score",
                    "relevance_score",
                    "results",
                    "data",
                    "scores",
                    "model",
                    "usage",
                    "total_tokens",
                    "meta",
                    "billed_units",
                    "search_units",
                    "error",
                    "error_type",
                    "message",
                    "detail",
                    "type",
                    "msg",
                    "loc",
                    "input",
                    "ctx",
                    "max_length",
                    "actual_length",
                ]
            )
            | st.text(max_size=8),
            kids,
            max_size=6,
        ),
    ),
    max_leaves=30,
)


def result_like(provider: str) -> st.SearchStrategy[Any]:
    """Bodies close to a valid answer for three texts: the parser's interesting region."""
    fmt = PROVIDERS[provider]
    key = (
        st.one_of(st.integers(-1, 4), scalars)
        if not fmt.id_mapped
        else st.one_of(st.sampled_from(["0", "1", "2", "3", "00", "1" + "0" * 4999]), scalars)
    )
    entry = st.fixed_dictionaries(
        {("id" if fmt.id_mapped else "index"): key, fmt.score_key: scalars},
        optional={"model": scalars, "document": json_values},
    )
    entries = st.lists(st.one_of(entry, json_values), max_size=6)
    if fmt.results_key is None:
        return entries
    return st.fixed_dictionaries(
        {fmt.results_key: entries},
        optional={"model": scalars, "usage": json_values, "meta": json_values},
    )


headers = st.dictionaries(
    st.sampled_from(
        ["content-type", "retry-after", "retry-after-ms", "x-compute-tokens", "location"]
    ),
    st.one_of(
        st.sampled_from(ECHOES),
        st.sampled_from(
            [
                "inf",
                "1e400",
                "Wed, 21 Oct 99999999999999999999 07:28:00 GMT",
                "-1",
                "nan",
                "application/json",
            ]
        ),
        st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40),
    ),
    max_size=4,
)
statuses = st.sampled_from([200, 201, 204, 301, 307, 400, 413, 422, 424, 429, 500, 503])


def call(provider: str, status: int, head: dict[str, str], body: bytes) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers=head, content=body)

    model = "m" if PROVIDERS[provider].requires_model else None
    http = httpx.Client(transport=httpx.MockTransport(answer))
    # The retry's wait is decided (and fuzzed) but not slept: examples, not seconds.
    no_sleep = mock.patch("retrieval_stage.client.sync.time.sleep")
    client = hooked(
        RerankClient(
            "http://fuzz.invalid", provider=provider, model=model, api_key=KEY, http_client=http,
            max_retries=1, timeout=5.0,
        ),
        random=lambda: 0.0,
    )  # fmt: skip
    try:
        with no_sleep:
            client.rerank(QUERY, DOCS)
    except RerankError as exc:
        for text in (str(exc), repr(exc), str(getattr(exc, "server_message", ""))):
            assert not leaked(text), text
    finally:
        http.close()


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
@FUZZ
@given(status=statuses, head=headers, body=st.binary(max_size=400))
def test_arbitrary_bytes_give_only_rerank_errors(
    provider: str, status: int, head: dict[str, str], body: bytes
) -> None:
    call(provider, status, head, body)


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
@FUZZ
@given(data=st.data(), status=statuses, head=headers)
def test_structured_answers_give_only_rerank_errors(
    provider: str, data: st.DataObject, status: int, head: dict[str, str]
) -> None:
    body = data.draw(st.one_of(result_like(provider), json_values))
    call(provider, status, head, json.dumps(body, ensure_ascii=data.draw(st.booleans())).encode())


@FUZZ
@given(body=st.one_of(st.binary(max_size=600), json_values.map(lambda v: json.dumps(v).encode())))
def test_the_sanitiser_never_lets_an_echo_through(body: bytes) -> None:
    text = server_text(body, [QUERY, *DOCS], KEY)
    assert not leaked(text), text
    assert len(text) <= 300
