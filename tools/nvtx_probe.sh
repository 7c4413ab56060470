#!/usr/bin/env bash
# On the GPU host: run tests/sanitizer_child.py under compute-sanitizer with NVTX options.
. .whl/install.sh >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .dist/*.whl
cs=/usr/local/cuda/bin/compute-sanitizer
$cs --version | tail -1
for opts in "" "--nvtx yes"; do
  echo "== compute-sanitizer --tool memcheck $opts"
  $cs --tool memcheck $opts python3 -P tests/sanitizer_child.py annotate 2>&1 | tail -12
done
echo "== env seen by the child"
$cs --tool memcheck python3 -P -c "import os; print({k: v for k, v in os.environ.items() if 'NVTX' in k or 'INJECTION' in k})" 2>&1 | tail -3
