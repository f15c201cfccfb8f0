"""docs/scaling.md's numbers: re-measured from a real traced span, and its tables recomputed.

The doc states the bytes of a measured 50-document RERANKER span (`python -m benchmarks --only
span_size`). This test measures the bundled-corpus span again, in process (the lexical
reranker, no server), and recomputes every per-day and kept-share cell from the bytes the doc
states, with the section's own functions. A change to what a span carries that moves its size
by more than the tolerance fails here until the doc is re-measured.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from benchmarks.sections import span_size

DOC = Path(__file__).resolve().parents[2] / "docs" / "scaling.md"
SIZE_TOLERANCE = 0.03
"""Relative slack for re-measured bytes: gzip output varies by a few bytes with random ids."""


def doc() -> str:
    return DOC.read_text(encoding="utf-8")


def stated_bytes(label: str) -> int:
    """The exact byte count the doc gives in parentheses after `label`'s figure."""
    match = re.search(r"(?<![\d.])" + re.escape(label) + r"[^(]*\(([\d,]+) B\)", doc())
    assert match, f"docs/scaling.md does not state {label!r} in bytes"
    return int(match.group(1).replace(",", ""))


def table_rows(header_start: str) -> list[list[str]]:
    """The body rows of the Markdown table whose header row starts with `header_start`."""
    lines = doc().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


@pytest.fixture(scope="module")
def measured() -> dict[str, Any]:
    """The section's own corpus measurement (lexical reranker: its scores, and so the output
    order the gzip figure depends on, are the ones the doc's run had), without the SDK
    cross-check of the encoder (tests/telemetry covers that)."""
    return span_size.measure_corpus(span_size.DOCS, check_sdk=False)


def test_the_doc_states_the_span_this_code_measures(measured: dict[str, Any]) -> None:
    raw = stated_bytes("**49.5 KiB**")
    compressed = stated_bytes("**8.0 KiB**")
    without_raw = stated_bytes("22.9 KiB")
    without_gzip = stated_bytes("2.9 KiB")

    assert measured["batched_raw"] == pytest.approx(raw, rel=SIZE_TOLERANCE)
    assert measured["batched_gzip"] == pytest.approx(compressed, rel=SIZE_TOLERANCE)
    assert measured["without_content_batched_raw"] == pytest.approx(without_raw, rel=SIZE_TOLERANCE)
    assert measured["without_content_batched_gzip"] == pytest.approx(
        without_gzip, rel=SIZE_TOLERANCE
    )
    (corpus_row,) = [r for r in table_rows("| workload") if r[0].startswith("bundled corpus")]
    assert int(corpus_row[2]) == pytest.approx(measured["attributes_per_span"], rel=0.02)
    assert span_size.human_bytes(raw) in corpus_row[3]
    assert span_size.human_bytes(compressed) in corpus_row[4]


def test_the_per_day_table_is_computed_from_the_stated_span() -> None:
    raw = stated_bytes("**49.5 KiB**")
    compressed = stated_bytes("**8.0 KiB**")
    dropped = stated_bytes("2.9 KiB")
    kept = span_size.kept_share(0.01)
    rows = table_rows("| reranks/s")

    assert [int(r[0].replace(",", "")) for r in rows] == list(span_size.RATES)
    for row, rate in zip(rows, span_size.RATES, strict=True):
        assert row[1:] == [
            span_size.human_bytes(span_size.fleet_volumes(raw)[rate]),
            span_size.human_bytes(span_size.fleet_volumes(compressed)[rate]),
            span_size.human_bytes(span_size.fleet_volumes(dropped)[rate]),
            span_size.human_bytes(span_size.fleet_volumes(compressed)[rate] * kept),
        ]
    assert f"({kept:.2%})" in doc()


def test_the_kept_share_table_is_computed_from_the_stated_span() -> None:
    compressed = stated_bytes("**8.0 KiB**")
    rows = table_rows("| degraded share")

    assert len(rows) == len(span_size.DEGRADED)
    for row, degraded in zip(rows, span_size.DEGRADED, strict=True):
        share = span_size.kept_share(degraded)
        volumes = span_size.fleet_volumes(compressed)
        assert row[0] == f"{degraded:.1%}".replace(".0%", "%")
        assert row[1] == f"{share:.4%}"
        assert row[2:] == [span_size.human_bytes(volumes[r] * share) for r in span_size.RATES]
    assert span_size.BASELINE == 0.05
    assert (
        "SAMPLER_BASELINE_PERCENT:-5}" in (DOC.parents[1] / "docker" / "compose.yaml").read_text()
    )
