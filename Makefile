# stepstream developer entry points. `make help` lists them.
# Servers are real: Kafka from Maven Central jars, FerretDB built from the Go module
# proxy; both cached under ~/.cache/stepstream (STEPSTREAM_CACHE). See docs/infra.md.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON     ?= python3
VENV       := .venv
VENV_STAMP := $(VENV)/.installed
RUN_DIR    := .run
KAFKA_PORT ?= 9092
MONGO_PORT ?= 27017
PYTEST_ARGS ?=
BENCH_ARGS ?=

.PHONY: help venv kafka-up kafka-down mongo-up mongo-down test run bench schemas soak clean

help: ## List the targets
	@echo "stepstream: make <target> [KAFKA_PORT=9092] [MONGO_PORT=27017] [PYTEST_ARGS='-k name'] [BENCH_ARGS=--quick]"
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-z-]*:.*## / {printf "  %-11s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

venv: $(VENV_STAMP) ## Create .venv with the package and its test extras (again only when pyproject.toml changes)

$(VENV_STAMP): pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	@echo '*' > $(VENV)/.gitignore
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $@

kafka-up: ## Start a local Kafka broker on 127.0.0.1:9092 or KAFKA_PORT (data in .run/kafka)
	@deploy/kafka/kafka.sh up --port $(KAFKA_PORT) --data $(RUN_DIR)/kafka

kafka-down: ## Stop the local Kafka broker
	@deploy/kafka/kafka.sh down --data $(RUN_DIR)/kafka

mongo-up: ## Start FerretDB (MongoDB wire protocol on PostgreSQL, installed when missing) on 127.0.0.1:27017 or MONGO_PORT (data in .run/ferretdb)
	@deploy/ferretdb/ferretdb.sh up --port $(MONGO_PORT) --data $(RUN_DIR)/ferretdb

mongo-down: ## Stop the local FerretDB
	@deploy/ferretdb/ferretdb.sh down --data $(RUN_DIR)/ferretdb

test: venv ## Run the whole suite against a throwaway broker and FerretDB on free ports
	@deploy/run-tests.sh $(PYTEST_ARGS)

run: venv ## Start the broker, worker, API and a demo agent locally (on SQLite)
	@deploy/run.sh

bench: venv ## Every benchmark (python -m benchmarks) against a throwaway broker and FerretDB; BENCH_ARGS=--quick for a smoke run
	deploy/chromium/chromium.sh ensure
	deploy/with-servers.sh --secure -- $(VENV)/bin/python -m benchmarks $(BENCH_ARGS)

schemas: venv ## Regenerate schemas/*.schema.json from the msgspec Structs
	$(VENV)/bin/python -m stepstream.schemagen schemas

soak: venv ## Run the long-running soak tests (pytest -m soak) against real servers
	@rc=0; deploy/run-tests.sh -m soak $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "soak: no soak tests yet"; else exit $$rc; fi

clean: ## Stop local servers; remove .venv, .run and build/test debris (cached jars and binaries stay)
	-@deploy/kafka/kafka.sh down --data $(RUN_DIR)/kafka 2>/dev/null
	-@deploy/ferretdb/ferretdb.sh down --data $(RUN_DIR)/ferretdb 2>/dev/null
	rm -rf $(VENV) $(RUN_DIR) .pytest_cache .hypothesis build dist
	find . -path ./.git -prune -o \( -name __pycache__ -o -name '*.egg-info' \) -prune -exec rm -rf {} +

.PHONY: tools deploy-check

tools: ## Build promtool, kustomize and the OpenTelemetry Collector from the Go module proxy into ~/.cache/stepstream (once)
	@deploy/tools/tools.sh build

deploy-check: venv tools ## Check deploy/ alone: alert rules and their unit tests, scrape configs, kustomize render + schemas, dashboard, compose
	$(VENV)/bin/pytest -q tests/deploy
