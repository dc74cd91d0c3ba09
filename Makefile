# One command surface: `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev

.DEFAULT_GOAL := help

help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-13s %s\n", $$1, $$2}'

# The lint tools live in their own virtualenv: aws-sam-cli pins boto3 and pydantic versions of its own.
LINT_VENV := .venv-tools
LINT_STAMP := $(LINT_VENV)/.installed

# The virtualenvs are filled by uv, installed from PyPI into .venv-uv (pinned below) on first use: the
# same pins (constraints files), the same interpreter's `python -m venv` with its pip and setuptools,
# bytecode compiled as pip compiles it (the suite and the CLI run with PYTHONDONTWRITEBYTECODE here),
# but downloads, builds and compilation in parallel. Where uv cannot be installed or fails, pip installs
# as before, after a one-line notice (`make ... INSTALLER=pip` chooses pip outright).
# Measured from a fresh clone with empty caches, both at load 10-19 on this 2-core VM: `make venv
# tools` took 24 m 21 s wall and 237 CPU-s with pip, one after the other; uv, 9 m 00 s and 100 CPU-s.
UV_VERSION := 0.13.8
UV_VENV := .venv-uv
UV := $(UV_VENV)/bin/uv
INSTALLER ?= uv

# Installed once, by whichever virtualenv needs it first (flock: two may be built at once).
UV_BOOTSTRAP = test -x $(UV) || { { test -x $(UV_VENV)/bin/python || $(PYTHON) -m venv $(UV_VENV); } \
	&& $(UV_VENV)/bin/python -m pip install -q --disable-pip-version-check uv==$(UV_VERSION); } \
	|| echo "make: could not install uv $(UV_VERSION) into $(UV_VENV) (above); pip installs instead" >&2

# $(call install,VENV,CONSTRAINTS,REQUIREMENTS...): create VENV if missing, then install REQUIREMENTS
# pinned by CONSTRAINTS with uv (pip where uv is missing or fails).
define install
	@test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	@if [ "$(INSTALLER)" = uv ]; then flock $(UV_VENV).lock bash -c '$(UV_BOOTSTRAP)'; fi; \
	if [ "$(INSTALLER)" = uv ] && [ -x $(UV) ]; then \
		echo "uv pip install -c $(2) $(3)  (into $(1))"; \
		$(UV) pip install -q --python $(1)/bin/python --compile-bytecode -c $(2) $(3) && exit 0; \
		echo "make: uv could not install into $(1) (above); trying pip" >&2; \
	fi; \
	echo "pip install -c $(2) $(3)  (into $(1))"; \
	$(1)/bin/python -m pip install -q --disable-pip-version-check -c $(2) $(3)
	@touch $@
endef

# (A variable: the commas would split $(call)'s arguments.)
DEV_REQUIREMENTS := -e '.[env,lambda,coder,mcp,viewer,dev]'
$(STAMP): pyproject.toml constraints.txt
	$(call install,$(VENV),constraints.txt,$(DEV_REQUIREMENTS))

venv: $(STAMP) ## Create .venv with the package and every group: environment, lambda, coder, mcp, viewer, dev (pinned)

# The browser tests (tests/browser) drive Debian's chromium through Playwright (never `playwright
# install`: it downloads a browser build). Where we are root, as CI is, a missing chromium is installed
# with apt-get; elsewhere the tests skip and say why (and fail under CI=true).
CHROMIUM := /usr/bin/chromium
browser-deps: ## Install Debian's chromium for the browser tests when missing (as root: apt-get)
	@if [ ! -x $(CHROMIUM) ] && [ "$$(id -u)" = 0 ]; then \
		echo "make: installing chromium for the browser tests (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			chromium fonts-dejavu-core >/dev/null; \
	fi

# The tests need the tools virtualenv too: the IAM harness (tests/iam.py) translates template.yaml with
# samtranslator, which pins a pydantic of its own.
# Two pytest workers per core: many tests wait on a run's wall clock (timeouts, idle children, a CLI's
# exit), and a core whose worker waits stands idle. On this 2-core machine, from a fresh clone, -n 4
# ran the suite in 5 m 34 s at 180% CPU; -n 3, an hour earlier with another engineer's tests
# running, in 7 m 13 s at 141% (`make test TEST_WORKERS=N`).
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) * 2 )))

# The suite writes bytecode caches (`__pycache__/`, git-ignored) even where the environment sets
# PYTHONDONTWRITEBYTECODE, as this machine's does: every CLI process, supervisor and zygote a test
# starts would compile the project from source again, and each worker re-rewrite every test module
# (measured: about a tenth of the CPU of the CLI and sandbox modules).
TEST_ENV := env -u PYTHONDONTWRITEBYTECODE

# What the suite needs, built side by side even when make runs one job at a time (CI runs `make test`):
# the two virtualenvs' downloads and chromium's apt-get overlap. -O: each one's output in one piece.
test-deps:
	@$(MAKE) --no-print-directory -j3 -O $(STAMP) $(LINT_STAMP) browser-deps

test: test-deps ## Run the test suite (what CI runs)
	$(TEST_ENV) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal

test-profile: test-deps ## The suite as `make test` runs it, then its CPU per module (tests/cpu_profile.py)
	$(TEST_ENV) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal -p cpu_profile

# The suite starts with its costliest modules (tests/conftest.py), weighed by the last run's seconds
# in pytest's cache or, where the cache has none (a fresh clone, CI), by tests/module_weights.json.
test-weights: ## After a `make test`: rewrite tests/module_weights.json (seconds per module) from pytest's cache
	$(PY) tests/module_weights.py

# Offline: no telemetry, no credentials, any region (cfn-lint and `sam validate --lint` read no account).
LINT_ENV := SAM_CLI_TELEMETRY=0 AWS_DEFAULT_REGION=us-east-1

$(LINT_STAMP): tools-constraints.txt
	$(call install,$(LINT_VENV),tools-constraints.txt,cfn-lint cfn-lint-serverless aws-sam-cli)

tools: $(LINT_STAMP) ## Create .venv-tools: SAM CLI, samtranslator, cfn-lint (pinned by tools-constraints.txt)

# checkov has a virtualenv of its own too: it pins boto3, pydantic and click versions aws-sam-cli's exclude.
CHECKOV_VENV := .venv-checkov
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed

$(CHECKOV_STAMP): checkov-constraints.txt
	$(call install,$(CHECKOV_VENV),checkov-constraints.txt,checkov)

lint-deps:
	@$(MAKE) --no-print-directory -j3 -O $(STAMP) $(LINT_STAMP) $(CHECKOV_STAMP)

lint: lint-deps ## ruff + mypy + cfn-lint (with serverless rules) + sam validate --lint + checkov + static ASL checks
	$(VENV)/bin/ruff check alphaagent coder functions tests bench
	$(VENV)/bin/ruff format --check alphaagent coder functions tests bench
	$(VENV)/bin/mypy
	$(LINT_ENV) $(LINT_VENV)/bin/cfn-lint --append-rules cfn_lint_serverless.rules -- template.yaml env_images/environment.yaml
	$(LINT_ENV) $(LINT_VENV)/bin/sam validate --lint --template template.yaml
	$(LINT_ENV) $(LINT_VENV)/bin/sam validate --lint --template env_images/environment.yaml
	$(CHECKOV_VENV)/bin/checkov --quiet --compact --skip-download --framework cloudformation -f template.yaml -f env_images/environment.yaml
	$(PY) -m pytest -q -p no:cacheprovider tests/unit/test_static_aws.py

demo: $(STAMP) ## Run the demo analysis on the embedded default (local backend)
	$(VENV)/bin/alphaagent demo

bench: $(STAMP) ## Run the benchmarks (prints figures and the machine)
	$(PY) bench/sandbox.py
	$(PY) bench/turn.py
	$(PY) bench/mcp_turn.py
	$(PY) bench/viewer.py
	$(PY) bench/landlock.py
	$(PY) bench/scale.py
	$(PY) bench/environments.py
	$(PY) bench/session_state.py --quick
	$(PY) bench/aws_sync.py
	$(PY) bench/cli_start.py
	$(PY) bench/coder_cli.py

lock: ## Re-pin constraints.txt from a fresh resolve of every dependency group
	rm -rf /tmp/alphaagent-lock && $(PYTHON) -m venv /tmp/alphaagent-lock
	/tmp/alphaagent-lock/bin/pip install -q -e '.[env,lambda,coder,mcp,viewer,dev]'
	/tmp/alphaagent-lock/bin/pip freeze --exclude-editable | grep -v '^-e' > constraints.txt

# The template's Architecture parameter as the saved configuration of $(ENV) sets it (samconfig.toml's
# parameter_overrides; the template's default, x86_64, if it names none). `make build` passes it to
# sam build, and the build-% rule below installs the wheels of the same platform: SAM tells a makefile
# build only ARTIFACTS_DIR, not the function's architecture (aws/aws-sam-cli#3349). Override with
# `make build ARCHITECTURE=arm64` (and deploy with the same).
# Each value read from samconfig.toml (ARCHITECTURE, CORE_STACK, ENV_ARCHITECTURE) is computed once, on
# first use (`$(eval X := ...)$(X)`): as recursive variables, every reference started a Python (through a
# pyenv shim, ~15 processes each), three to six per `make -n` of a build or deploy rule.
ENV ?= default
SAMCONFIG ?= samconfig.toml
ARCHITECTURE ?= $(eval ARCHITECTURE := $$(shell $(PYTHON) -c 'import shlex, sys, tomllib; 	p = tomllib.load(open(sys.argv[1], "rb")).get(sys.argv[2], {}).get("deploy", {}).get("parameters", {}); 	o = p.get("parameter_overrides", ""); o = shlex.split(o) if isinstance(o, str) else o; 	print(dict(x.split("=", 1) for x in o if "=" in x).get("Architecture", "x86_64"))' $(SAMCONFIG) $(ENV)))$(ARCHITECTURE)
WHEEL_PLATFORM_x86_64 := manylinux2014_x86_64
WHEEL_PLATFORM_arm64 := manylinux2014_aarch64
WHEEL_PLATFORM = $(WHEEL_PLATFORM_$(ARCHITECTURE))

build: $(LINT_STAMP) ## sam build: the zip functions, without Docker (through the build-% rule), for ARCHITECTURE
	$(LINT_ENV) ARCHITECTURE=$(ARCHITECTURE) $(LINT_VENV)/bin/sam build --template template.yaml --parameter-overrides Architecture=$(ARCHITECTURE)

# sam build calls `make build-<LogicalId>` (BuildMethod: makefile) with ARTIFACTS_DIR set: one shared
# artifact of alphaagent/ + functions/ + the lambda group's wheels for the Lambda platform (python3.13,
# ARCHITECTURE: x86_64 or arm64), pinned by constraints.txt. No layers for our own code (DESIGN §2).
LAMBDA_PLATFORM = --platform $(WHEEL_PLATFORM) --python-version 3.13 --implementation cp --only-binary=:all:
build-%:
	@test -n "$(WHEEL_PLATFORM)" || { echo "make $@: ARCHITECTURE must be x86_64 or arm64, not '$(ARCHITECTURE)'" >&2; exit 1; }
	mkdir -p "$(ARTIFACTS_DIR)"
	cp -R alphaagent functions "$(ARTIFACTS_DIR)/"
	$(PYTHON) -m pip install -q --disable-pip-version-check $(LAMBDA_PLATFORM) --target "$(ARTIFACTS_DIR)" \
		-c constraints.txt 'aws-lambda-powertools[tracer,parser]' pydantic
	find "$(ARTIFACTS_DIR)" -name __pycache__ -prune -exec rm -rf {} +

# Images (DESIGN §2): the coder (coder/Dockerfile) and one per environment (env_images/<name>/Dockerfile),
# built from the repository root and pushed to ECR as $(ECR_REGISTRY)/alphaagent-coder:$(IMAGE_TAG) and
# $(ECR_REGISTRY)/alphaagent-env-<name>:$(IMAGE_TAG); missing repositories are created. IMAGE_PLATFORM
# follows ARCHITECTURE, the template's Architecture (linux/arm64 for arm64). No provenance attestation: Lambda
# accepts only a single-platform image manifest, not the index buildx makes with one.
ECR_REGISTRY ?=
IMAGE_TAG ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo latest)
IMAGE_PLATFORM_x86_64 := linux/amd64
IMAGE_PLATFORM_arm64 := linux/arm64
IMAGE_PLATFORM ?= $(IMAGE_PLATFORM_$(ARCHITECTURE))
ECR_REGION = $(word 4,$(subst ., ,$(ECR_REGISTRY)))
ENV_IMAGES := $(patsubst env_images/%/Dockerfile,%,$(wildcard env_images/*/Dockerfile))
CODER_IMAGE = $(ECR_REGISTRY)/alphaagent-coder:$(IMAGE_TAG)
env_image = $(ECR_REGISTRY)/alphaagent-env-$(1):$(IMAGE_TAG)
NEED_REGISTRY = test -n "$(ECR_REGISTRY)" || { echo "make $@: set ECR_REGISTRY, e.g. ECR_REGISTRY=123456789012.dkr.ecr.eu-west-1.amazonaws.com" >&2; exit 1; }

images: ## Build and push the coder and env_images/* images to ECR (needs Docker; ECR_REGISTRY=..., IMAGE_TAG=git sha)
	@command -v docker >/dev/null || { echo "make images: docker is not installed (only the images need Docker)" >&2; exit 1; }
	@command -v aws >/dev/null || { echo "make images: the AWS CLI (aws) is not installed" >&2; exit 1; }
	@$(NEED_REGISTRY)
	@docker info >/dev/null 2>&1 || { echo "make images: the Docker engine is not reachable (docker info failed)" >&2; exit 1; }
	aws ecr get-login-password --region $(ECR_REGION) | docker login --username AWS --password-stdin $(ECR_REGISTRY)
	@for repo in alphaagent-coder $(addprefix alphaagent-env-,$(ENV_IMAGES)); do \
		aws ecr describe-repositories --region $(ECR_REGION) --repository-names $$repo >/dev/null 2>&1 \
		|| aws ecr create-repository --region $(ECR_REGION) --repository-name $$repo \
			--image-scanning-configuration scanOnPush=true >/dev/null || exit 1; \
	done
	docker build --platform $(IMAGE_PLATFORM) --provenance=false -f coder/Dockerfile -t $(CODER_IMAGE) .
	docker push $(CODER_IMAGE)
	@set -e; for name in $(ENV_IMAGES); do \
		echo "docker build + push env_images/$$name -> $(call env_image,$$name)"; \
		docker build --platform $(IMAGE_PLATFORM) --provenance=false -f env_images/$$name/Dockerfile \
			-t $(call env_image,$$name) .; \
		docker push $(call env_image,$$name); \
	done

# `sam deploy` drops samconfig.toml's parameter_overrides when any are given on its command line
# (aws/aws-sam-cli#2380), so the saved ones of $(ENV) (VpcId, subnets... from `sam deploy --guided`) are
# read here and the image URIs appended. Needs python3 >= 3.11 (tomllib).
SAVED_OVERRIDES = $(PYTHON) -c 'import sys, tomllib; \
	p = tomllib.load(open(sys.argv[2], "rb")).get(sys.argv[1], {}).get("deploy", {}).get("parameters", {}); \
	o = p.get("parameter_overrides", ""); print(o if isinstance(o, str) else " ".join(o))' $(ENV) $(SAMCONFIG)

DEPLOY_ARGS = --config-env $(ENV) --parameter-overrides \
	"$$($(SAVED_OVERRIDES)) $(EXTRA_OVERRIDES) Architecture=$(ARCHITECTURE) CoderImageUri=$(CODER_IMAGE) \
	EnvBuiltinImageUri=$(call env_image,builtin)"

deploy: ## make build, then sam deploy --config-env ENV (default: default) with the images of ECR_REGISTRY/IMAGE_TAG
	@$(NEED_REGISTRY)
	@$(MAKE) --no-print-directory build
	SAM_CLI_TELEMETRY=0 $(LINT_VENV)/bin/sam deploy $(DEPLOY_ARGS)

# One custom execution environment (DESIGN §4.9): `make env-deploy ENV=gpu-ml IMAGE=<ECR image URI>`
# deploys env_images/environment.yaml as the stack alphaagent-env-$(ENV) against the core stack of
# samconfig.toml's CORE_CONFIG (default: default; its stack_name, and its Architecture unless
# ARCHITECTURE is given), then records the environment in that stack's registry (the state table),
# with the packages of env_images/$(ENV)/packages.txt if there is one. ENV here is the environment's
# id, not a samconfig section. ENV_OVERRIDES adds parameters (MemorySize=..., SubnetIds=...);
# ENV_MEMORY and ENV_TIMEOUT go to both the stack and the registry's ceilings.
CORE_CONFIG ?= default
CORE_STACK = $(eval CORE_STACK := $$(shell $(PYTHON) -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb")).get(sys.argv[2], {}).get("global", {}).get("parameters", {}).get("stack_name", "alphaagent"))' $(SAMCONFIG) $(CORE_CONFIG)))$(CORE_STACK)
ENV_ARCHITECTURE = $(eval ENV_ARCHITECTURE := $$(shell $(PYTHON) -c 'import shlex, sys, tomllib; 	p = tomllib.load(open(sys.argv[1], "rb")).get(sys.argv[2], {}).get("deploy", {}).get("parameters", {}); 	o = p.get("parameter_overrides", ""); o = shlex.split(o) if isinstance(o, str) else o; 	print(dict(x.split("=", 1) for x in o if "=" in x).get("Architecture", "x86_64"))' $(SAMCONFIG) $(CORE_CONFIG)))$(ENV_ARCHITECTURE)
ENV_MEMORY ?= 3008
ENV_TIMEOUT ?= 900
ENV_DESCRIPTION ?=
ENV_PACKAGES = $(wildcard env_images/$(ENV)/packages.txt)

# The arguments are checked first (prerequisites run in order), before any virtualenv is built.
env-args:
	@[[ "$(ENV)" =~ ^[a-z][a-z0-9-]{0,31}$$ && "$(ENV)" != builtin && "$(ENV)" != default ]] || { echo "make env-deploy: ENV must be the environment id (1-32 of a-z0-9-, starting with a letter; not builtin), e.g. ENV=gpu-ml" >&2; exit 2; }
	@test -n "$(IMAGE)" || { echo "make env-deploy: set IMAGE to the environment's ECR image URI (make images pushes env_images/$(ENV))" >&2; exit 2; }

# The core stack's values (bus, bucket, table, boundary, VPC) go in as parameters read from its
# outputs, never as imports of its exports: an import locks the export (CloudFormation refuses to
# change or delete an export in use), so every environment stack would block core updates.
env-deploy: env-args $(STAMP) $(LINT_STAMP) ## Deploy one custom environment's stack and register it: ENV=<id> IMAGE=<ECR image URI>
	core=$$($(PY) -m alphaagent.aws.env_deploy parameters --core-stack $(CORE_STACK)) || exit 2; \
	SAM_CLI_TELEMETRY=0 $(LINT_VENV)/bin/sam deploy --template-file env_images/environment.yaml \
		--stack-name alphaagent-env-$(ENV) --capabilities CAPABILITY_IAM --resolve-s3 --resolve-image-repos \
		--no-fail-on-empty-changeset --parameter-overrides EnvironmentId=$(ENV) ImageUri=$(IMAGE) \
		CoreStackName=$(CORE_STACK) Architecture=$(if $(filter command line,$(origin ARCHITECTURE)),$(ARCHITECTURE),$(ENV_ARCHITECTURE)) \
		MemorySize=$(ENV_MEMORY) Timeout=$(ENV_TIMEOUT) $$core $(ENV_OVERRIDES)
	$(PY) -m alphaagent.aws.env_deploy register --core-stack $(CORE_STACK) --environment-id $(ENV) \
		--image $(IMAGE) --memory-mb $(ENV_MEMORY) --timeout-s $(ENV_TIMEOUT) \
		--description "$(ENV_DESCRIPTION)" $(if $(ENV_PACKAGES),--packages-file $(ENV_PACKAGES))

# The deploy path as far as it goes offline: `make deploy`'s very `sam deploy` (the saved configuration
# of ENV, the image URIs, placeholders for what `--guided` saves per account) with no credentials at
# all must get past SAM's own argument checks and stop only for want of credentials.
NO_CREDENTIALS := env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY -u AWS_SESSION_TOKEN -u AWS_PROFILE \
	AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_EC2_METADATA_DISABLED=true \
	AWS_DEFAULT_REGION=us-east-1 SAM_CLI_TELEMETRY=0
deploy-check: ECR_REGISTRY = 123456789012.dkr.ecr.us-east-1.amazonaws.com
deploy-check: EXTRA_OVERRIDES = VpcId=vpc-0123456789abcdef0 CoderSubnetIds=subnet-0123456789abcdef0
deploy-check: $(LINT_STAMP) ## sam deploy with the saved configuration and no credentials: must fail only for want of an account
	@out=$$($(NO_CREDENTIALS) $(LINT_VENV)/bin/sam deploy $(DEPLOY_ARGS) --template-file template.yaml \
		--no-execute-changeset 2>&1); rc=$$?; echo "$$out" | tail -n 5; \
	if [ $$rc -eq 0 ]; then echo "deploy-check: sam deploy succeeded without credentials" >&2; exit 1; fi; \
	if ! echo "$$out" | grep -q "Unable to locate credentials"; then \
		echo "deploy-check: sam deploy stopped before asking for credentials (its arguments, above)" >&2; exit 1; fi; \
	echo "deploy-check: sam deploy passed its own checks and stopped only for want of credentials"

clean: ## Remove the virtualenv and caches (not the data directory)
	rm -rf $(VENV) $(LINT_VENV) $(CHECKOV_VENV) $(UV_VENV) $(UV_VENV).lock .pytest_cache .mypy_cache .ruff_cache

.PHONY: help venv browser-deps test-deps test test-profile test-weights lint-deps tools lint demo bench lock build images deploy env-args env-deploy deploy-check clean
