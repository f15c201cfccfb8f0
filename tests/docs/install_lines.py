"""Each framework page's install line and example, as setup.sh and the test read them.

A page's install line is its first ```` ```bash ```` block (one command, run at the clone's
root); its example is the first ``python`` block under ``## Example`` with the ``text`` block
after it as the output. ``setup.sh`` makes one fresh virtualenv per page with exactly that line,
so the example proves the line installs what the page imports. ``python -m
tests.docs.install_lines`` prints ``page<TAB>line`` per page for the script.
"""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = ROOT / "docs" / "integrations"
VENVS = ROOT / ".venv-docs"
"""One virtualenv per page, named for the page: ``.venv-docs/llama_index``."""
CONSTRAINTS = ROOT / "tests" / "integrations" / "constraints.txt"
"""The framework versions CI tests: the line's packages resolve to them (PIP_CONSTRAINT)."""
STAMP = ".installed"
"""Written in the venv after the line succeeds: the digest of what it was made from."""

_INSTALL = re.compile(r"```bash\n(.*?)\n```", re.DOTALL)
_EXAMPLE = re.compile(r"## Example\n.*?```python\n(.*?)```.*?```text\n(.*?)```", re.DOTALL)


def pages() -> list[str]:
    """The framework pages by name (``llama_index``), sorted."""
    return sorted(path.stem for path in PAGES.glob("*.md"))


def _text(page: str) -> str:
    return (PAGES / f"{page}.md").read_text(encoding="utf-8")


def install_line(page: str) -> str:
    """The page's install command, exactly as written."""
    match = _INSTALL.search(_text(page))
    if match is None or "\n" in match[1].strip():
        raise ValueError(f"docs/integrations/{page}.md: no one-line ```bash install block")
    return match[1].strip()


def example(page: str) -> tuple[str, str]:
    """The page's example code and the output the page shows for it."""
    match = _EXAMPLE.search(_text(page))
    if match is None:
        raise ValueError(f"docs/integrations/{page}.md has no example followed by its output")
    return match[1], match[2]


def digest(page: str) -> str:
    """What a page's venv depends on: its line, the pins and the project's metadata."""
    parts = [install_line(page), CONSTRAINTS.read_text(), (ROOT / "pyproject.toml").read_text()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def main() -> int:
    for page in pages():
        print(f"{page}\t{digest(page)}\t{install_line(page)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
