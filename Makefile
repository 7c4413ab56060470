# SPDX-License-Identifier: Apache-2.0
# make test : create .venv, install rmm_fences with its test extras, run the tests
# make demo : same setup, then run the demo (needs a CUDA GPU; says so and exits 2 without one)

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.rmm_fences-installed
SOURCES := pyproject.toml CMakeLists.txt $(shell find rmm_fences -name '*.py' -o -name '*.pyx' -o -name '*.pyi' -o -name '*.hpp')

.PHONY: test demo install clean

install: $(STAMP)

$(STAMP): $(SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet ".[test]"
	touch $@

test: $(STAMP)
	$(VENV)/bin/pytest $(PYTEST_ARGS)

demo: $(STAMP)
	$(PY) -P -m rmm_fences demo  # -P: the source tree must not shadow the installed package

clean:
	rm -rf $(VENV) build
