# SPDX-License-Identifier: Apache-2.0
"""The replay's asv benchmarks (asv_bench/benchmarks/replay.py) and the trace recorder
(tools/record_traces.py) without a GPU: what can run here (imports, trace discovery, chain
specs, cutting and compressing an rmm log) does."""

import gzip
import importlib
import io
import json
import subprocess
import sys

import pytest

from rmm_fences.specs import parse_spec

from helpers.paths import DOCS_DATA, TOOLS
from helpers.rmm_log import RMM_LOG
from helpers.scripts import load_script
from rmm_fences_bench import Trace, read_allocation_log, with_footprint, write_allocation_log


def asv_module(name):
    """A module of asv_bench/benchmarks: the package ``benchmarks``, as asv imports it."""
    return importlib.import_module(f"benchmarks.{name}")


def recorder():
    return load_script(TOOLS / "record_traces.py")


def test_asv_replay_finds_traces_or_none(tmp_path):
    replay = asv_module("replay")
    assert replay.trace_names(tmp_path) == [replay.NO_TRACE]
    t = read_allocation_log(io.StringIO(RMM_LOG))
    write_allocation_log(t, tmp_path / "b.csv.gz")
    write_allocation_log(t, tmp_path / "a.csv.gz")
    (tmp_path / "notes.json").write_text("{}")
    assert replay.trace_names(tmp_path) == ["a", "b"]
    assert replay.Replay.params[0] == replay.trace_names()
    assert replay.Replay.param_names == ["trace", "chain"]


def test_asv_replay_chains_measure_their_footprint_at_the_leaf():
    replay = asv_module("replay")
    assert replay.CHAINS == [
        "rmm_fences_pool",
        "rmm_fences_vmm_pool",
        "rmm_fences_vmm_pool_unbounded",
        "rmm_pool",
        "cuda_async",
        "arena",
        "sync_on_free_deferred",
        "tracking_pool",
        "binning",
    ]
    t = Trace.from_events([(0, "allocate", 0, 300 << 20, 0)])
    size = replay.arena_size(t)
    assert size == 1 << 30  # a power of two, at least twice the peak
    assert replay.arena_size(Trace.from_events([(0, "allocate", 0, 8, 0)])) == 256 << 20
    for name, spec in replay.SPECS.items():
        measured = with_footprint(spec.format(arena_size=size))
        tree = parse_spec(measured)
        while tree.inner is not None and tree.inner.inner is not None:
            tree = tree.inner
        # the layer the replay reads: a statistics adaptor over the leaf, or a cuda_async or
        # vmm_pool leaf
        assert tree.name in ("statistics", "cuda_async", "vmm_pool"), (name, measured)


def test_asv_replay_skips_without_gpu_or_trace():
    replay = asv_module("replay")
    bench = replay.Replay()
    with pytest.raises(NotImplementedError):
        bench.setup(replay.NO_TRACE, "rmm_pool")


def test_recorder_lists_its_workloads(capsys):
    rec = recorder()
    assert rec.main(["--list"]) == 0
    listed = capsys.readouterr().out
    for name in (
        "reduce_1m",
        "reduce_256m",
        "dask_4gib",
        "cupy_pipeline",
        "torch_gpt2_small",
        "torch_resnet50",
        "cudf_pipeline_10m",
        "pdsh_sf10",
    ):
        assert name in listed and name in rec.WORKLOADS
    with pytest.raises(SystemExit):
        rec.main(["no_such_workload"])


def test_recorder_skips_a_dataframe_workload_naming_what_is_missing(tmp_path, monkeypatch):
    """Without cuDF (CI) the dataframe workloads are skipped with the reason, before any
    process starts; with cuDF and cudf-polars but no PDS-H data, the reason names the folder
    and how to make it."""
    rec = recorder()
    monkeypatch.setattr(rec, "_has", lambda module: module not in ("cudf", "cudf_polars"))
    assert rec._missing("cudf_pipeline_10m") == "cuDF is not installed"
    assert rec._missing("pdsh_sf10") == "cuDF is not installed"
    assert rec._missing("reduce_1m") is None
    monkeypatch.setattr(rec, "_has", lambda module: True)
    monkeypatch.setenv("RMM_FENCES_PDSH_DATA", str(tmp_path))
    assert f"no PDS-H data in {tmp_path}" in rec._missing("pdsh_sf10")
    assert rec._missing("cudf_pipeline_10m") is None
    (tmp_path / "lineitem.parquet").touch()
    assert rec._missing("pdsh_sf10") is None


def test_recorder_cuts_and_compresses_an_rmm_log(tmp_path):
    rec = recorder()
    src = tmp_path / "log.dev0.csv"
    src.write_text(RMM_LOG + "\n")
    whole = rec.cut_and_compress(str(src), tmp_path / "all.csv.gz", 100)
    assert whole == {"events_recorded": 7, "events_kept": 7, "cut": False}
    assert gzip.decompress((tmp_path / "all.csv.gz").read_bytes()).decode() == RMM_LOG
    ref = read_allocation_log(io.StringIO(RMM_LOG))
    back = read_allocation_log(tmp_path / "all.csv.gz")
    assert back.id.tolist() == ref.id.tolist() and back.failed_allocations == 1
    cut = rec.cut_and_compress(str(src), tmp_path / "cut.csv.gz", 3)
    assert cut == {"events_recorded": 7, "events_kept": 3, "cut": True}
    t = read_allocation_log(tmp_path / "cut.csv.gz")
    assert t.allocations == 2 and t.frees == 0 and t.failed_allocations == 1
    # the same log, the same bytes (no time stamp in the gzip header)
    rec.cut_and_compress(str(src), tmp_path / "again.csv.gz", 3)
    assert (tmp_path / "again.csv.gz").read_bytes() == (tmp_path / "cut.csv.gz").read_bytes()
    src.write_text("Thread,Time,Action\n1,2,3\n")
    with pytest.raises(ValueError, match="header"):
        rec.cut_and_compress(str(src), tmp_path / "bad.csv.gz", 3)


def asv_bodies():
    return load_script(TOOLS / "asv_bodies.py")


def test_only_the_replay_table_has_a_chart(tmp_path):
    data = DOCS_DATA / "bench" / "streams_2026-12-05.jsonl"
    with pytest.raises(SystemExit):
        asv_bodies().main(["table", "streams", str(data), "--png", str(tmp_path / "x.png")])
    assert not (tmp_path / "x.png").exists()


def test_dataframe_table_gives_each_chain_over_cudaasync_and_the_pdsh_summary(tmp_path):
    rows = []
    chains = ["cuda_async", "rmm_pool", "rmm_fences_pool", "sync_on_free_deferred"]
    for q, scale in ((1, 1.0), (2, 2.0), (3, 4.0)):
        for i, c in enumerate(chains):
            t = scale * (1.0 + 0.1 * i)  # rmm_pool 1.1x, pool 1.2x, sync_on_free 1.3x
            rows.append({"bench": "PdsH", "param": q, "chain": c, "seconds": t, "peak_mib": 100})
    rows.append({"bench": "PdsH", "param": 4, "chain": "rmm_pool", "skipped": "no data"})
    path = tmp_path / "df.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    table = asv_bodies().table_dataframes(path)
    assert "| PDS-H q2 | 2.000 | 100 | 1.100x, 1.00x | 1.200x, 1.00x | 1.300x, 1.00x |" in table
    assert "q4" not in table  # skipped rows are left out
    # sync_on_free over CudaAsync 1.3x; over rmm's pool 1.3 / 1.1
    assert "| sync_on_free_deferred | 1.300x | 1.300x | 1.182x | 1.182x |" in table


def test_ab_summary_gives_the_median_ratio_and_quartiles_per_measurement():
    ab = load_script(TOOLS / "ab_builds.py")
    pair = {"pair": "pool(cuda_async)", "nbytes": 1 << 20}
    rows = [{"round": r, **pair, "a": 100.0, "b": 100.0 + 2 * r} for r in range(5)]
    replay = {"replay": "reduce_1m", "chain": "rmm_fences_pool"}
    rows += [{"round": 0, **replay, "a": 2e6, "b": 1e6}]
    rows += [{"round": 0, **replay, "kept_streams": True, "a": 2e6, "b": 2.2e6}]
    lines = ab.summary(rows)
    assert "| reduce_1m | replay calls/s, streams kept | 1.100 | 1.100-1.100 | 1 |" in lines
    assert "| pool(cuda_async) | 1 MiB pair ns | 1.040 | 1.020-1.060 | 5 |" in lines
    assert "| reduce_1m | replay calls/s | 0.500 | 0.500-0.500 | 1 |" in lines


def test_dataframes_resume_leaves_out_the_cases_an_interrupted_run_wrote(tmp_path, capsys):
    """run dataframes --resume FILE: the cases FILE holds are not run again, and the
    environment line is not written twice; --rounds must be positive."""
    bodies = asv_bodies()
    done = [{"bench": "CudfPipeline", "param": 10_000_000, "chain": "cuda_async", "seconds": 1}]
    path = tmp_path / "df.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [{"environment": {}}, *done]) + "\n")
    assert bodies.main(["run", "dataframes", "--resume", str(path)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert not any("environment" in r for r in rows)
    cases = {(r["bench"], r["param"], r["chain"]) for r in rows}
    assert ("CudfPipeline", 10_000_000, "cuda_async") not in cases
    assert ("CudfPipeline", 10_000_000, "rmm_pool") in cases and ("PdsH", 22, "cuda_async") in cases
    assert len(cases) == len(rows) == 24 * 6 - 1  # (2 sizes + 22 queries) x 6 chains, less one
    with pytest.raises(SystemExit):
        bodies.main(["run", "dataframes", "--rounds", "0"])
    assert "--rounds 0" in capsys.readouterr().err


def test_native_tables_give_ratios_and_where_the_pool_pair_goes(tmp_path):
    """table native: the pair per chain and size over rmm's pool and CudaAsync; what the
    deferred fence and the tracker add over each upstream; the CUDA calls; the pool's pair less
    its two stream lookups' calls (cuStreamIsCapturing + cuStreamGetId, twice); the plan loop."""
    rows = [{"environment": {}}]
    for chain, ns in (("rmm_fences_pool", 100.0), ("rmm_pool", 4000.0), ("cuda_async", 1000.0)):
        rows.append(
            {"bench": "AllocFree", "chain": chain, "nbytes": 1 << 20, "native_ns": ns,
             "python_us": ns / 100}
        )  # fmt: skip
    rows += [
        {"bench": "AllocFree", "chain": "cuda", "nbytes": 256, "skipped": "needs a CUDA GPU"},
        {"bench": "DeferredFence", "upstream": "rmm_pool", "ns": 250.0},  # older rows: 1 MiB
        {"bench": "DeferredFence", "upstream": "cuda_async", "nbytes": 64 << 20, "ns": 120.0},
        {"bench": "TrackingOverhead", "upstream": "rmm_fences_pool", "native_ratio": 1.5,
         "python_ratio": 1.2},
        {"bench": "FenceCalls", "ns": {"cu_stream_is_capturing": 10.0, "cu_stream_get_id": 15.0,
                                       "relaxed_capture_scope": 5.0, "cu_event_record": 40.0,
                                       "event_query": 0}},
        {"bench": "AllocFree", "chain": "sync_on_free_deferred", "nbytes": 64 << 20,
         "native_ns": 150.0, "python_us": 1.5},
        {"bench": "CorePairs", "core": "pool", "nbytes": 1 << 20, "ns": 20.0,
         "fences_per_pair": 0.0},
        {"bench": "CorePairs", "core": "sync_on_free", "nbytes": 64 << 20, "ns": 60.0,
         "fences_per_pair": 1.0},
        {"bench": "CubTempStoragePlanLoop", "chain": "rmm_fences_pool", "n": 1 << 20,
         "ratio": 1.04, "floor_us": 12.0},
        {"bench": "CubTempStoragePlanLoop", "chain": "preallocated", "n": 1 << 20,
         "ratio": 1.01, "floor_us": 13.0},
        {"bench": "PageCalls", "ns": {"page": 2097152.0, "create": 3000.0, "map": 2000.0,
                                      "set_access": 50000.0, "unmap": 8000.0, "release": 1000.0}},
    ]  # fmt: skip
    path = tmp_path / "native.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    bodies = asv_bodies()
    pairs = bodies.table_native(path, "pairs")
    assert "| `rmm_fences_pool` | 100.0 (0.03x / 0.10x) |" in pairs
    assert "| `cuda_async` | 1000.0 (0.25x / 1x) |" in pairs
    assert "cuda`" not in pairs.replace("cuda_async", "")  # skipped rows are left out
    assert "| `rmm_fences_pool` | 1.00 (0.03x / 0.10x) |" in bodies.table_native(path, "python")
    over = bodies.table_native(path, "over")
    assert "| `rmm_pool` | - | 250.0 | - | - | - |" in over
    assert "| `cuda_async` | - | - | 120.0 | - | - |" in over
    assert "| `rmm_fences_pool` | - | - | - | 1.50x | 1.20x |" in over
    calls = bodies.table_native(path, "calls")
    assert "| `cu_stream_get_id` | 15.0 |" in calls and "event_query" not in calls
    floor = bodies.table_native(path, "floor")
    # the pool: lookups 2 x (10 + 15), no record, the core alone 20
    assert "| `rmm_fences_pool` | 1 MiB | 100.0 | 50.0 | 0.00 | 20.0 |" in floor
    # SyncOnFree: lookups 2 x 10 + 15, one record (40) per pair, the core alone 60
    assert "| `sync_on_free_deferred` | 64 MiB | 150.0 | 35.0 | 40.0 | 60.0 |" in floor
    plan = bodies.table_native(path, "plan")
    assert "| `rmm_fences_pool` | 1.040x |" in plan and "| `preallocated` | 1.010x |" in plan
    # the bare call's time: the median over the rounds of every chain at that size
    assert plan.endswith("| the preallocated call itself, us | 12.5 |")
    pages = bodies.table_native(path, "pages")
    assert "| `cuMemUnmap` | 8000.0 |" in pages
    assert "| a page of 2 MiB moved (unmap + map) | 10000.0 |" in pages
    assert bodies.table_native(path).count("|---|") == len(bodies.NATIVE_PARTS)


def test_run_native_runs_every_case_of_its_bodies(capsys):
    """run native: the environment line, then a row per case of the bodies it runs (the bodies
    themselves stubbed out: on a GPU they would run for minutes)."""
    bodies = asv_bodies()
    cases = []

    def run_body(bench, args, row, out, measure):
        cases.append((type(bench).__name__, args))
        print(json.dumps(row), file=out)

    bodies._run_body = run_body
    assert bodies.main(["run", "native"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert "environment" in rows[0]
    assert len(rows) - 1 == len(cases) == 7 * 3 + 2 * 3 + 5 + 1 + 1 + 3 * 3 + 8 * 4
    assert {name for name, _ in cases} == {
        "AllocFree", "DeferredFence", "TrackingOverhead", "FenceCalls", "PageCalls",
        "CorePairs", "CubTempStoragePlanLoop",
    }  # fmt: skip
    assert ("CorePairs", ("sync_on_free", 64 << 20)) in cases
    assert ("DeferredFence", ("rmm_pool", 64 << 20)) in cases
    assert ("AllocFree", ("rmm_fences_pool", 1 << 20)) in cases
    assert ("CubTempStoragePlanLoop", ("rmm_fences_pool", 1 << 20)) in cases
    assert ("CubTempStoragePlanLoop", ("preallocated", 1 << 20)) in cases


def test_run_native_times_the_policy_cores_through_its_own_runner(capsys):
    """run native's CorePairs rows through the runner itself (no stub), on the CPU: asv's
    bodies are set up first, so a benchmark class without ``setup`` would stop the run."""
    bodies = asv_bodies()
    from benchmarks import alloc_free as A

    row = {"bench": "CorePairs", "core": "pool", "nbytes": 256}
    bodies._run_body(A.CorePairs(), ("pool", 256), row, sys.stdout, lambda b, c, n: b.measure(c, n))
    out = json.loads(capsys.readouterr().out)
    assert out["ns"] > 0 and out["fences_per_pair"] == 0


def test_asv_report_renders_one_native_part_or_names_the_valid_ones(tmp_path):
    path = tmp_path / "native.jsonl"
    rows = [
        {"environment": {"commit": "c"}},
        {"bench": "FenceCalls", "ns": {"cu_stream_get_id": 9.0}},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    report = load_script(TOOLS / "asv_report.py")
    _, body = report.render_native(path, "native.jsonl", {"part": "calls"})
    assert body == "| CUDA call | ns |\n|---|---:|\n| `cu_stream_get_id` | 9.00 |"
    with pytest.raises(ValueError, match="part=pair: expected one of pairs, python"):
        report.render_native(path, "native.jsonl", {"part": "pair"})


def test_asv_deferred_fence_table_takes_results_with_and_without_a_size():
    """asv results of DeferredFence by (upstream, nbytes) give a column per size; older ones
    (by upstream alone, of 1 MiB) still render, one value per upstream."""
    build = load_script(TOOLS / "asv_report.py").ASV_TABLES["asv-deferred-fence"][1]
    sized = build({("rmm_pool", "1048576"): -3000.0, ("rmm_pool", "67108864"): 240.0})
    assert "| 1 MiB | 64 MiB |" in sized and "| `rmm_pool` | -3000.00 | 240.0 |" in sized
    assert "| `cuda_async` | -585.36 |" in build({("cuda_async",): -585.36})


def test_replay_table_shows_a_footprint_that_grew_in_the_timed_replays(tmp_path):
    """A chain that held more by the end of the timed replays than in the ordered one gets
    "-> N MiB" in the per-chain table; one that did not (or a run without the figure) does not."""
    rows = [{"environment": {}}]
    for chain, after in (
        ("rmm_fences_pool", 100.0),
        ("rmm_pool", None),
        ("cuda_async", 150.4),
        ("rmm_fences_vmm_pool", 130.0),
    ):
        rows.append(
            {"trace": "t", "chain": chain, "alloc_per_s": 1e6, "footprint_mib": 100.0,
             "footprint_after_mib": after, "trace_peak_live": 90 << 20, "errors": 0}
        )  # fmt: skip
    path = tmp_path / "replay.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    table = asv_bodies().table_replay(path)
    assert "| t | 1.00 M, 100 MiB | 1.00 M, 100 MiB | 1.00 M, 100 MiB -> 150 MiB " in table
    assert "| 1.00 M, 100 MiB -> 130 MiB |" in table


def test_replay_rounds_give_medians_and_ratios_taken_within_each_round(tmp_path):
    """A run of several rounds: calls/s is each chain's median over the rounds, a ratio the
    median of the ratios taken within each round (here 2x, 2x and 1x: 2x, where the ratio of
    the medians would be 1.5x), and a third table gives the ratios the targets name with their
    range. One round: no third table, and the ratios are the plain ones."""
    rates = {  # chain -> calls/s per round
        "rmm_fences_pool": (4e6, 2e6, 3e6),
        "rmm_pool": (1e6, 1e6, 1e6),
        "cuda_async": (2e6, 1e6, 3e6),
        "tracking_pool": (3e6, 1e6, 2e6),
        "sync_on_free_deferred": (0.9e6, 1e6, 1.1e6),
    }
    rows = [{"environment": {}}]
    for k in range(3):
        for chain, r in rates.items():
            rows.append(
                {"trace": "t", "chain": chain, "round": k, "alloc_per_s": r[k],
                 "footprint_mib": 100.0, "footprint_after_mib": 100.0 + k,
                 "trace_peak_live": 90 << 20, "errors": 0}
            )  # fmt: skip
    path = tmp_path / "replay.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    table = asv_bodies().table_replay(path)
    # the pool: median 3 M; over rmm's pool 3x (ratios 4, 2, 3); over CudaAsync 2x (2, 2, 1)
    assert "| t | 90 | 3.00 M | 3.0x | 2.0x |" in table
    assert "| 3.00 M, 100 MiB -> 102 MiB |" in table  # the largest after-footprint
    assert "| trace (3 rounds) | rmm_fences pool / CudaAsync | tracker / rmm_fences pool " in table
    # tracker / pool: 0.75, 0.5, 0.67; SyncOnFree / rmm's pool: 0.9, 1.0, 1.1
    assert "| t | 2.00x (1.00-2.00) | 0.67x (0.50-0.75) | 1.00x (0.90-1.10) |" in table
    one = tmp_path / "one.jsonl"
    one.write_text("\n".join(json.dumps(r) for r in rows if r.get("round", 0) == 0))
    single = asv_bodies().table_replay(one)
    assert "rounds)" not in single and "| t | 90 | 4.00 M | 4.0x | 2.0x |" in single


def test_rounds_are_refused_where_a_run_has_none():
    run = subprocess.run(
        [sys.executable, str(TOOLS / "asv_bodies.py"), "run", "streams", "--rounds", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "--rounds: only for dataframes and replay" in run.stderr


class _FakeCupy:
    """numpy standing in for the CuPy calls of the recorder's cupy_mixed (no GPU here)."""

    def __init__(self):
        import types

        import numpy as np

        self.np = np
        self.sizes = []
        fake = self

        class Stream:
            def __init__(self, non_blocking=False):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def synchronize(self):
                pass

        class RandomState:
            def __init__(self, seed):
                self.rs, self.stream = np.random.RandomState(seed), seed % 1000

            def standard_normal(self, n, dtype):
                fake.sizes.append((self.stream, n))
                return self.rs.standard_normal(n).astype(dtype)

        self.cuda = types.SimpleNamespace(Stream=Stream)
        self.random = types.SimpleNamespace(RandomState=RandomState)
        self.float32, self.float64 = np.float32, np.float64
        for name in ("sort", "cumsum", "exp", "sin", "isfinite"):
            setattr(self, name, getattr(np, name))
        self.asnumpy = np.asarray


def test_recorder_cupy_mixed_interleaves_every_size_and_lifetime(monkeypatch):
    """The mixed workload's schedule, with numpy standing in for CuPy and its sizes scaled
    down: every size on every stream, and each block's sum checked once as it is freed (a sum
    made wrong is caught)."""
    rec = recorder()
    fake = _FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(rec, "MIXED_SIZES", [1 << k for k in range(2, 11)])  # 16 B to 4 KiB
    checked = []
    real_check = rec._check_close
    monkeypatch.setattr(
        rec, "_check_close", lambda g, r, w: checked.append(w) or real_check(g, r, w)
    )
    info = rec.cupy_mixed(rounds=24, streams=4)
    assert info["streams"] == 4 and len(fake.sizes) == 96
    for k in range(4):  # every size on every stream
        assert sorted({n for s, n in fake.sizes if s == k}) == rec.MIXED_SIZES
    assert len(checked) == 96  # every block checked once, freed early or at the end
    monkeypatch.setattr(fake, "cumsum", lambda x, dtype: fake.np.cumsum(x, dtype=dtype) + 1.0)
    with pytest.raises(AssertionError, match="cumulative sum"):
        rec.cupy_mixed(rounds=2, streams=1)


def test_the_commit_a_run_records_can_be_given(monkeypatch):
    """A copy of the checkout whose git metadata lags its files (a device's) names its commit
    through RMM_FENCES_COMMIT, as the downstream harness does."""
    bodies = asv_bodies()
    monkeypatch.setenv("RMM_FENCES_COMMIT", "abc123 (given)")
    assert bodies.checkout_commit() == "abc123 (given)"
    monkeypatch.delenv("RMM_FENCES_COMMIT")
    assert bodies.checkout_commit() != "abc123 (given)"
