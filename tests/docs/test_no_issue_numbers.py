"""User docs say what is true now, in their own words: they never cite the project's internal
issue numbers ("before issue 39"), which a reader cannot look up.

docs/benchmarks.md is left out: it is a measurement log that dates each run by the change it
measured."""

from __future__ import annotations

import re

import pytest

from .examples import ROOT

LOGS = {"docs/benchmarks.md"}
PAGES = sorted(
    page
    for page in (
        str(p.relative_to(ROOT)) for p in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    )
    if page not in LOGS
)
_ISSUE = re.compile(r"\bissues? \d+\b", re.IGNORECASE)


@pytest.mark.parametrize("page", PAGES)
def test_a_user_doc_cites_no_internal_issue_number(page: str) -> None:
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    cited = [f"{page}:{n}: {s.strip()}" for n, s in enumerate(lines, 1) if _ISSUE.search(s)]
    assert not cited, "\n".join(cited)
