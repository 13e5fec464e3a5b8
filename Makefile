# Two entry points for a fresh machine: `make demo` and `make test`. Each creates or refreshes .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: venv demo test lint format docs matrix clean

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

# The figures redrawn from committed JSON (docs/figures), then the API reference from the docstrings with those
# figures, warnings as errors (-W); HTML in build/docs/html (git-ignored).
docs:
	VENV=$(VENV) EXTRAS=dev,docs,elastic bash scripts/bootstrap.sh
	$(PY) scripts/draw_figures.py
	$(PY) -m sphinx -W --keep-going -E -q -b html docs/api build/docs/html

# The fast tests against the oldest Lightning pyproject declares and the newest release (their own venvs).
matrix:
	bash scripts/lightning_matrix.sh

clean:
	rm -rf $(VENV) .venv-lightning-oldest .venv-lightning-latest build dist src/*.egg-info .pytest_cache .ruff_cache
