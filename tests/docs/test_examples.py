"""The README's and docs/cli.md's console examples print what they say (see `examples`).

Each block runs as a new user would type it; a block that cannot run here is skipped with the
reason (the [local] extra missing, jq missing) or is marked in the document as not run, saying
why. ``python -m tests.docs.examples`` rewrites the documents from a run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from . import examples

BLOCKS = examples.all_blocks()


def test_the_documents_have_examples_to_check() -> None:
    """A parser that finds nothing would pass every document."""
    names = {block.document for block in BLOCKS}
    assert names == set(examples.DOCUMENTS)
    assert sum(1 for block in BLOCKS if block.not_run() is None) >= 8


@pytest.fixture(scope="session")
def embedding_cache(request: pytest.FixtureRequest) -> Path:
    """One document-embedding cache for every example, kept between runs in pytest's cache:
    the bundled corpus is embedded once per checkout, not once per example."""
    return Path(request.config.cache.mkdir("readme-embeddings"))


@pytest.mark.parametrize("block", BLOCKS, ids=[block.name for block in BLOCKS])
def test_example_prints_what_the_document_says(
    block: examples.Block, embedding_cache: Path
) -> None:
    why = examples.missing(block)
    if why is not None:
        pytest.skip(why)
    outputs = examples.run(block, cache=embedding_cache)
    found = list(examples.differences(block, outputs))
    assert not found, (
        "\n\n".join(found) + "\n\n(python -m tests.docs.examples rewrites the documents)"
    )


def test_ellipsis_stands_for_lines_and_nothing_else() -> None:
    assert examples.matches(["a", "…", "d"], ["a", "b", "c", "d"])
    assert examples.matches(["a", "…", "d"], ["a", "d"])
    assert not examples.matches(["a", "…", "d"], ["a", "b", "c"])
    assert not examples.matches(["a", "b"], ["a", "b", "c"])
    assert examples.matches(["trace 0123456789abcdef0123456789abcdef"], ["trace " + "f" * 32])


def test_the_demos_model_load_time_stands_for_any_time_and_nothing_else() -> None:
    said = "model loaded in 0.55 s before the rerank (span model.load), not timed as the rerank"
    assert examples.matches([said], [said.replace("0.55", "12.07")])
    assert not examples.matches([said], [said.replace("0.55 s before", "0.55 s after")])
    assert not examples.matches(["took 0.55 s"], ["took 0.56 s"])
