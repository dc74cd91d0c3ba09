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
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[env,lambda,coder,dev]'
	@touch $@

venv: $(STAMP) ## Create .venv with the package and every group: environment, lambda, coder, dev (pinned)

test: $(STAMP) ## Run the test suite (what CI runs)
	$(PY) -m pytest -q

# The lint tools live in their own virtualenv: aws-sam-cli pins boto3 and pydantic versions of its own.
LINT_VENV := .venv-tools
LINT_STAMP := $(LINT_VENV)/.installed
# Offline: no telemetry, no credentials, any region (cfn-lint and `sam validate --lint` read no account).
LINT_ENV := SAM_CLI_TELEMETRY=0 AWS_DEFAULT_REGION=us-east-1

$(LINT_STAMP): tools-constraints.txt
	@test -x $(LINT_VENV)/bin/python || $(PYTHON) -m venv $(LINT_VENV)
	$(LINT_VENV)/bin/python -m pip install -q --disable-pip-version-check -c tools-constraints.txt cfn-lint cfn-lint-serverless aws-sam-cli
	@touch $@

lint: $(STAMP) $(LINT_STAMP) ## ruff + mypy + cfn-lint (with serverless rules) + sam validate --lint + static ASL checks
	$(VENV)/bin/ruff check alphaagent coder functions tests bench
	$(VENV)/bin/ruff format --check alphaagent coder functions tests bench
	$(VENV)/bin/mypy
	$(LINT_ENV) $(LINT_VENV)/bin/cfn-lint --append-rules cfn_lint_serverless.rules -- template.yaml
	$(LINT_ENV) $(LINT_VENV)/bin/sam validate --lint --template template.yaml
	$(PY) -m pytest -q -p no:cacheprovider tests/unit/test_static_aws.py

demo: $(STAMP) ## Run the demo analysis on the embedded default (local backend)
	$(VENV)/bin/alphaagent demo

bench: $(STAMP) ## Run the benchmarks (prints figures and the machine)
	$(PY) bench/sandbox.py
	$(PY) bench/turn.py

lock: ## Re-pin constraints.txt from a fresh resolve of every dependency group
	rm -rf /tmp/alphaagent-lock && $(PYTHON) -m venv /tmp/alphaagent-lock
	/tmp/alphaagent-lock/bin/pip install -q -e '.[env,lambda,coder,dev]'
	/tmp/alphaagent-lock/bin/pip freeze --exclude-editable | grep -v '^-e' > constraints.txt

build: $(LINT_STAMP) ## sam build: the zip functions, without Docker (runs build-% below)
	$(LINT_ENV) $(LINT_VENV)/bin/sam build --template template.yaml

# sam build calls `make build-<LogicalId>` (BuildMethod: makefile) with ARTIFACTS_DIR set: one shared
# artifact of alphaagent/ + functions/ + the lambda group's wheels for the Lambda platform (python3.13,
# x86_64), pinned by constraints.txt. No layers for our own code (DESIGN §2).
LAMBDA_PLATFORM := --platform manylinux2014_x86_64 --python-version 3.13 --implementation cp --only-binary=:all:
build-%:
	mkdir -p "$(ARTIFACTS_DIR)"
	cp -R alphaagent functions "$(ARTIFACTS_DIR)/"
	$(PYTHON) -m pip install -q --disable-pip-version-check $(LAMBDA_PLATFORM) --target "$(ARTIFACTS_DIR)" \
		-c constraints.txt 'aws-lambda-powertools[tracer,parser]' pydantic
	find "$(ARTIFACTS_DIR)" -name __pycache__ -prune -exec rm -rf {} +

clean: ## Remove the virtualenv and caches (not the data directory)
	rm -rf $(VENV) $(LINT_VENV) .pytest_cache .mypy_cache .ruff_cache

.PHONY: help venv test lint demo bench lock build clean
