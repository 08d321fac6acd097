# The two commands of the README: `make run` and `make test`. Both build .venv first.
# `make run` installs what serving needs and nothing more; `make test` (and lint, bench)
# installs the project with TEST_EXTRAS: the analysis (PySpark, pandas, matplotlib), the
# benchmarks (psutil) and dev (pytest, selenium, ...). To have `make test` install another
# extra of pyproject.toml, add its name to TEST_EXTRAS: the stamp's name changes with the
# list, so the next `make test` installs it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TEST_EXTRAS := analysis,bench,dev
SERVE_STAMP := $(VENV)/.installed-serve
TEST_STAMP := $(VENV)/.installed-test-$(TEST_EXTRAS)
# every compiled hot path's source (setup.py): a change to one rebuilds them
SOURCES := pyproject.toml setup.py storage/_native.pyx storage/_msgpack.pxd \
	scheduler/_native.pyx scheduler/_handles.pxd api/_native.pyx

.PHONY: run test test-fast lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# the server alone: the project's own dependencies, no extra
$(SERVE_STAMP): $(SOURCES) | $(PY)
	$(PY) -m pip install --quiet -e .
	touch $@

# everything the tests need; it includes the server's install, so it renews that stamp too
$(TEST_STAMP): $(SOURCES) | $(PY)
	$(PY) -m pip install --quiet -e '.[$(TEST_EXTRAS)]'
	touch $@ $(SERVE_STAMP)

run: $(SERVE_STAMP)
	$(VENV)/bin/hourglass serve

test: $(TEST_STAMP)
	$(PY) -m pytest

test-fast: $(TEST_STAMP)
	$(PY) -m pytest -m "not slow and not spark"

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check app storage scheduler api spark_jobs bench tests
	$(VENV)/bin/mypy

bench: $(TEST_STAMP)
	$(VENV)/bin/hourglass bench all

clean:
	rm -rf $(VENV) build *.egg-info
	rm -f storage/_native.c scheduler/_native.c api/_native.c \
		storage/_native.*.so scheduler/_native.*.so api/_native.*.so
