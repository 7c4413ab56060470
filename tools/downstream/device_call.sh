#!/usr/bin/env bash
# One call on the GPU host (the device tool), from the repository root, with .whl (the pinned
# wheels and install.sh), .dist (the rmm_fences wheel) and .downstream (the suites' sources,
# from fetch_sources.sh) carried:
#   DS_ARGS="--chains pool" DEADLINE=480 [SUITES=cupy] bash tools/downstream/device_call.sh
# The harness's output folder and CuPy's kernel cache travel between calls as
# .downstream/state.tgz.part-*: each call resumes what the earlier ones left (--resume) and
# stops starting files at DEADLINE seconds. Bring the parts back with
#   cp <files_at>/state.tgz.part-* .downstream/ (after removing the old parts)
# The parts are at most 15 MiB each (what a call may bring back per file).
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out" /tmp/ds
. .whl/install.sh || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
  .dist/*.whl || exit 1
if ls .downstream/state.tgz.part-* >/dev/null 2>&1; then
  cat .downstream/state.tgz.part-* | tar xzf - -C /tmp/ds
fi
suites=()  # SUITES="cupy" (or "rmm"): only those of the fetched suites (default: both)
for name in ${SUITES:-rmm cupy}; do
  [ -d ".downstream/$name-tests" ] && suites+=(--suite "$name=.downstream/$name-tests")
done
RMM_FENCES_COMMIT=${RMM_FENCES_COMMIT:-} python3 -P tools/downstream/run.py "${suites[@]}" \
  --out /tmp/ds/out --cupy-cache /tmp/ds/kernels --resume --deadline "${DEADLINE:-480}" \
  --jobs "${JOBS:-12}" ${DS_ARGS:-} > "$out/run.txt" 2> "$out/progress.txt"
rc=$?
tar czf - -C /tmp/ds out kernels | split -b 15M - "$out/state.tgz.part-"
cp /tmp/ds/out/summary.md "$out/" 2>/dev/null
tail -40 "$out/run.txt"
ls -la "$out"
exit $rc
