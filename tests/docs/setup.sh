#!/usr/bin/env bash
# Fresh virtualenvs that hold only what a document's install lines install, for tests/docs:
# - .venv-docs/demo: `make install` (make demo's two lines: [cli,local], the model --no-deps; no
#   torch), where the README's and docs/cli.md's `needs demo` examples run (test_examples.py);
# - .venv-docs/<page>: each framework page's install line (docs/integrations/<page>.md), run as
#   written at the clone's root with the venv first on PATH (test_install_lines.py). The line's
#   packages resolve to the versions CI tests (tests/integrations/constraints.txt, through
#   PIP_CONSTRAINT).
# Idempotent: make's own stamp keeps the demo venv; a page's venv whose stamp matches its line,
# the pins and pyproject.toml is kept. pip caches the wheels the other setup scripts fetched.
# Usage: tests/docs/setup.sh   (venvs in .venv-docs/ at the repository root)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3}"
status=0
mkdir -p .venv-docs
if make --no-print-directory install VENV=.venv-docs/demo PYTHON="$PYTHON" >.venv-docs/demo-install.log 2>&1; then
  echo "docs venvs: demo made with make demo's install lines"
else
  echo "docs venvs: 'make install VENV=.venv-docs/demo' failed (last lines of .venv-docs/demo-install.log):" >&2
  tail -5 .venv-docs/demo-install.log >&2
  status=1
fi
export PIP_CONSTRAINT="$PWD/tests/integrations/constraints.txt"
while IFS=$'\t' read -r page want line; do
  venv=".venv-docs/$page"
  if [ -f "$venv/.installed" ] && [ "$(cat "$venv/.installed")" = "$want" ]; then
    echo "docs venvs: $page already made with: $line"
    continue
  fi
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  if PATH="$PWD/$venv/bin:$PATH" VIRTUAL_ENV="$PWD/$venv" bash -c "$line" >"$venv/install.log" 2>&1; then
    echo "$want" >"$venv/.installed"
    echo "docs venvs: $page made with: $line"
  else
    echo "docs venvs: $page: '$line' failed (last lines of $venv/install.log):" >&2
    tail -5 "$venv/install.log" >&2
    status=1
  fi
done < <("$PYTHON" -m tests.docs.install_lines)
exit "$status"
