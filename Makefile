# Walras: every target sets up what it needs on first use (.venv, torch CPU wheel, the project, kubectl/helm,
# Debian packages) and reuses it after.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TOOLS := .tools/bin
export PATH := $(CURDIR)/$(TOOLS):$(CURDIR)/$(BIN):$(PATH)

.PHONY: install tools system demo test lint unit e2e bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch first and explicitly: pip then takes the CPU wheel; a bare requirement would pull a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

$(TOOLS)/kubectl $(TOOLS)/helm:
	scripts/install_k8s_tools.sh

tools: $(TOOLS)/kubectl $(TOOLS)/helm

system:
	scripts/install_system_packages.sh

demo: install
	$(BIN)/walras demo

lint: install
	$(BIN)/ruff check allocator operator tests e2e bench
	$(BIN)/lint-imports
	$(BIN)/mypy allocator

unit: install
	$(BIN)/pytest -q -m "not e2e" tests

e2e: install tools system
	$(BIN)/pytest -q e2e

test: install tools system
	$(MAKE) lint
	$(BIN)/pytest -q -p no:cacheprovider

bench: install
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .tools .pytest_cache .mypy_cache .ruff_cache
