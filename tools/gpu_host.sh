#!/usr/bin/env bash
# Run on the GPU host (device tool), from the repository root, with .whl, .dist, the host test
# harness and the benchmarks' native loops built here by `make install` carried (carry: .whl,
# .dist, tests/native/rmm_fences_testing.abi3.so, benchmarks/rmm_fences_bench/_loops.abi3.so):
#   bash tools/gpu_host.sh [pytest args...]
# Installs the pinned wheels and the rmm_fences wheel built on the CPU machine, runs the whole
# test suite (GPU tests included) and benchmarks/alloc_free_pairs.py; logs go to $OUT when it is
# set. Switches (environment): SKIP_BENCH (no alloc_free_pairs.py), DOCTOR (doctor --quick with
# JSON and PNG), ASV=<commit hash> (the asv suite; results copied to $OUT/asv-results for
# `asv publish` where the git repo is),
# TEST_DEADLINE=<seconds> (default 420: a test run still going then gets its native stacks
# dumped with cuda-gdb into $OUT/hang_bt.txt and is killed; faulthandler prints the Python
# stacks of a test that runs over 120 s). Failures are printed as they happen (instafail).
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
. .whl/install.sh || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .dist/*.whl || exit 1
export PYTHONUNBUFFERED=1
export RMM_FENCES_REQUIRE_GPU=1  # tests/helpers/gate.py: a gpu test that skips here fails
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null || which compute-sanitizer || echo "no compute-sanitizer"
python3 -c "import rmm, cupy, rmm_fences; print('rmm', rmm.__version__, 'cupy', cupy.__version__, 'rmm_fences', rmm_fences.__version__)"
rc=0
if [ -z "${SKIP_TESTS:-}" ]; then
  PYTHONPATH=tools/pytest_plugins${PYTHONPATH:+:$PYTHONPATH} \
    python3 -m pytest -p instafail -p no:cacheprovider -rs -s -o faulthandler_timeout=120 \
    "$@" > "$out/pytest.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 "${TEST_DEADLINE:-420}"); do
    sleep 1
    kill -0 "$pid" 2>/dev/null || break
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "pytest still running after ${TEST_DEADLINE:-420} s: native stacks in $out/hang_bt.txt"
    # Plain gdb first where installed: cuda-gdb attached on the H200 printed no stack in 90 s.
    gdb=$(command -v gdb || command -v cuda-gdb || ls /usr/local/cuda*/bin/cuda-gdb 2>/dev/null | head -1)
    { nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv
      for t in /proc/"$pid"/task/*; do  # the kernel's view: a spinning thread shows "running"
        echo "$(basename "$t") $(cat "$t/comm") $(cat "$t/wchan") $(cut -c1-40 "$t/syscall")"
      done; } > "$out/hang_threads.txt" 2>&1
    [ -n "$gdb" ] && timeout 90 "$gdb" -p "$pid" -batch -nx -ex "set pagination off" \
      -ex "set non-stop off" -ex "info threads" -ex "thread apply all bt 40" \
      > "$out/hang_bt.txt" 2>&1
    kill -9 "$pid"
  fi
  wait "$pid"
  rc=$?
  grep -v "^$" "$out/pytest.log" | tail -60
fi
[ -z "${SKIP_BENCH:-}" ] && python3 benchmarks/alloc_free_pairs.py 2>&1 | tee "$out/bench.log"
if [ -n "${DOCTOR:-}" ]; then
  python3 -m rmm_fences doctor --quick --json "$out/doctor.json" --plot "$out/doctor.png" 2>&1 \
    | tee "$out/doctor.log"
fi
if [ -n "${ASV:-}" ]; then
  # asv needs the commit in a git repo; the device copy has none, so carry `git bundle create
  # .gitbundle/head.bundle HEAD` and rebuild one here. Results are saved per asv invocation, so
  # each benchmark module runs on its own, within ASV_DEADLINE seconds of the script's start;
  # a later call resumes (--skip-existing-successful; results/ is kept while the machine is warm).
  [ -d .git ] || git init -q
  git fetch -q .gitbundle/head.bundle HEAD && git update-ref refs/heads/asv-bench FETCH_HEAD \
    && rm -rf asv_bench/rmm_fences  # asv's mirror of the repo, cloned again with the commit
  export ASV_PYTHONPATH=$PYTHONPATH  # asv drops PYTHONPATH in what it spawns, not this one
  (cd asv_bench && python3 -m asv machine --yes --machine h200 >/dev/null
   for bench in ${ASV_BENCHES:-alloc_free throughput high_water reduce}; do
     left=$(( ${ASV_DEADLINE:-560} - SECONDS ))
     if [ "$left" -lt 30 ]; then echo "asv: $bench not run (deadline)"; continue; fi
     echo "asv: $bench ($left s left)"
     timeout "$left" python3 -m asv run --python=same --machine h200 --set-commit-hash "$ASV" \
       --skip-existing-successful ${ASV_ARGS:-} --bench "^$bench" --show-stderr 2>&1 | tail -60
   done
   mkdir -p "$out/asv-results" && cp -r results/. "$out/asv-results/")
fi
if [ -z "${SKIP_TESTS:-}" ]; then
  echo "pytest exit code: $rc"
  grep -E "passed|failed|error" "$out/pytest.log" | tail -1
fi
exit "$rc"
