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

# The differential tests' oracle, ggml-python, ships only as source, so pip compiles its ggml for the
# local CPU. It is built instead like the ggml that recorded the fixtures (AVX2, FMA, F16C; no AVX-512),
# so that it sums in the order the exact kernels reproduce, with or without AVX-512 (a C compiler and
# cmake from PyPI are all it needs). --no-cache-dir: a wheel built natively by an earlier install must
# not be reused.
# A CPU that cannot run AVX2 code (arm64, an old x86) gets a native build; the tests then compare
# within their tolerance.
ORACLE            := ggml-python==0.0.45
HAS_AVX2          := $(shell grep -qw avx2 /proc/cpuinfo 2>/dev/null && echo yes)
ORACLE_CMAKE_ARGS := $(if $(HAS_AVX2),-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF)
ORACLE_STAMP      := $(VENV)/.oracle-0.0.45-$(if $(HAS_AVX2),avx2-noavx512,native)

.PHONY: setup lab test test-long lint check-sync export sync book clean

setup: $(STAMP)

$(ORACLE_STAMP):
	test -x $(PY) || $(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	CMAKE_ARGS="$(ORACLE_CMAKE_ARGS)" $(PY) -m pip install --quiet --no-cache-dir --no-deps --force-reinstall "$(ORACLE)"
	touch $(ORACLE_STAMP)

# The oracle package (oracle/: ggml_oracle, the tests' and benchmarks' bridge to the real ggml) is installed
# editable beside ggml_lite, after ggml-python; ggml_lite itself never imports it.
$(STAMP): pyproject.toml oracle/pyproject.toml $(ORACLE_STAMP)
	$(PY) -m pip install --quiet -e ".[dev,viz,book]"
	$(PY) -m pip install --quiet --no-deps -e ./oracle
	$(PY) tools/today_sources.py
	touch $(STAMP)

lab: $(STAMP)
	@echo "Starting JupyterLab on notebooks/ — open the http://127.0.0.1:... URL it prints below (Ctrl-C stops it)."
	$(PY) -m jupyter lab --notebook-dir=notebooks $(ROOT_FLAG) $(LAB_ARGS)

check-sync: $(STAMP)
	$(PY) tools/nbexport.py --check
	$(PY) tools/nbsync.py --check

# Static checks: ruff (pyflakes, pycodestyle, bugbear, import order) and mypy; pyproject.toml sets their files and rules.
lint: $(STAMP)
	$(PY) -m ruff check ggml_lite tools tests benchmarks oracle
	$(PY) -m mypy

# Every part runs (sync check, pytest, nbval), then the time of each is printed (tools/run_tests.py).
test: $(STAMP)
	$(PY) tools/run_tests.py

# The same with the random-graph sweeps and the fuzz tests scaled up, then 100,000 random graphs and 100,000 random
# chunked plans (today's allocator, buffer types with a max_size) against the real ggml.
test-long: $(STAMP)
	$(PY) tools/run_tests.py --long

export: $(STAMP)
	$(PY) tools/nbexport.py

sync: $(STAMP) export
	$(PY) tools/nbsync.py

# The course as a static web site in _build/book/, from the committed, executed notebooks: nothing runs, nothing is
# fetched (tools/book/build.py). Serve it locally: .venv/bin/python -m http.server -b 127.0.0.1 -d _build/book
book: $(STAMP)
	$(PY) tools/book/build.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis _build
