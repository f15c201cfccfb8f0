"""The neutral protocols, the null rerankers, and the stage driving any reranker.

Conformance is checked twice: statically, by running mypy over this module (the typed
assignments in `_conformance` are its subject), and at run time with ``isinstance``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from retrieval_stage import (
    AsyncRerankClient,
    AsyncReranker,
    Candidate,
    NullReranker,
    RerankClient,
    Reranker,
    RerankResponse,
    RerankStage,
    RerankTransportError,
    Usage,
    validate,
)
from retrieval_stage.config import RerankSettings
from retrieval_stage.integrations._common import Stages
from retrieval_stage.null import AsyncNullReranker
from retrieval_stage.validate import InvalidSetting

from .fakes import ByLength, Failing, FixedScores

HERE = Path(__file__)
ROOT = HERE.parents[1]


def _conformance() -> None:
    """Never called: mypy checks that each assignment type-checks."""
    sync: list[Reranker] = [
        RerankClient("http://localhost"),
        NullReranker(),
        ByLength(),
    ]
    async_: list[AsyncReranker] = [AsyncRerankClient("http://localhost"), AsyncNullReranker()]
    RerankStage(sync[0])
    RerankStage(async_[0])


# -- static conformance -------------------------------------------------------------------------


def _mypy(*args: str) -> tuple[str, int]:
    api = pytest.importorskip("mypy.api")
    out, err, status = api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--follow-imports=silent",
            "--no-error-summary",
            *args,
        ]
    )
    return out + err, status


def test_mypy_accepts_every_reranker_as_its_protocol() -> None:
    out, status = _mypy(str(HERE))
    assert status == 0, out


def test_mypy_rejects_a_reranker_with_the_wrong_signature(tmp_path: Path) -> None:
    module = tmp_path / "wrong_rerankers.py"
    module.write_text(
        "from retrieval_stage import AsyncReranker, RerankClient, Reranker\n"
        "class Wrong:\n"
        "    def rerank(self, query: str, items: list[str]) -> list[str]:\n"
        "        return items\n"
        "a: Reranker = Wrong()\n"
        "b: AsyncReranker = RerankClient('http://localhost')\n"
    )
    out, status = _mypy(str(module))
    assert status == 1, out
    assert 'expression has type "Wrong", variable has type "Reranker"' in out, out
    assert 'expression has type "RerankClient", variable has type "AsyncReranker"' in out, out


# -- run-time conformance -----------------------------------------------------------------------


async def test_every_reranker_is_an_instance_of_its_protocol_at_run_time() -> None:
    with RerankClient("http://localhost") as sync_client:
        assert isinstance(sync_client, Reranker)
    async with AsyncRerankClient("http://localhost") as async_client:
        assert isinstance(async_client, AsyncReranker)
    assert isinstance(NullReranker(), Reranker)
    assert isinstance(AsyncNullReranker(), AsyncReranker)
    assert isinstance(ByLength(), Reranker)
    assert not isinstance(object(), Reranker)
    assert not isinstance("rerank", AsyncReranker)


def test_the_stage_takes_a_users_own_reranker() -> None:
    cands = [Candidate("a", "xx"), Candidate("b", "xxxx"), Candidate("c", "x")]
    outputs = RerankStage(ByLength()).run("q", cands)
    assert [(o.candidate.id, o.score) for o in outputs] == [("b", 4.0), ("a", 2.0), ("c", 1.0)]


# -- the null rerankers -------------------------------------------------------------------------


def test_null_reranker_returns_every_item_in_input_order_with_score_zero() -> None:
    items = [object(), object(), object()]
    result = NullReranker().rerank("q", items, text=lambda _: "t")
    assert result == [(items[0], 0.0), (items[1], 0.0), (items[2], 0.0)]
    assert all(got is want for (got, _), want in zip(result, items, strict=True))


def test_null_reranker_result_has_the_clients_shape() -> None:
    result = NullReranker().rerank("q", ["a", "b"])
    assert type(result) is list
    assert all(type(pair) is tuple and len(pair) == 2 for pair in result)
    assert all(type(score) is float for _, score in result)


def test_null_reranker_order_survives_a_stable_sort_by_score() -> None:
    items = ["c", "a", "b", "a"]
    result = NullReranker().rerank("q", items)
    assert [i for i, _ in sorted(result, key=lambda p: -p[1])] == items


@pytest.mark.parametrize(("top_k", "kept"), [(None, 3), (0, 3), (2, 2), (1, 1), (10, 3)])
def test_null_reranker_cuts_to_top_k(top_k: int | None, kept: int) -> None:
    assert NullReranker().rerank("q", ["a", "b", "c"], top_k=top_k) == [
        (x, 0.0) for x in "abc"[:kept]
    ]


def test_null_reranker_validates_arguments_like_a_client() -> None:
    with pytest.raises(ValueError, match="top_k must be >= 0"):
        NullReranker().rerank("q", ["a"], top_k=-1)
    with pytest.raises(TypeError, match="pass text="):
        NullReranker().rerank("q", [object()])
    with pytest.raises(TypeError, match="query must be a str"):
        NullReranker().rerank(None, ["a"])  # type: ignore[arg-type]


def test_null_reranker_copies_its_input() -> None:
    items = ["a", "b"]
    result = NullReranker().rerank("q", items)
    items.append("c")
    assert result == [("a", 0.0), ("b", 0.0)]


def test_null_reranker_response_reports_nothing_spent() -> None:
    with NullReranker() as null:
        response = null.rerank_response("q", ["a", "b"], top_k=1)
    assert response == RerankResponse(results=[("a", 0.0)], usage=Usage(), model=None)
    assert (response.requests, response.retries, response.batches) == (0, 0, 0)


async def test_async_null_reranker_awaits_like_the_async_client() -> None:
    async with AsyncNullReranker() as null:
        assert await null.rerank("q", ["a", "b", "c"], top_k=2) == [("a", 0.0), ("b", 0.0)]
        response = await null.rerank_response("q", ["a"])
        with pytest.raises(ValueError, match="top_k must be >= 0"):
            await null.rerank("q", ["a"], top_k=-1)
    assert response.results == [("a", 0.0)]


def test_stage_over_the_null_reranker_keeps_the_callers_order() -> None:
    cands = [Candidate("a", "x", 0.1), Candidate("b", "y", 0.9), Candidate("c", "z")]
    outputs = RerankStage(NullReranker(), top_k=2).run("q", cands)
    assert [(o.candidate.id, o.score, o.reranked) for o in outputs] == [
        ("a", 0.0, True),
        ("b", 0.0, True),
    ]


async def test_stage_awaits_the_async_null_reranker() -> None:
    cands = [Candidate("a", "x"), Candidate("b", "y")]
    outputs = await RerankStage(AsyncNullReranker()).arun("q", cands)
    assert [o.candidate.id for o in outputs] == ["a", "b"]


# -- the stage's threshold gate: min_score --------------------------------------------------------

CANDS = [Candidate("a", "alpha", 0.5), Candidate("b", "beta", 0.4), Candidate("c", "gamma", 0.3)]


def test_min_score_drops_outputs_scoring_below_it_and_keeps_equal_ones() -> None:
    stage = RerankStage(FixedScores({"a": 0.2, "b": 0.7, "c": 0.5}), min_score=0.5)
    outputs = stage.run("q", CANDS)
    assert [(o.candidate.id, o.score) for o in outputs] == [("b", 0.7), ("c", 0.5)]


def test_min_score_works_on_logit_scales_below_zero() -> None:
    stage = RerankStage(FixedScores({"a": -1.0, "b": -3.5, "c": 2.25}), min_score=-2.0)
    assert [o.candidate.id for o in stage.run("q", CANDS)] == ["c", "a"]


def test_min_score_applies_after_top_k_so_fewer_than_top_k_may_remain() -> None:
    stage = RerankStage(FixedScores({"a": 0.9, "b": 0.1, "c": 0.8}), top_k=2, min_score=0.85)
    assert [o.candidate.id for o in stage.run("q", CANDS)] == ["a"]


def test_min_score_can_leave_no_outputs_and_the_span_says_so(spans: Any) -> None:
    provider, exporter = spans
    stage = RerankStage(
        FixedScores({"a": 0.1, "b": 0.2, "c": 0.3}), min_score=0.9, tracer_provider=provider
    )
    assert stage.run("q", CANDS) == []
    (span,) = exporter.get_finished_spans()
    attributes = dict(span.attributes or {})
    assert not any(k.startswith("reranker.output_documents.") for k in attributes)
    assert attributes["retrieval_stage.fallback"] is False


def test_min_score_is_not_applied_to_the_recall_order_fallback() -> None:
    # Recall scores are on another scale than the model's: the gate would be meaningless.
    # The input order (c, a, b) is not the recall order (a, b, c), so recall order shows.
    scrambled = [CANDS[2], CANDS[0], CANDS[1]]
    outputs = RerankStage(Failing(RerankTransportError("down")), min_score=0.45).run("q", scrambled)
    assert [(o.candidate.id, o.score, o.reranked, o.input_index) for o in outputs] == [
        ("a", 0.5, False, 1),
        ("b", 0.4, False, 2),
        ("c", 0.3, False, 0),
    ]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_min_score_must_be_finite(bad: float) -> None:
    with pytest.raises(ValueError, match="min_score must be a finite number"):
        RerankStage(NullReranker(), min_score=bad)


BAD_STAGE_OPTIONS = [
    ("on_error", "ignore"),
    ("min_score", float("nan")),
    ("max_content_length", 8),
    ("top_k", -1),
]


@pytest.mark.parametrize(("option", "bad"), BAD_STAGE_OPTIONS)
def test_a_bad_stage_option_is_refused_alike_by_the_stage_and_by_its_rule(
    option: str, bad: Any
) -> None:
    """One rule per option: the stage and `validate.stage_options` refuse the same value with
    the same `InvalidSetting` (still a ValueError), whose field names the option."""
    with pytest.raises(InvalidSetting) as by_stage:
        RerankStage(NullReranker(), **{option: bad})
    with pytest.raises(InvalidSetting) as by_rule:
        validate.stage_options({option: bad})
    assert by_stage.value.field == by_rule.value.field == option
    assert str(by_stage.value) == str(by_rule.value)
    assert str(by_stage.value).startswith(f"{option} must be")
    assert isinstance(by_stage.value, ValueError)


def test_good_stage_options_pass_their_rules() -> None:
    validate.stage_options(
        {"top_k": 0, "on_error": "raise", "min_score": 0.5, "max_content_length": 16}
    )
    validate.stage_options({})


@pytest.mark.parametrize("options", [{"min_scor": 0.1}, {"reranker": NullReranker()}])
def test_an_adapter_from_settings_names_the_stage_when_refusing_a_keyword(
    options: dict[str, Any],
) -> None:
    """A keyword the stage does not take is refused at construction, naming the stage as
    building one would, whether the adapter got a reranker or settings."""
    with pytest.raises(TypeError) as by_stage:
        Stages(NullReranker(), top_k=None, settings=None, stage_options=options)
    with pytest.raises(TypeError) as by_settings:
        Stages(None, top_k=None, settings=RerankSettings(), stage_options=options)
    key = next(iter(options))
    for refused in (by_stage.value, by_settings.value):
        assert str(refused).startswith("RerankStage.__init__() ")
        assert f"argument '{key}'" in str(refused)


@pytest.mark.parametrize(("option", "bad"), BAD_STAGE_OPTIONS)
def test_an_adapter_from_settings_checks_its_stage_options_without_building_a_stage(
    option: str, bad: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adapters built from settings make their stage on first use; a bad option still fails
    where the adapter is constructed, by the stage's own rule, with no stage made for it."""
    built: list[object] = []
    real_init = RerankStage.__init__

    def counting(self: RerankStage, *args: Any, **kwargs: Any) -> None:
        built.append(self)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(RerankStage, "__init__", counting)
    with pytest.raises(InvalidSetting) as refused:
        Stages(None, top_k=None, settings=RerankSettings(), stage_options={option: bad})
    assert refused.value.field == option
    with pytest.raises(TypeError, match="min_scor"):
        Stages(None, top_k=None, settings=RerankSettings(), stage_options={"min_scor": 0.1})
    stages = Stages(None, top_k=2, settings=RerankSettings(), stage_options={"min_score": 0.1})
    assert built == []
    assert stages.sync().min_score == 0.1
    assert len(built) == 1
