# Two entry points for a fresh machine: `make demo` and `make test`. Each creates or refreshes .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: venv demo test lint format clean

venv:
	VENV=$(VENV) bash scripts/bootstrap.sh

demo: venv
	$(PY) examples/demo.py

test: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: venv
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
