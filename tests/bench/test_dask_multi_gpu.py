# SPDX-License-Identifier: Apache-2.0
"""The multi-GPU Dask-cuDF benchmark's parts that need no GPU (rmm_fences_bench.multi_gpu):
the tables' formulas, the host-side checks, the chains and the report. The benchmark itself,
benchmarks/dask_multi_gpu.py, runs on a machine with several GPUs (docs/dask.md)."""

import json
import pathlib
import runpy

import numpy as np
import pandas as pd
import pytest

from rmm_fences.specs import parse_spec

from helpers.paths import ROOT
from helpers.scripts import load_script
from rmm_fences_bench import multi_gpu as M

KEYS, ROWS = 37, 1000


def left_frame(start, stop, keys=KEYS):
    return pd.DataFrame(M.left_columns(np, start, stop, keys))


def test_a_partition_is_the_same_rows_whoever_makes_it():
    whole = left_frame(0, 100)
    pieces = pd.concat([left_frame(0, 40), left_frame(40, 100)], ignore_index=True)
    pd.testing.assert_frame_equal(whole, pieces)
    assert (whole.key == np.arange(100) % KEYS).all() and (whole.y == np.arange(100) % 7).all()
    assert whole.x.between(0.0, 1.0, inclusive="left").all()
    assert whole.x.nunique() == 100, "x is spread, not constant"


def test_expected_groups_match_a_groupby_of_the_whole_table():
    df = left_frame(0, ROWS)
    truth = df.groupby("key").agg(xsum=("x", "sum"), n=("x", "count"), ysum=("y", "sum"))
    sample = M.sample_keys(KEYS, count=10)
    assert 0 in sample and KEYS - 1 in sample and len(set(sample)) == len(sample)
    got = M.expected_groups(sample, ROWS, KEYS)
    for k, (xs, n, ys) in got.items():
        assert np.isclose(xs, truth.xsum[k], rtol=1e-12)
        assert n == truth.n[k] and ys == truth.ysum[k]
    computed = {k: tuple(v) for k, v in zip(truth.index, truth.itertuples(index=False))}
    assert M.check_groups(computed, got) == []


def test_check_groups_names_what_is_wrong():
    want = M.expected_groups([1, 2, 3], ROWS, KEYS)
    got = dict(want)
    got[1] = (want[1][0] + 1e-3, want[1][1], want[1][2])
    got[2] = (want[2][0], want[2][1] - 1, want[2][2])
    del got[3]
    bad = M.check_groups(got, want)
    assert len(bad) == 3 and bad[2] == "key 3: missing"


def test_the_right_table_holds_each_key_once():
    right = pd.DataFrame(M.right_columns(np, 10, 20))
    assert right.key.tolist() == list(range(10, 20)) and (right.z == right.key * 0.5).all()


def test_check_sorted():
    assert M.check_sorted([(0.0, 0.2, 5), (0.0, 0.0, 0), (0.2, 0.9, 7)]) == []
    assert M.check_sorted([(0.0, 0.5, 5), (0.4, 0.9, 7)]) == ["partition 1: [0.4, 0.9] after 0.5"]


def test_each_chain_is_a_cluster_option_or_a_spec_that_parses():
    for name in M.CHAINS:
        kwargs, spec = M.chain_setup(name)
        assert bool(kwargs) != (spec is not None), name
        if spec is not None:
            parse_spec(spec)
    assert M.chain_setup("cuda_async") == ({"rmm_async": True}, None)
    with pytest.raises(ValueError, match="chain must be one of cuda_async"):
        M.chain_setup("cuda")


def test_the_report_compares_with_cuda_async_and_the_one_gpu_run():
    rows = [
        M.Row(1, "cuda_async", "merge", 10.0, 100, [2048.0]),
        M.Row(1, "rmm_fences_pool", "merge", 9.0, 100, [1024.0]),
        M.Row(2, "cuda_async", "merge", 12.5, 200, [2048.0, 3072.0]),
        M.Row(2, "rmm_fences_pool", "merge", 10.0, 200, [1024.0, 1024.0], problems=["x"]),
    ]
    assert M.scaling(rows, "rmm_fences_pool", "merge") == {1: 1.0, 2: 0.9}
    table = M.render(rows)
    assert table[2] == "| 1 | merge | cuda_async | 10.00 | 1.000 | 1.00 | 2.0 | - | ok |"
    assert table[5] == "| 2 | merge | rmm_fences_pool | 10.00 | 0.800 | 0.90 | 1.0 | - | x |"
    assert M.Row(**json.loads(rows[0].to_json())) == rows[0]


def test_the_script_defaults_and_refusals():
    script = load_script(ROOT / "benchmarks" / "dask_multi_gpu.py")
    args = script.parser().parse_args([])
    assert (args.gpus, args.rows_per_gpu, args.chain) == ("1,2,4,8", 400_000_000, None)
    with pytest.raises(SystemExit):
        script.parser().parse_args(["--chain", "cuda"])


def test_every_worker_preloads_the_row_stack_alias_whatever_this_process_holds(monkeypatch):
    """On numpy 2.5 a Dask-CUDA worker where cuDF is installed fails to start without
    ``numpy.row_stack`` (numba-cuda <= 0.30.4 registers it). The benchmark makes the alias in its
    own process before it starts the cluster, and a worker is a new process whose numpy lacks it
    again, so the preload cannot depend on this process's numpy (a run on the GPU host, whose
    numpy is 2.5, had every worker fail to start when it did)."""
    alias = str(pathlib.Path(M.__file__).with_name("row_stack_alias.py"))
    monkeypatch.setattr(np, "row_stack", np.vstack, raising=False)  # as after the alias here
    assert M.worker_preloads() == [alias]
    monkeypatch.delattr(np, "row_stack")
    assert M.worker_preloads() == [alias]


def test_the_row_stack_alias_only_adds_what_numpy_lacks(monkeypatch):
    (path,) = M.worker_preloads()
    own = object()
    monkeypatch.setattr(np, "row_stack", own, raising=False)
    runpy.run_path(path)
    assert np.row_stack is own  # a numpy that has it keeps its own
    monkeypatch.delattr(np, "row_stack")
    try:
        runpy.run_path(path)
        assert np.row_stack is np.vstack
    finally:  # numpy without row_stack gets none back (monkeypatch restores one it had)
        np.__dict__.pop("row_stack", None)


def _run_file(tmp_path):
    """A --out file of a run on 1 and 2 GPUs: the environment line, then a row per case."""
    env = {"commit": "0123456789abcdef", "gpu": "NVIDIA H200", "driver": "580.159.04"}
    rows = [
        M.Row(g, chain, op, seconds, 100 * g, [1024.0] * g, hazards=0 if "track" in chain else None)
        for g in (1, 2)
        for op in M.OPERATIONS
        for chain, seconds in (("cuda_async", 10.0 * g), ("tracking_pool", 9.0 * g))
    ]
    path = tmp_path / "dask.jsonl"
    path.write_text(
        json.dumps({"environment": env}) + "\n" + "".join(r.to_json() + "\n" for r in rows)
    )
    return path, env, rows


def test_a_run_file_reads_back_with_its_environment_and_renders_into_the_docs(tmp_path):
    path, env, rows = _run_file(tmp_path)
    assert M.read_rows(path) == (env, rows)
    report = load_script(ROOT / "tools" / "asv_report.py")
    meta, table = report.KINDS["dask-multi-gpu"](path, "data/dask/run.jsonl", {})
    assert meta["commit"] == env["commit"] and meta["gpu"] == env["gpu"]
    assert table.splitlines() == M.render(rows)
    assert "| 2 | sort | tracking_pool | 18.00 | 0.900 | 0.50 | 1.0 | 0 | ok |" in table


def test_the_chart_draws_each_operation_against_cuda_async(tmp_path):
    pytest.importorskip("matplotlib")
    path, _, rows = _run_file(tmp_path)
    png = tmp_path / "dask.png"
    M.chart(rows, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
