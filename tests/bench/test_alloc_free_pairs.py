# SPDX-License-Identifier: Apache-2.0
"""benchmarks/alloc_free_pairs.py (allocate + deallocate per pair, from Python and in the
native loop, per spec): its arguments without a GPU, its rows on a GPU (``gpu`` tests)."""

import subprocess
import sys

import pytest

from rmm_fences._cuda import device_count

from helpers.paths import BENCHMARKS

SCRIPT = BENCHMARKS / "alloc_free_pairs.py"


def pairs(*args, timeout=120):
    """Runs the script as a user does (its folder, benchmarks/, first on sys.path)."""
    res = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout
    )
    print("\n" + res.stdout + res.stderr[-2000:])
    return res


def test_help():
    res = pairs("--help")
    assert res.returncode == 0 and "usage: alloc_free_pairs.py" in res.stdout


def test_a_bad_spec_exits_2_with_the_caret():
    res = pairs("--resource", "cuda", "--resource", "pool")
    assert res.returncode == 2
    assert "bad --resource" in res.stderr and "^" in res.stderr


@pytest.mark.parametrize("args", [("--nbytes", "0"), ("--iters", "0"), ("--iters", "lots")])
def test_zero_and_non_counts_are_usage_errors(args):
    res = pairs(*args)
    assert res.returncode == 2 and f"error: argument {args[0]}" in res.stderr


@pytest.mark.skipif(device_count() > 0, reason="checks the message shown where no GPU is present")
def test_without_a_gpu_it_says_so_and_exits_2():
    res = pairs()
    assert res.returncode == 2
    assert "no CUDA device" in res.stderr and "needs a CUDA GPU" in res.stderr


@pytest.mark.gpu
def test_a_row_per_spec():
    specs = ["pool(cuda)", "cuda_async", "rmm_pool(cuda, initial_pool_size=256MiB)"]
    args = [a for s in specs for a in ("--resource", s)]
    res = pairs(*args, "--nbytes", "1MiB", "--iters", "2000", timeout=300)
    assert res.returncode == 0
    for spec in specs:
        row = [line for line in res.stdout.splitlines() if line.startswith(spec + " ")]
        assert len(row) == 1, res.stdout
        py_us, native_ns = map(float, row[0][len(spec) :].split())
        assert py_us > 0 and native_ns > 0


@pytest.mark.gpu
def test_the_default_specs_are_the_three_peers():
    res = pairs("--iters", "2000", timeout=300)
    assert res.returncode == 0
    rows = [line.split()[0] for line in res.stdout.splitlines()[1:] if line.strip()]
    assert rows == ["pool(cuda_async)", "rmm_pool(cuda)", "cuda_async"], res.stdout
