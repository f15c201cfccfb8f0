"""Each framework page's example runs as written and prints what the page says it prints.

The example (the first ``python`` block under ``## Example`` in docs/integrations/<page>.md) runs
in a fresh interpreter, as a reader would paste it, with no ``RERANK_*`` or ``OTEL_*`` settings;
its standard output must equal the ``text`` block that follows it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "integrations"
PAGES = {
    "llama_index": ("llama_index.core", "openinference.instrumentation.llama_index"),
    "langchain": ("langchain_classic", "openinference.instrumentation.langchain"),
    "haystack": ("haystack", "openinference.instrumentation.haystack"),
}
EXAMPLE = re.compile(r"## Example\n.*?```python\n(.*?)```.*?```text\n(.*?)```", re.DOTALL)
RUN_SECONDS = 120.0  # a generous bound on imports on a loaded 2-CPU machine, not a speed check


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_pages_example_runs_and_prints_what_the_page_shows(page: str, tmp_path: Path) -> None:
    missing = [m for m in PAGES[page] if not _installed(m)]
    if missing:
        pytest.skip(
            f"{missing} not installed here: tests/integrations/setup.sh makes .venv-frameworks"
        )
    match = EXAMPLE.search((DOCS / f"{page}.md").read_text(encoding="utf-8"))
    assert match, f"docs/integrations/{page}.md has no example followed by its output"
    code, expected = match.groups()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RERANK_", "OTEL_"))}

    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_SECONDS,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout == expected
