# The two commands of the README:
#   make demo   - bring up the local GPU cluster and run the meshplan demo on it
#   make test   - run every test (unit + e2e against the real local control plane)
# Both install what they need first (Python venv, Debian packages, Go-built control plane).

SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup deps python control-plane engine-venvs demo test unit e2e down crds lint-crds bench

setup: deps python control-plane engine-venvs

deps:
	@bash e2e/install-deps.sh

python: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	@touch $@

control-plane:
	@bash e2e/build-control-plane.sh

# the engines' own venvs for the conformance suite and the real-vLLM e2e (engines-venv/README.md)
engine-venvs: python
	$(PY) engines-venv/install.py

demo: setup
	$(VENV)/bin/meshplan demo

down: python
	$(VENV)/bin/meshplan dev-cluster down

test: setup
	$(VENV)/bin/pytest $(PYTEST_ARGS)

unit: python
	$(VENV)/bin/pytest tests $(PYTEST_ARGS)

e2e: setup
	$(VENV)/bin/pytest e2e $(PYTEST_ARGS)
