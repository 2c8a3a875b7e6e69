# llm-bottleneck — developer entry points. `make test` is what CI runs.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install test lint typecheck unit rules-check demo run clean

install:  ## install everything (Debian packages, venv, CPU llama-server, test model)
	bash scripts/install.sh

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck:
	$(VENV)/bin/mypy

rules-check:
	promtool check config prometheus/prometheus.yml
	promtool check rules prometheus/rules/*.yml
	promtool test rules prometheus/tests/*.yml

unit:
	$(VENV)/bin/pytest -q

test: install lint typecheck rules-check unit  ## install + lint + types + rules + all tests

run:  ## run the exporter with config.yaml (copy config.example.yaml first)
	$(PY) -m exporter --config config.yaml

demo:  ## exporter + both engine simulators (+ Prometheus when installed), no GPU needed
	$(VENV)/bin/llmb-sim demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
