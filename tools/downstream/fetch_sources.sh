#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fetch the test suites tools/downstream/run.py runs, at the installed (or given) versions. Needs
# network: for a GPU machine without it, run it elsewhere and copy .downstream/ over.
#   bash tools/downstream/fetch_sources.sh                     # versions of the installed rmm, cupy
#   CUPY_VERSION=14.2.0 RMM_VERSION=26.10.00 bash tools/downstream/fetch_sources.sh
# cupy: tag v<version>; its tests/ becomes .downstream/cupy-tests.
# rmm: tag vYY.MM.PP, else branch release/YY.MM, branch-YY.MM, main; python/rmm/rmm/tests becomes
# .downstream/rmm-tests. cudf (when installed, or CUDF_VERSION given): tag vYY.MM.PP, else
# release/YY.MM, main of NVIDIA/cudf; python/cudf/cudf/tests becomes .downstream/cudf-tests and
# python/cudf_polars/tests .downstream/cudf-polars/tests, each beside a pyproject.toml holding
# only its package's [tool.pytest.ini_options] (warnings as errors, strict xfail). Shallow,
# sparse clones; what was fetched (ref and commit) is printed and written to
# .downstream/SOURCES. PYTHON: the interpreter that reads the versions (python3); DEST: the
# folder (.downstream); CUPY_REPO, RMM_REPO, CUDF_REPO: the git URLs (GitHub's; a local mirror:
# file:///path/to/repo); SUITES: which to fetch (default "cupy rmm cudf"), e.g.
#   SUITES=cudf CUDF_VERSION=26.10.02 CUDF_REPO=file:///mirrors/cudf bash tools/downstream/fetch_sources.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=${DEST:-.downstream}
py=${PYTHON:-python3}

version() {  # -P: this checkout must not shadow anything
  "$py" -P -c "import $1; print($1.__version__)" 2>/dev/null || true
}

suites=" ${SUITES:-cupy rmm cudf} "
wants() { [[ $suites == *" $1 "* ]]; }
cupy_version=${CUPY_VERSION:-$(version cupy)}
cudf_version=${CUDF_VERSION:-$(version cudf)}
rmm_version=${RMM_VERSION:-$(version rmm)}
if wants cupy && [ -z "$cupy_version" ]; then echo "cupy is not installed here: set CUPY_VERSION" >&2; exit 2; fi
if wants rmm && [ -z "$rmm_version" ]; then echo "rmm is not installed here: set RMM_VERSION" >&2; exit 2; fi

# fetch URL SUBDIR TARGET REF...: clone the first REF that exists, copy its SUBDIR to TARGET
fetch() {
  local url=$1 sub=$2 target=$3 tmp ref sha
  shift 3
  tmp=$(mktemp -d)
  for ref in "$@"; do
    if git clone --quiet --depth 1 --filter=blob:none --sparse --branch "$ref" "$url" \
         "$tmp/src" 2>"$tmp/err"; then
      git -C "$tmp/src" sparse-checkout set "$sub"
      sha=$(git -C "$tmp/src" rev-parse HEAD)
      rm -rf "$target"
      cp -r "$tmp/src/$sub" "$target"
      rm -rf "$tmp"
      echo "$target: $url $ref ($sha)"
      printf '%s %s %s %s\n' "$target" "$url" "$ref" "$sha" >> "$dest/SOURCES"
      return 0
    fi
    echo "$url: no ref $ref" >&2
    rm -rf "$tmp/src"
  done
  cat "$tmp/err" >&2
  rm -rf "$tmp"
  return 1
}

# refs VERSION: the tag, release branch, branch-YY.MM and main of a RAPIDS version (YY.MM.PP)
refs() {
  if [[ $1 =~ ^v?([0-9]+)\.([0-9]+)(\.([0-9]+))? ]]; then
    local yy=$((10#${BASH_REMATCH[1]})) mm=$((10#${BASH_REMATCH[2]})) pp=$((10#${BASH_REMATCH[4]:-0}))
    printf 'v%02d.%02d.%02d release/%02d.%02d branch-%02d.%02d ' "$yy" "$mm" "$pp" "$yy" "$mm" "$yy" "$mm"
  fi
  echo main
}

# pytest_ini PYPROJECT TARGET: the [tool.pytest.ini_options] table of PYPROJECT, alone
pytest_ini() {
  awk '/^\[tool\.pytest\.ini_options\]/ { on = 1; print; next } /^\[/ { on = 0 } on' "$1" > "$2"
}

mkdir -p "$dest"
: > "$dest/SOURCES"
if wants cupy; then
  echo "cupy $cupy_version"
  fetch "${CUPY_REPO:-https://github.com/cupy/cupy.git}" tests "$dest/cupy-tests" "v$cupy_version"
fi
if wants rmm; then
  echo "rmm $rmm_version"
  fetch "${RMM_REPO:-https://github.com/rapidsai/rmm.git}" python/rmm/rmm/tests "$dest/rmm-tests" $(refs "$rmm_version")
fi
if wants cudf && [ -n "$cudf_version" ]; then
  echo "cudf $cudf_version"
  fetch "${CUDF_REPO:-https://github.com/NVIDIA/cudf.git}" python "$dest/cudf-python" $(refs "$cudf_version")
  rm -rf "$dest/cudf-tests" "$dest/cudf-polars"
  mkdir -p "$dest/cudf-polars"
  cp -r "$dest/cudf-python/cudf/cudf/tests" "$dest/cudf-tests"
  pytest_ini "$dest/cudf-python/cudf/pyproject.toml" "$dest/cudf-tests/pyproject.toml"
  cp -r "$dest/cudf-python/cudf_polars/tests" "$dest/cudf-polars/tests"
  pytest_ini "$dest/cudf-python/cudf_polars/pyproject.toml" "$dest/cudf-polars/pyproject.toml"
  rm -rf "$dest/cudf-python"
fi
