"""``make phoenix``, the Phoenix-without-Docker recipe, serves the tested Phoenix on loopback.

The recipe the docs give (docs/install.md, docs/quality.md) installs Phoenix with the script the
tests use, so its version is the tested one; the docs must name that version, and the server
must bind to loopback by default (Phoenix has no login). ``make -n`` shows the commands without
running them.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from .examples import ROOT

_VERSION = re.compile(r"(?<![\d.])\d+\.\d+\.\d+(?![\d.])")
"""A three-part version standing alone (not part of an address such as 127.0.0.1)."""


def _tested_version() -> str:
    script = (ROOT / "tests" / "phoenix" / "setup.sh").read_text(encoding="utf-8")
    match = re.search(r'^PHOENIX_VERSION="([^"]+)"$', script, flags=re.MULTILINE)
    assert match, "tests/phoenix/setup.sh pins no PHOENIX_VERSION"
    return match[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make on PATH")
def test_make_phoenix_installs_with_the_tests_script_and_serves_on_loopback() -> None:
    done = subprocess.run(
        ["make", "-n", "phoenix"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "bash tests/phoenix/setup.sh" in done.stdout
    assert "PHOENIX_HOST=127.0.0.1" in done.stdout
    assert ".venv-phoenix/bin/phoenix serve" in done.stdout


@pytest.mark.parametrize("page", ["docs/install.md", "docs/quality.md"])
def test_the_docs_name_the_tested_phoenix_for_make_phoenix(page: str) -> None:
    text = (ROOT / page).read_text(encoding="utf-8")
    assert "make phoenix" in text
    phoenix_lines = [line for line in text.splitlines() if "Phoenix" in line]
    named = {v for line in phoenix_lines for v in _VERSION.findall(line)}
    assert named == {_tested_version()}, f"{page} names Phoenix {named}"
