# SPDX-License-Identifier: Apache-2.0
"""``rmm-fences reduce`` on a GPU: it runs, checks and reports (the doctor:
test_doctor_gpu.py)."""

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


def cli(*args):
    res = subprocess.run(
        [sys.executable, "-P", "-m", "rmm_fences", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    print("\n" + res.stdout + res.stderr[-2000:])
    return res


@pytest.mark.parametrize("spec", ["pool(cuda)", "sync_on_free(naive_cache(cuda), mode=deferred)"])
def test_reduce_reports_time_bandwidth_and_the_floor(spec):
    # an odd length of fresh random data; a wrong sum raises in the child (non-zero exit)
    res = cli("reduce", "--resource", spec, "--n", "1048583", "--iters", "200")
    assert res.returncode == 0
    m = re.search(
        r"(\d+\.\d+) us per call, (\d+\.\d+) GB/s, (\d+\.\d+)x the preallocated "
        r"temp buffer \((\d+\.\d+) us\)",
        res.stdout,
    )
    assert m, res.stdout
    us, gbs, ratio, floor = map(float, m.groups())
    assert us > 0 and gbs > 0 and floor > 0
    assert ratio == pytest.approx(us / floor, rel=0.01)
    m = re.search(
        r"through a ReducePlan: (\d+\.\d+) us per call, (\d+\.\d+)x the preallocated",
        res.stdout,
    )
    assert m, res.stdout
    plan_us, plan_ratio = map(float, m.groups())
    assert plan_us > 0 and plan_ratio == pytest.approx(plan_us / floor, rel=0.01)


def test_the_cub_temp_loop_floor_and_a_chain_agree_on_the_sum():
    import cupy

    from rmm_fences._cli.reduce import cub_temp_loop, cub_temp_loop_us
    from rmm_fences.specs import compose

    stream = cupy.cuda.Stream(non_blocking=True)
    x = cupy.random.RandomState(3).standard_normal(4099, dtype=cupy.float32)
    out = cupy.empty(1, dtype=cupy.float32)
    cupy.cuda.Device().synchronize()  # the loop runs on a non-blocking stream
    pool = compose("pool(cuda)")
    for mr, plan in ((None, False), (pool, False), (pool, True)):
        assert cub_temp_loop_us(x, out, mr, stream, iterations=20, rounds=2, plan=plan) > 0
        out.fill(0)
        cupy.cuda.Device().synchronize()
        cub_temp_loop(x, out, mr, stream, plan=plan)()
        stream.synchronize()
        assert float(out.get()[0]) == pytest.approx(
            float(x.astype(cupy.float64).sum().get()), rel=1e-3, abs=1e-2
        )
