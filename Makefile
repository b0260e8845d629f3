# The two commands a newcomer needs are `make demo` and `make test`; both bootstrap first.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# Test modules run in this many processes at once (tests/plugins/parallel.py, docs/testing.md).
TEST_WORKERS ?= 3
LINTED := runtime capture apply schemas pipeline deploy tests bench native

.PHONY: help bootstrap bootstrap-demo native native-check tools jars up down status lint typecheck test test-unit soak demo bench bench-apply clean

help:
	@echo "make demo       run the pipeline end to end on a local PostgreSQL + Kafka + Spark"
	@echo "make test       bootstrap, lint, type-check and run every test against real services"
	@echo "make up / down  start / stop the local PostgreSQL + Kafka (env in .local/stack.env)"
	@echo "make test-unit  only the tests that need nothing running"
	@echo "make soak       the fault and scenario tests in their long form (about an hour)"

bootstrap:
	@bash deploy/bootstrap.sh test

# Only what the demo runs: no Helm tools, no registry JDK check.
bootstrap-demo:
	@bash deploy/bootstrap.sh demo

jars: bootstrap

# capture's compiled row encoder, into .venv (bootstrap runs this too).
native:
	@bash native/build.sh

# The compiled extension's Rust unit tests and clippy (make test runs this).
native-check: bootstrap
	@bash native/check.sh

# helm and kubeconform for the Helm chart tests (bootstrap runs this too).
tools:
	@bash deploy/helm/tools.sh

up: bootstrap
	@$(PY) -m deploy.local up --registry

down:
	@if [ -x $(PY) ]; then $(PY) -m deploy.local down; else echo "nothing to stop"; fi

status:
	@$(PY) -m deploy.local status

lint: bootstrap
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)

typecheck: bootstrap
	$(VENV)/bin/mypy

test: lint typecheck native-check
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder -m "not soak" $(PYTEST_ARGS)

test-unit: bootstrap
	$(VENV)/bin/pytest tests/unit $(PYTEST_ARGS)

# The e2e proof scenarios with more kills and longer workloads than CI's short form.
soak: bootstrap
	CDC_SOAK_KILLS=$${CDC_SOAK_KILLS:-8} CDC_SOAK_SECONDS=$${CDC_SOAK_SECONDS:-300} \
		$(VENV)/bin/pytest tests/e2e -k "faults or scenarios or network or outages" $(PYTEST_ARGS)

demo: bootstrap-demo
	@$(PY) -m deploy.demo

bench: bootstrap
	@$(PY) -m bench.avro_encode

bench-apply: bootstrap
	@$(PY) -m bench.apply_merge

clean: down
	rm -rf .local .mypy_cache .ruff_cache .pytest_cache
