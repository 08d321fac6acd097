# The two commands of the README: `make run` and `make test`. Both build .venv first, with
# every extra: the analysis (PySpark, pandas, matplotlib), the benchmarks (psutil) and dev.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-fast lint bench clean

$(STAMP): pyproject.toml setup.py storage/_native.pyx
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[analysis,bench,dev]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/hourglass serve

test: $(STAMP)
	$(PY) -m pytest

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow and not spark"

lint: $(STAMP)
	$(VENV)/bin/ruff check app storage scheduler api spark_jobs bench tests
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(VENV)/bin/hourglass bench all

clean:
	rm -rf $(VENV) build *.egg-info storage/_native.c storage/_native.*.so
