#!/usr/bin/env bash
# Installs a real Infinity rerank server (infinity-emb) into its own virtualenv, apart from the
# project's, for tests/third_party/test_infinity.py. Idempotent: nothing to do when it is already
# there.
# Usage: tests/infinity/setup.sh [VENV_DIR]   (default: .venv-infinity at the repository root)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${1:-.venv-infinity}"
INFINITY_VERSION="0.0.78"
# The same torch release the project pins: on these machines pip takes its CPU wheel from disk.
TORCH_PIN="${TORCH_PIN:-torch==2.13.0}"
PYTHON="${PYTHON:-python3}"

if [ -x "$VENV/bin/infinity_emb" ] && "$VENV/bin/python" -c "import infinity_emb" 2>/dev/null; then
  echo "infinity: already installed in $VENV"
  exit 0
fi
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "$TORCH_PIN" "infinity-emb[server,torch]==$INFINITY_VERSION"
echo "infinity: installed infinity-emb $INFINITY_VERSION in $VENV"
