#!/usr/bin/env bash
# Installs a real Arize Phoenix (the arize-phoenix server) into its own virtualenv, apart from the
# project's, for tests/third_party/test_phoenix.py. Idempotent: nothing to do when it is already
# there.
# Phoenix brings its own pinned OpenTelemetry, SQLAlchemy, pandas and web stack; keeping it out of
# the project's environment keeps those pins from deciding the project's.
# Usage: tests/phoenix/setup.sh [VENV_DIR]   (default: .venv-phoenix at the repository root)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${1:-.venv-phoenix}"
PHOENIX_VERSION="20.26.1"
PYTHON="${PYTHON:-python3}"

# The installed version from its metadata: importing phoenix.server itself takes ~20 s here.
installed="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("arize-phoenix"))' 2>/dev/null || true)"
if [ -x "$VENV/bin/phoenix" ] && [ "$installed" = "$PHOENIX_VERSION" ]; then
  echo "phoenix: already installed in $VENV"
  exit 0
fi
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "arize-phoenix==$PHOENIX_VERSION"
echo "phoenix: installed arize-phoenix $PHOENIX_VERSION in $VENV"
