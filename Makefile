# ggml_lite — the two commands a fresh clone needs are `make lab` and `make test`.
# Only python3, make and the package registries are assumed; .venv is created when missing.

PYTHON3 ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard notebooks/*.py))
LAB_ARGS ?=
# JupyterLab refuses to run as root unless told; only root gets the flag.
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

.PHONY: setup lab test check-sync export sync clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

lab: $(STAMP)
	@echo "Starting JupyterLab on notebooks/ — open the http://127.0.0.1:... URL it prints below (Ctrl-C stops it)."
	$(PY) -m jupyter lab --notebook-dir=notebooks $(ROOT_FLAG) $(LAB_ARGS)

check-sync: $(STAMP)
	$(PY) tools/nbexport.py --check
	$(PY) tools/nbsync.py --check

test: $(STAMP) check-sync
	$(PY) -m pytest tests/
	$(PY) -m pytest --nbval-lax --nbval-current-env notebooks/

export: $(STAMP)
	$(PY) tools/nbexport.py

sync: $(STAMP) export
	$(PY) tools/nbsync.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
