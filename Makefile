# SPDX-License-Identifier: Apache-2.0
# make test : create .venv, install rmm_fences with its test, dask and lint extras, make lint, then
#             run the tests
#             (install also builds the host test harness, tests/native/rmm_fences_testing*.so,
#             with -DRMM_FENCES_BUILD_TESTS=ON, and the benchmarks' native loops,
#             benchmarks/rmm_fences_bench/_loops*.so, with -DRMM_FENCES_BUILD_BENCHMARKS=ON: both
#             are built in place and not installed, the package is as shipped)
# make lint : ruff (check, format --check), cython-lint, clang-format --dry-run -Werror on the C++
#             headers, tests/native/*.cpp and examples/cpp/*.cu, codespell; the tools are pinned
#             in pyproject.toml's lint extra (the same commands as .pre-commit-config.yaml's hooks,
#             which run offline)
# make demo : same setup, then the hazard matrix (rmm-fences doctor --quick) and the CUB temp-storage loop
#             loop (needs a CUDA GPU; says so and exits 2 without one)
# make bench: same setup, then the asv suite on this GPU (asv_bench/) and its html report
# make downstream: GPU host only, CI does not run it: RMM's and CuPy's test suites as shipped and
#             under each rmm_fences chain (tools/downstream/run.py), from sources fetched into
#             .downstream/ by tools/downstream/fetch_sources.sh; installs nothing (PY=python3 where
#             rmm_fences is installed outside .venv); DOWNSTREAM_ARGS: more options (--jobs N ...)

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.rmm_fences-installed
RMM_TESTS      ?= .downstream/rmm-tests
CUPY_TESTS     ?= .downstream/cupy-tests
DOWNSTREAM_OUT ?= .downstream/out
HEADERS := $(shell find src/rmm_fences/_lib tests/native/include benchmarks -name '*.hpp')
CXX_SOURCES := $(shell find tests/native -name '*.cpp') $(wildcard examples/cpp/*.cu)
SOURCES := pyproject.toml CMakeLists.txt $(wildcard cmake/*) $(shell find src/rmm_fences tests/native benchmarks -name '*.py' -o -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' -o -name '*.pyi' -o -name '*.hpp' -o -name '*.cpp' -o -name CMakeLists.txt)

.PHONY: test lint demo bench downstream install clean

install: $(STAMP)

$(STAMP): $(SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -C cmake.define.RMM_FENCES_BUILD_TESTS=ON \
	  -C cmake.define.RMM_FENCES_BUILD_BENCHMARKS=ON ".[test,dask,lint]"
	touch $@

test: $(STAMP) lint
	$(VENV)/bin/pytest $(PYTEST_ARGS)
	cd asv_bench && ../$(VENV)/bin/asv check --python=same  # a broken benchmark fails here

lint: $(STAMP)  # cython-lint runs pycodestyle, found on PATH
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	PATH="$(abspath $(VENV))/bin:$$PATH" cython-lint src/rmm_fences/_lib/*.pyx src/rmm_fences/_lib/*.pxd \
	  tests/native/*.pyx benchmarks/rmm_fences_bench/*.pyx benchmarks/rmm_fences_bench/*.pxd
	$(VENV)/bin/clang-format --dry-run -Werror $(HEADERS) $(CXX_SOURCES)
	$(VENV)/bin/codespell

demo: $(STAMP)
	$(PY) -m rmm_fences doctor --quick
	$(PY) -m rmm_fences reduce --resource "sync_on_free(naive_cache(cuda), mode=deferred)" \
	  --n 16777216 --iters 200

bench: $(STAMP)
	cd asv_bench && ../$(VENV)/bin/asv machine --yes \
	  && ../$(VENV)/bin/asv run --python=same --set-commit-hash $$(git rev-parse HEAD) \
	  && ../$(VENV)/bin/asv publish

downstream:
	$(PY) tools/downstream/run.py --suite rmm=$(RMM_TESTS) --suite cupy=$(CUPY_TESTS) \
	  --out $(DOWNSTREAM_OUT) $(DOWNSTREAM_ARGS)

clean:
	rm -rf $(VENV) build tests/native/rmm_fences_testing*.so benchmarks/rmm_fences_bench/_loops*.so
