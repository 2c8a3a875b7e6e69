# llm-bottleneck — developer entry points. `make test` is what CI runs.
VENV ?= .venv
PY := $(VENV)/bin/python
# Extra flags for `llmb-sim demo` (see `llmb-sim demo --help`), e.g.
#   make demo DEMO_ARGS="--sglang-scenario kv_saturated"
DEMO_ARGS ?=

.PHONY: install install-demo test lint typecheck unit integration system pytest rules-check demo run clean

install:  ## install everything (Debian packages, venv, CPU llama-server, test model)
	VENV=$(VENV) bash scripts/install.sh

install-demo:  ## only what the demo needs (Prometheus, Alertmanager, venv with the project)
	VENV=$(VENV) bash scripts/install.sh --demo

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck:
	$(VENV)/bin/mypy

rules-check:  ## generated outputs fresh (python -m mixin --check), rules valid, promtool tests pass
	$(PY) -m mixin --check
	promtool check config prometheus/prometheus.yml
	promtool check rules prometheus/rules/*.yml
	promtool test rules prometheus/rules/tests/*.yml

unit:  ## the unit tier: in-process, no child processes (tests/unit)
	$(VENV)/bin/pytest -q tests/unit

integration:  ## simulators, stubs, the exporter as a process (tests/integration)
	$(VENV)/bin/pytest -q tests/integration

system:  ## the real llama-server, SGLang, Prometheus/promtool, Docker (tests/system)
	$(VENV)/bin/pytest -q tests/system

pytest:  ## every tier
	$(VENV)/bin/pytest -q --durations=25

test: install lint typecheck rules-check pytest  ## install + lint + types + rules + all tests

CONFIG ?= config.yaml
run:  ## run the exporter with CONFIG (default config.yaml: copy config.example.yaml and edit it)
	@test -f "$(CONFIG)" || { echo "make run: $(CONFIG) not found: cp config.example.yaml $(CONFIG) and edit it, or make run CONFIG=FILE" >&2; exit 2; }
	$(PY) -m exporter --config "$(CONFIG)"

demo: install-demo  ## both engine simulators, exporter, Prometheus + rules, Alertmanager; prints the verdicts
	$(VENV)/bin/llmb-sim demo $(DEMO_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
