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
# make bench: same setup, then the asv suite on this GPU (asv_bench/), its results stamped with
#             the commit, GPU, driver and package versions (tools/asv_report.py --stamp), and its
#             html report; python tools/asv_report.py --results asv_bench/results prints the
#             tables of docs/performance.md from them
# make dist-check: (CI, after make test) build the sdist, then the wheel from it; tag the wheel
#             manylinux with auditwheel; twine check both (into dist/); install the wheel in a fresh
#             venv (build/dist-venv, the wheel's dependencies and its test and dask extras only),
#             import it, run rmm-fences --version and the tests against it (tests/package/test_dist.py
#             checks the files; the host test harness is make install's, built from the headers
#             alone); the tools are pyproject.toml's dist dependency group
# make downstream: on a CUDA machine only (CI does not run it): RMM's and CuPy's test suites
#             as shipped and under each rmm_fences chain (tools/downstream/run.py), from sources
#             fetched into .downstream/ by tools/downstream/fetch_sources.sh, results in
#             DOWNSTREAM_OUT (.downstream/out); installs nothing (PY=python3 where rmm_fences is
#             installed outside .venv); DOWNSTREAM_ARGS: more options (--jobs N ...). A run in
#             parts: DOWNSTREAM_ARGS="--resume --deadline 3000" starts no file after 3000 s, and
#             the same command again runs what is left (tools/gpu_check.py --parts downstream
#             does this)

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

DIST      ?= dist
DIST_VENV ?= build/dist-venv
# never grafted into the wheel, as in RAPIDS' wheels: librmm.so and librapids_logger.so, which
# the extensions link, come from the librmm-cu13 and rapids-logger wheels (one copy per process:
# rmm's current resources live in librmm); the CUDA runtime (linked statically today, as librmm
# does) and driver belong to the system
DIST_EXCLUDE := librmm.so librapids_logger.so libcudart.so.13 libcuda.so.1

.PHONY: test lint demo bench downstream install clean dist-check

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
	  && ../$(PY) ../tools/asv_report.py --stamp results \
	  && ../$(VENV)/bin/asv publish

dist-check: $(STAMP)
	$(PY) -m pip install --quiet --group dist
	rm -rf $(DIST) build/dist-raw $(DIST_VENV)
	$(PY) -m build --outdir build/dist-raw .  # the sdist, then the wheel built from it
	PATH="$(abspath $(VENV))/bin:$$PATH" auditwheel repair $(DIST_EXCLUDE:%=--exclude %) \
	  -w $(DIST) build/dist-raw/*.whl
	cp build/dist-raw/*.tar.gz $(DIST)/
	$(VENV)/bin/auditwheel show $(DIST)/*.whl  # the tag its symbol versions allow
	$(VENV)/bin/twine check --strict $(DIST)/*
	$(PYTHON) -m venv $(DIST_VENV)
	$(DIST_VENV)/bin/python -m pip install --quiet "$$(echo $(DIST)/*.whl)[test,dask]"
	$(DIST_VENV)/bin/python -c '$(DIST_IMPORT)'
	cd / && $(abspath $(DIST_VENV))/bin/python -c '$(DIST_IMPORT)'
	$(DIST_VENV)/bin/rmm-fences --version
	RMM_FENCES_DIST=$(abspath $(DIST)) $(DIST_VENV)/bin/pytest $(PYTEST_ARGS)

# from the repository root and from elsewhere, rmm_fences imports from the fresh venv
DIST_IMPORT := import sys, rmm_fences as m; assert m.__file__.startswith(sys.prefix), m.__file__; print(m.__file__)

downstream:
	$(PY) tools/downstream/run.py --suite rmm=$(RMM_TESTS) --suite cupy=$(CUPY_TESTS) \
	  --out $(DOWNSTREAM_OUT) $(DOWNSTREAM_ARGS)

clean:
	rm -rf $(VENV) build $(DIST) tests/native/rmm_fences_testing*.so benchmarks/rmm_fences_bench/_loops*.so
