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

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
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
