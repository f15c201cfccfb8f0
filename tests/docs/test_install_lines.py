"""Each framework page's install line installs what its example imports.

The example runs in a fresh virtualenv that has only what the page's install line installs
(``tests/docs/setup.sh`` makes ``.venv-docs/<page>`` with that line, as written), with no
``RERANK_*`` or ``OTEL_*`` settings, and must print the output the page shows. A missing or
stale venv skips, naming the script that makes it; ``.ci/run`` runs it before the tests.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from . import install_lines

RUN_SECONDS = 180.0  # a generous bound on a cold venv's imports on a loaded 2-CPU machine


def test_every_page_has_an_install_line_and_an_example() -> None:
    """A parser that finds no page would pass every page."""
    assert install_lines.pages() == ["haystack", "langchain", "llama_index"]
    for page in install_lines.pages():
        assert install_lines.install_line(page).startswith("pip install ")
        code, output = install_lines.example(page)
        assert "import" in code
        assert output.strip()


@pytest.mark.parametrize("page", install_lines.pages())
def test_the_example_runs_where_only_the_install_line_ran(page: str, tmp_path: Path) -> None:
    venv = install_lines.VENVS / page
    stamp = venv / install_lines.STAMP
    line = install_lines.install_line(page)
    if not stamp.exists():
        pytest.skip(f"no {venv} made with {line!r}: run tests/docs/setup.sh")
    if stamp.read_text().strip() != install_lines.digest(page):
        pytest.skip(f"{venv} predates the page's line, the pins or pyproject.toml: rerun setup.sh")
    code, expected = install_lines.example(page)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RERANK_", "OTEL_"))}
    env.pop("PYTHONPATH", None)  # the venv's own editable install, not this interpreter's path

    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_SECONDS,
        check=False,
    )

    assert done.returncode == 0, f"{line!r} then the example:\n{done.stderr}"
    assert done.stdout == expected
