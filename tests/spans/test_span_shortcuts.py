"""The RERANKER span's shortcuts write exactly what the plain way writes (issue 26).

Each shortcut of `retrieval_stage.spans` is checked against the plain code it replaced, which
is written out here as the specification (as it stood on main before the shortcuts):

- the documents, capped inline instead of through `capped`, with metadata JSON kept per
  input position: `plain_documents` (every id and text through `capped`, every part kept);
- how many documents fit, counted in closed form for documents of one size: `_fit`;
- ``output.value``, its float scores through orjson and its entries joined by concatenation:
  `plain_output_value` (``str.format`` per entry with ``repr``);
- the five ``TraceConfig.mask`` calls skipped: the same stage with a `TraceConfig` subclass
  (which the shortcut never trusts, so it masks through ``mask``);
- the span's context manager, a class instead of a generator: the SDK's
  ``start_as_current_span``, for an escaping `Exception` and for a `BaseException`.

Inputs are drawn to reach every branch the plain code has: non-ASCII, lone surrogates and
over-long ids and texts, metadata, missing scores, outputs that are not among the inputs or
name the wrong position, attribute limits that cut both lists, hidden inputs and outputs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openinference.instrumentation import TraceConfig
from openinference.semconv.trace import RerankerAttributes, SpanAttributes
from opentelemetry import context, trace
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import retrieval_stage.spans.content as content
import retrieval_stage.spans.fit as fit
from retrieval_stage import Candidate, RerankStage, RerankTransportError
from retrieval_stage.models import Reranked
from retrieval_stage.spans.content import capped, float_reprs, metadata_json, output_value
from retrieval_stage.spans.keys import ATTR_INPUT_OMITTED, ATTR_OUTPUT_OMITTED
from retrieval_stage.spans.reranker import RerankerSpans, masks_nothing

from ..fakes import ByLength, Failing
from ..native import LOOPS, use_loops

# -- the plain way, as written before the shortcuts ---------------------------------------------


def plain_documents(
    attributes: dict[str, Any],
    room: int | None,
    candidates: Sequence[Candidate],
    outputs: Sequence[Reranked],
    config: TraceConfig,
    max_bytes: int,
    output_content: bool,
) -> None:
    n_in = 0 if config.hide_inputs else len(candidates)
    n_out = 0 if config.hide_outputs else len(outputs)
    if room is None or 4 * (n_in + n_out) <= room - 2:
        kept_in, kept_out = n_in, n_out
    else:
        sizes_in = [2 + (c.score is not None) + (1 if c.metadata else 0) for c in candidates[:n_in]]
        sizes_out = [
            1
            + (r.score is not None)
            + ((2 if r.candidate.metadata else 1) if output_content else 0)
            for r in outputs[:n_out]
        ]
        kept_in, kept_out = fit._fit(sizes_in, sizes_out, room - 2)
    start = len(attributes)
    parts: list[tuple[str, str, str | None] | None] = [None] * len(candidates)
    prefix_in = RerankerAttributes.RERANKER_INPUT_DOCUMENTS
    prefix_out = RerankerAttributes.RERANKER_OUTPUT_DOCUMENTS
    for i in range(kept_in):
        c = candidates[i]
        base = f"{prefix_in}.{i}.document."
        cid = capped(c.id, max_bytes)
        text = capped(c.text, max_bytes)
        attributes[base + "id"] = cid
        attributes[base + "content"] = text
        if c.score is not None:
            attributes[base + "score"] = c.score
        meta = metadata_json(c.metadata, max_bytes) if c.metadata else None
        if meta is not None:
            attributes[base + "metadata"] = meta
        parts[i] = (cid, text, meta)
    for j in range(kept_out):
        r = outputs[j]
        c = r.candidate
        base = f"{prefix_out}.{j}.document."
        i = r.input_index
        part = parts[i] if 0 <= i < len(parts) and candidates[i] is c else None
        attributes[base + "id"] = part[0] if part is not None else capped(c.id, max_bytes)
        if output_content:
            attributes[base + "content"] = (
                part[1] if part is not None else capped(c.text, max_bytes)
            )
        if r.score is not None:
            attributes[base + "score"] = r.score
        if output_content and c.metadata:
            meta = part[2] if part is not None else metadata_json(c.metadata, max_bytes)
            if meta is not None:
                attributes[base + "metadata"] = meta
    documents = len(attributes) - start
    for key, count in (
        (ATTR_INPUT_OMITTED, n_in - kept_in),
        (ATTR_OUTPUT_OMITTED, n_out - kept_out),
    ):
        if count and (room is None or documents < room):
            attributes[key] = count
            documents += 1


def plain_output_value(outputs: Sequence[Reranked], *, fell_back: bool, max_bytes: int) -> str:
    from json.encoder import encode_basestring as quote

    def dumps(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

    ids = [capped(r.candidate.id, max_bytes) for r in outputs]
    if fell_back:
        head = '{"order":"recall","documents":['
        entries = [f'{{"id":{quote(i)}}}' for i in ids]
    else:
        head = '{"documents":['
        scores: list[Any] = [r.score for r in outputs]
        if all(type(s) is float and math.isfinite(s) for s in scores):
            entries = [
                f'{{"id":{quote(i)},"score":{s!r}}}' for i, s in zip(ids, scores, strict=True)
            ]
        else:
            entries = [dumps({"id": i, "score": s}) for i, s in zip(ids, scores, strict=True)]
    text = head + ",".join(entries) + "]}"
    if len(text.encode("utf-8", errors="replace")) <= max_bytes:
        return text
    tail = f'],"omitted":{len(entries)}}}'
    budget = max_bytes - len(head.encode()) - len(tail.encode())
    kept = 0
    for entry in entries:
        size = len(entry.encode("utf-8", errors="replace")) + (1 if kept else 0)
        if size > budget:
            break
        budget -= size
        kept += 1
    return head + ",".join(entries[:kept]) + f'],"omitted":{len(entries) - kept}}}'


# -- what is drawn ------------------------------------------------------------------------------

TEXTS = st.one_of(
    st.sampled_from(["", "ok", "é" * 20, "\ud800x", "a" * 64]),  # over the small caps below
    st.text(alphabet="abc xyz", max_size=40),
    st.text(max_size=30),  # anything, lone surrogates included
)
METADATA = st.dictionaries(
    st.sampled_from(["src", "page", "é"]), st.one_of(st.integers(), TEXTS), min_size=1, max_size=2
)
RECALL = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-5, 5))
SCORES = st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False))


@st.composite
def calls(draw: st.DrawFn) -> tuple[list[Candidate], list[Reranked]]:
    """Candidates and outputs. Each call draws which of the plain code's branches it visits
    (metadata, recall scores all / none / some, outputs that are not the candidate at their
    position, outputs without a score), so documents of one size, which take the closed form,
    come up as often as the rest."""
    n = draw(st.integers(0, 12))
    metadata = draw(st.sampled_from(["none", "some"]))
    recall = draw(st.sampled_from(["all", "none", "some"]))
    odd_outputs = draw(st.booleans())
    unscored_outputs = draw(st.booleans())

    def meta() -> Any:
        return draw(METADATA) if metadata == "some" and draw(st.booleans()) else {}

    def recall_score() -> Any:
        if recall == "some":
            return draw(st.one_of(st.none(), RECALL))
        return None if recall == "none" else draw(RECALL)

    cands = [Candidate(draw(TEXTS), draw(TEXTS), recall_score(), meta()) for _ in range(n)]
    order = draw(st.permutations(range(n)))[: draw(st.integers(0, n))]
    outputs = []
    for i in order:
        c, index = cands[i], i
        if odd_outputs and draw(st.integers(0, 3)) == 0:  # not the candidate at its position
            c = Candidate(draw(TEXTS), draw(TEXTS), None, meta())
        if odd_outputs and draw(st.integers(0, 3)) == 0:  # a position out of range, or wrong
            index = draw(st.sampled_from([-1, n + 3, 0]))
        score = draw(SCORES) if unscored_outputs else draw(st.floats(-2, 2))
        outputs.append(Reranked(c, score, index))
    return cands, outputs


def config(hide_inputs: bool, hide_outputs: bool) -> TraceConfig:
    return TraceConfig(hide_inputs=hide_inputs, hide_outputs=hide_outputs)


# -- documents ----------------------------------------------------------------------------------


@pytest.fixture(params=LOOPS)
def plan_loops(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The record's list packed by the C loops, or by its Python."""
    return use_loops(request, monkeypatch, fit)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    call=calls(),
    room=st.one_of(st.none(), st.integers(0, 90)),
    hide=st.tuples(st.booleans(), st.booleans()),
    max_bytes=st.sampled_from([16, 24, 64, 2000]),
    output_content=st.booleans(),
    stats=st.dictionaries(st.sampled_from(["a", "b"]), st.integers(), max_size=2),
)
def test_the_documents_are_what_the_plain_way_writes(
    plan_loops: str,
    call: tuple[list[Candidate], list[Reranked]],
    room: int | None,
    hide: tuple[bool, bool],
    max_bytes: int,
    output_content: bool,
    stats: dict[str, int],
) -> None:
    cands, outputs = call
    cfg = config(*hide)
    ours: dict[str, Any] = dict(stats)
    theirs: dict[str, Any] = dict(stats)
    ours.update(fit._plan(room, cands, outputs, cfg, max_bytes, output_content).attributes())
    plain_documents(theirs, room, cands, outputs, cfg, max_bytes, output_content)
    assert list(ours.items()) == list(theirs.items())


@settings(max_examples=200, deadline=None)
@given(
    size_in=st.integers(1, 5),
    n_in=st.integers(0, 30),
    size_out=st.integers(1, 5),
    n_out=st.integers(0, 30),
    budget=st.integers(-5, 200),
)
def test_documents_of_one_size_fit_as_the_walk_fits_them(
    size_in: int, n_in: int, size_out: int, n_out: int, budget: int
) -> None:
    walked = fit._fit([size_in] * n_in, [size_out] * n_out, budget)
    assert fit._fit_uniform(size_in, n_in, size_out, n_out, budget) == walked


@settings(max_examples=100, deadline=None)
@given(
    call=calls(),
    budget=st.integers(-2, 90),
    hide=st.tuples(st.booleans(), st.booleans()),
    output_content=st.booleans(),
)
def test_how_many_fit_is_what_the_walk_says(
    call: tuple[list[Candidate], list[Reranked]],
    budget: int,
    hide: tuple[bool, bool],
    output_content: bool,
) -> None:
    cands, outputs = call
    n_in = 0 if hide[0] else len(cands)
    n_out = 0 if hide[1] else len(outputs)
    sizes_in = [2 + (c.score is not None) + (1 if c.metadata else 0) for c in cands[:n_in]]
    sizes_out = [
        1 + (r.score is not None) + ((2 if r.candidate.metadata else 1) if output_content else 0)
        for r in outputs[:n_out]
    ]
    expected = fit._fit(sizes_in, sizes_out, budget)
    assert fit._kept(cands, outputs, n_in, n_out, budget, output_content) == expected


def test_fifty_plain_documents_take_the_closed_form(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any) -> Any:
        raise AssertionError("walked document by document")

    monkeypatch.setattr(fit, "_fit", refuse)
    cands = [Candidate(f"doc-{i}", "text", 1.0) for i in range(50)]
    outputs = [Reranked(c, 0.5, i) for i, c in enumerate(cands)]
    assert fit._kept(cands, outputs, 50, 50, 100, True) == (17, 16)


@pytest.mark.parametrize("output_content", [True, False])
@pytest.mark.parametrize("budget", [5, 9, 14, 20])
def test_documents_of_mixed_sizes_are_walked(
    budget: int, output_content: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    walked: list[int] = []
    real = fit._fit

    def counting(*args: Any) -> tuple[int, int]:
        walked.append(1)
        return real(*args)

    monkeypatch.setattr(fit, "_fit", counting)
    # Recall scores on every other input: inputs of 3 and 2 attributes.
    cands = [Candidate(f"d{i}", "t", None if i % 2 else 0.5) for i in range(8)]
    outputs = [Reranked(c, 0.5, i) for i, c in enumerate(cands)]
    kept = fit._kept(cands, outputs, 8, 8, budget, output_content)
    sizes_in = [2 if i % 2 else 3 for i in range(8)]
    assert kept == real(sizes_in, [3 if output_content else 2] * 8, budget)
    assert walked == [1]


def test_an_output_that_is_not_the_input_at_its_position_gets_its_own_metadata() -> None:
    cands = [Candidate("a", "x", None, {"of": "a"}), Candidate("b", "y", None, {"of": "b"})]
    stranger = Candidate("s", "z", None, {"of": "stranger"})
    outputs = [Reranked(stranger, 0.9, 0), Reranked(cands[1], 0.5, 1)]
    attributes: dict[str, Any] = {}
    attributes.update(fit._plan(None, cands, outputs, TraceConfig(), 2000, True).attributes())
    assert attributes["reranker.output_documents.0.document.metadata"] == '{"of": "stranger"}'
    assert attributes["reranker.output_documents.1.document.metadata"] == '{"of": "b"}'


@pytest.mark.parametrize("hide_inputs", [True, False])
def test_metadata_only_outputs_have_is_kept(plan_loops: str, hide_inputs: bool) -> None:
    """No input with metadata (or none shown), an output with some: its JSON is still kept."""
    cands = [Candidate("a", "x"), Candidate("b", "y")]
    stranger = Candidate("s", "z", None, {"of": "stranger"})
    outputs = [Reranked(stranger, 0.9, 0), Reranked(cands[1], 0.5, 1)]
    config = TraceConfig(hide_inputs=hide_inputs)
    attributes = fit._plan(None, cands, outputs, config, 2000, True).attributes()
    assert attributes["reranker.output_documents.0.document.metadata"] == '{"of": "stranger"}'
    expected: dict[str, Any] = {}
    plain_documents(expected, None, cands, outputs, config, 2000, True)
    assert list(attributes.items()) == list(expected.items())


def test_a_key_the_span_already_holds_takes_no_new_room() -> None:
    limits = SpanLimits(max_span_attributes=11)
    span: Any = (
        TracerProvider(span_limits=limits)
        .get_tracer("t")
        .start_span("s", attributes={"a": 1, "b": 2})
    )
    cands = [Candidate(f"d{i}", "t") for i in range(4)]  # 2 attributes each
    # 9 free; "a" is set again and "c" is new: 8 left, 2 kept for the omitted counts.
    attributes = fit.outcome_attributes(
        span, {"a": 5, "c": 1}, cands, [], config=TraceConfig(), max_content_length=2000
    )
    assert sum(key.endswith(".document.id") for key in attributes) == 3
    assert attributes[ATTR_INPUT_OMITTED] == 1
    span.end()


def test_metadata_json_is_computed_once_for_a_document_in_both_lists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    real = metadata_json

    def counting(*args: Any) -> str:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(fit, "metadata_json", counting)
    cands = [Candidate(f"d{i}", "t", None, {"n": i}) for i in range(3)]
    outputs = [Reranked(cands[i], 0.5, i) for i in (2, 0, 1)]
    attributes: dict[str, Any] = {}
    attributes.update(fit._plan(None, cands, outputs, TraceConfig(), 2000, True).attributes())
    assert len(calls) == 3
    assert attributes["reranker.output_documents.0.document.metadata"] == '{"n": 2}'


# -- output.value -------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=30))
def test_float_reprs_are_reprs(values: list[float]) -> None:
    assert float_reprs(values) == list(map(repr, values))


@pytest.mark.parametrize(
    "value",
    [0.0, -0.0, 1e-4, 9.999e-05, -1e-4, 1e-05, 5e-324, 1e16, 9999999999999998.0, 1e22, 0.1, 1.0],
)
def test_float_reprs_at_the_edges_of_reprs_exponent_form(value: float) -> None:
    assert float_reprs([value, 0.5]) == [repr(value), "0.5"]


@pytest.fixture(params=LOOPS)
def output_loops(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``output.value``'s common case written by the C loops, or by its Python."""
    return use_loops(request, monkeypatch, content)


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    call=calls(),
    fell_back=st.booleans(),
    max_bytes=st.sampled_from([16, 40, 100, 2000]),
    odd=st.sampled_from([None, math.nan, math.inf, 3, 0.5]),
)
def test_output_value_is_what_the_plain_way_writes(
    output_loops: str,
    call: tuple[list[Candidate], list[Reranked]],
    fell_back: bool,
    max_bytes: int,
    odd: Any,
) -> None:
    _, outputs = call
    if outputs and odd != 0.5:  # one score json.dumps must write (or that is not a float)
        first = outputs[0]
        outputs[0] = Reranked(first.candidate, odd, first.input_index)
    ours = output_value(outputs, fell_back=fell_back, max_bytes=max_bytes)
    assert ours == plain_output_value(outputs, fell_back=fell_back, max_bytes=max_bytes)


# The common case the shortcut writes whole: printable ASCII ids (quotes, backslashes and
# braces among them, which send it the general way), float scores of every magnitude around
# repr's exponent form, and limits that cut the text anywhere, at an entry's edge included.
ASCII_IDS = st.text(alphabet=st.characters(min_codepoint=0x1F, max_codepoint=0x7F), max_size=12)
PLAIN_SCORES = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -0.0, 1e-4, 9.999e-05, 1e16, 9999999999999998.0, 0.1, -3.5]),
    st.floats(min_value=-1.0, max_value=1.0),
    st.floats(min_value=1e-6, max_value=2e-4),  # where orjson drops repr's exponent form
    st.floats(min_value=1e15, max_value=1e18),  # where some orjson releases may differ too
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    pairs=st.lists(st.tuples(ASCII_IDS, PLAIN_SCORES), max_size=60),
    max_bytes=st.one_of(st.integers(0, 400), st.sampled_from([2000])),
)
def test_output_value_of_ascii_ids_is_what_the_plain_way_writes(
    output_loops: str, pairs: list[tuple[str, float]], max_bytes: int
) -> None:
    outputs = [Reranked(Candidate(i, "t"), score, n) for n, (i, score) in enumerate(pairs)]
    ours = output_value(outputs, fell_back=False, max_bytes=max_bytes)
    assert ours == plain_output_value(outputs, fell_back=False, max_bytes=max_bytes)
    json.loads(ours)


@pytest.mark.parametrize("max_bytes", range(1960, 2010))
def test_fifty_full_precision_scores_are_cut_where_the_plain_way_cuts_them(
    output_loops: str, max_bytes: int
) -> None:
    """Fifty ids and full-precision scores are ~2,150 bytes: the default 2,000 cuts them."""
    outputs = [Reranked(Candidate(f"doc-{i}", "t"), 1.0 - i / 97.3, i) for i in range(50)]
    ours = output_value(outputs, fell_back=False, max_bytes=max_bytes)
    assert ours == plain_output_value(outputs, fell_back=False, max_bytes=max_bytes)
    assert len(ours) <= max_bytes
    assert json.loads(ours)["omitted"] > 0


def test_an_id_read_that_changes_the_outputs_cannot_crash_the_c_output_value() -> None:
    """Reading a `Candidate` subclass's id runs Python, which may change the caller's list:
    the C writer walks a copy of its own."""
    outputs: list[Reranked] = []

    class Meddling(Candidate):
        def __getattribute__(self, name: str) -> Any:
            if name == "id":
                outputs.clear()
            return object.__getattribute__(self, name)

    outputs += [Reranked(Meddling("a", "t"), 0.5, 0), Reranked(Candidate("b", "t"), 0.25, 1)]
    value = output_value(list(outputs), fell_back=False, max_bytes=2000)
    assert json.loads(value)["documents"] == [{"id": "a", "score": 0.5}, {"id": "b", "score": 0.25}]


@pytest.mark.parametrize("max_bytes", [10**20, 2**63])
def test_a_cap_beyond_what_c_holds_still_writes_the_whole_outcome(max_bytes: int) -> None:
    from retrieval_stage.telemetry.otlp_encoder import encode_spans_fast, sdk_serialize_spans

    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=2048))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    cands = [Candidate(f"d{i}", "text é " * 3, 0.5) for i in range(5)]
    RerankStage(ByLength(), tracer_provider=provider, max_content_length=max_bytes).run("q", cands)
    (span,) = exporter.get_finished_spans()
    body = encode_spans_fast([span])
    attributes = span.attributes or {}
    assert json.loads(str(attributes[SpanAttributes.OUTPUT_VALUE]))["documents"]
    assert attributes["reranker.output_documents.4.document.content"] == "text é " * 3
    assert body == sdk_serialize_spans([span])


# -- masking ------------------------------------------------------------------------------------

OUR_KEYS = [
    RerankerAttributes.RERANKER_QUERY,
    SpanAttributes.INPUT_VALUE,
    SpanAttributes.INPUT_MIME_TYPE,
    SpanAttributes.OUTPUT_VALUE,
    SpanAttributes.OUTPUT_MIME_TYPE,
]
BOOL_SETTINGS = [
    f.name
    for f in fields(TraceConfig)
    if f.metadata.get("env_var") and isinstance(f.metadata.get("default_value"), bool)
]


@settings(max_examples=100, deadline=None)
@given(st.fixed_dictionaries({name: st.booleans() for name in BOOL_SETTINGS}))
def test_masks_nothing_only_when_mask_gives_our_values_back(settings_: dict[str, bool]) -> None:
    cfg = TraceConfig(**settings_)  # type: ignore[arg-type]
    given_back = all(cfg.mask(key, "v") == "v" for key in OUR_KEYS)
    assert masks_nothing(cfg) == given_back


class SameConfig(TraceConfig):
    """OpenInference's TraceConfig under another name: the shortcut must not trust it."""


class Redacting(TraceConfig):
    """Masks our own query although nothing is hidden: a subclass may mask as it likes."""

    def mask(self, key: str, value: Any, **kwargs: Any) -> Any:
        if key == RerankerAttributes.RERANKER_QUERY:
            return "<redacted>"
        return super().mask(key, value, **kwargs)


def stage_spans(cfg: TraceConfig, *, fail: bool = False) -> list[list[tuple[str, Any]]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=40))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reranker: Any = Failing(RerankTransportError("down")) if fail else ByLength()
    stage = RerankStage(reranker, tracer_provider=provider, trace_config=cfg, model_name="m")
    cands = [Candidate(f"d{i}", "x" * i, 1.0 - i / 10, {"i": i} if i % 2 else {}) for i in range(8)]
    stage.run("the query", cands, top_k=5)
    provider.shutdown()
    return [list((s.attributes or {}).items()) for s in exporter.get_finished_spans()]


@pytest.mark.parametrize("fail", [False, True], ids=["succeeded", "fell back"])
@pytest.mark.parametrize("hide", [(False, False), (True, False), (False, True), (True, True)])
def test_a_span_unmasked_by_the_shortcut_is_the_masked_one(
    hide: tuple[bool, bool], fail: bool
) -> None:
    ours = stage_spans(config(*hide), fail=fail)
    plain = stage_spans(SameConfig(hide_inputs=hide[0], hide_outputs=hide[1]), fail=fail)
    assert ours == plain


@pytest.mark.parametrize("hide_outputs", [False, True], ids=["shown", "hidden"])
def test_hidden_outputs_are_never_built(
    hide_outputs: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenInference's own config is given the output value as a callable, which it calls only
    for a value it keeps: a span hiding its outputs builds none (it cost ~12% of such a call)."""
    import retrieval_stage.spans.reranker as reranker

    built: list[int] = []

    def counting(outputs: Sequence[Reranked], **kwargs: Any) -> str:
        built.append(len(outputs))
        return output_value(outputs, **kwargs)

    monkeypatch.setattr(reranker, "output_value", counting)
    (attributes,) = stage_spans(config(False, hide_outputs))
    value = dict(attributes)[SpanAttributes.OUTPUT_VALUE]
    assert built == ([] if hide_outputs else [5])
    assert (value == "__REDACTED__") is hide_outputs


def test_a_subclass_masks_through_its_own_mask() -> None:
    (attributes,) = stage_spans(Redacting())
    assert dict(attributes)[RerankerAttributes.RERANKER_QUERY] == "<redacted>"


# -- the span's context manager -----------------------------------------------------------------


def finished(raise_: BaseException, ours: bool) -> Any:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    before = context.get_current()

    def run() -> None:
        if ours:
            spans = RerankerSpans(provider, trace_config=TraceConfig())
            with spans.start("q", [], model_name=None, top_k=None, provider=None):
                raise raise_
        with provider.get_tracer("t").start_as_current_span("rerank"):
            raise raise_

    with pytest.raises(type(raise_)):
        run()
    assert context.get_current() == before
    (span,) = exporter.get_finished_spans()
    return span


@pytest.mark.parametrize(
    "raise_", [ValueError("boom"), KeyboardInterrupt("stop")], ids=["Exception", "BaseException"]
)
def test_leaving_ends_the_span_as_start_as_current_span_does(raise_: BaseException) -> None:
    ours, reference = finished(raise_, ours=True), finished(raise_, ours=False)
    assert ours.status.status_code == reference.status.status_code
    assert ours.status.description == reference.status.description
    assert [e.name for e in ours.events] == [e.name for e in reference.events]
    assert ours.end_time is not None


def test_a_failure_while_entering_still_detaches_and_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    import retrieval_stage.spans.reranker as reranker

    def broken() -> dict[str, Any]:
        raise RuntimeError("context attributes failed")

    monkeypatch.setattr(reranker, "context_attributes", broken)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    before = trace.get_current_span()
    spans = RerankerSpans(provider, trace_config=TraceConfig())
    with (
        pytest.raises(RuntimeError),
        spans.start("q", [], model_name=None, top_k=None, provider=None),
    ):
        pass
    assert trace.get_current_span() is before
    (span,) = exporter.get_finished_spans()
    assert span.status.description == "RuntimeError: context attributes failed"
