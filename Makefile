# One command surface: `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev

.DEFAULT_GOAL := help

help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-8s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[env,coder,dev]'
	@touch $@

venv: $(STAMP) ## Create .venv with the package, the builtin environment, the coder and the dev tools (pinned)

test: $(STAMP) ## Run the test suite (what CI runs)
	$(PY) -m pytest -q

lint: $(STAMP) ## ruff + mypy
	$(VENV)/bin/ruff check alphaagent coder tests bench
	$(VENV)/bin/ruff format --check alphaagent coder tests bench
	$(VENV)/bin/mypy

demo: $(STAMP) ## Run the demo analysis on the embedded default (local backend)
	$(VENV)/bin/alphaagent demo

bench: $(STAMP) ## Run the benchmarks (prints figures and the machine)
	$(PY) bench/sandbox.py
	$(PY) bench/turn.py

lock: ## Re-pin constraints.txt from a fresh resolve of every dependency group
	rm -rf /tmp/alphaagent-lock && $(PYTHON) -m venv /tmp/alphaagent-lock
	/tmp/alphaagent-lock/bin/pip install -q -e '.[env,lambda,coder,dev]'
	/tmp/alphaagent-lock/bin/pip freeze --exclude-editable | grep -v '^-e' > constraints.txt

clean: ## Remove the virtualenv and caches (not the data directory)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

.PHONY: help venv test lint demo bench lock clean
