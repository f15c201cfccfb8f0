# Two commands do all the set-up on a fresh machine:
#   make demo   - create .venv, install the project, run `retrieval-stage demo`
#   make test   - create .venv, install the project with its test extras, run lint, types, tests
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint install

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# The [local] extra (sentence-transformers) needs torch. Install the CPU build first, pinned,
# so pip never pulls a multi-GB CUDA build; where no CPU wheel can be had, skip the extra and
# say so (the cross-encoder tests then skip with that reason; the lexical reranker still runs).
TORCH_CPU ?= torch==2.13.0+cpu

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	@if $(BIN)/python -m pip install -q '$(TORCH_CPU)'; then \
		$(BIN)/python -m pip install -q -e '.[test,local]'; \
	else \
		echo "note: $(TORCH_CPU) is not available here: skipping the [local] extra"; \
	fi
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/retrieval-stage demo

lint: $(STAMP)
	$(BIN)/ruff check retrieval_stage tests
	$(BIN)/ruff format --check retrieval_stage tests
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest -q
