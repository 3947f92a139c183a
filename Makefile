# Two entry points (see README): `make demo` and `make test`. Both create or refresh the
# virtual environment .venv at the repository root first.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
JOBS ?= 2

.PHONY: demo test conformance coverage-report lint clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	tools/install_system_packages.sh
	touch $(STAMP)

## Import the bundled default model, run it, and check it against ONNX Runtime.
demo: $(STAMP)
	$(PY) tools/demo.py

## The whole test suite (unit tests, ONNX backend suite, layering check).
test: $(STAMP)
	$(PY) -m pytest -n $(JOBS) -q -p no:cacheprovider

## ONNX backend-suite pass counts, all kinds.
conformance: $(STAMP)
	$(PY) tools/conformance.py --kind all --mode both

## Regenerate docs/coverage.md.
coverage-report: $(STAMP)
	$(PY) tools/conformance.py --kind all --mode both --report docs/coverage.md

lint: $(STAMP)
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) .onnx_home .pytest_cache
