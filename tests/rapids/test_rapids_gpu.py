# SPDX-License-Identifier: Apache-2.0
"""RAPIDS dataframes on every chain: a cuDF pipeline, pylibcudf on four streams from four
threads, and Polars queries on the GPU engine (in-memory and streaming executors), each under
the pool, SyncOnFree deferred over rmm's pool and the tracker over the pool, compared with
pandas / Polars on the CPU (float64 references).

The chain is rmm's current device resource during each test (cuDF, pylibcudf and CuPy allocate
through it) and the Polars engine's ``memory_resource``. The tracker raises on a hazard; at the
end of each test it must have seen none. Needs cuDF, pylibcudf and cudf-polars: without them
the tests skip, naming the stack (RMM_FENCES_ALLOW_MISSING=cudf lets a GPU host run without it
pass; see tests/helpers/gate.py).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import rmm

from rmm_fences.specs import compose

from helpers.gate import optional_stack_missing

pytestmark = pytest.mark.gpu

#: The chains RAPIDS users are offered (docs/rapids.md).
CHAINS = {
    "pool": "pool(cuda_async)",
    "sof_deferred": "sync_on_free(rmm_pool(cuda, initial_pool_size=1GiB), mode=deferred)",
    "tracker": "tracking(pool(cuda_async), on_hazard=raise)",
}
ROWS = 1_000_003  # not a power of two: partial blocks everywhere
KEYS = 997


def _import(name):
    """``name`` imported, or the test skipped naming the optional stack it belongs to."""
    import importlib

    from helpers import numpy_row_stack  # noqa: F401  (before cuDF loads numba-cuda)

    try:
        return importlib.import_module(name)
    except ImportError as exc:
        pytest.skip(optional_stack_missing("cudf", f"{name}: {exc}"))


@pytest.fixture(params=sorted(CHAINS))
def chain(request):
    """The chain, installed as rmm's current device resource for the test; afterwards the
    previous resource is back and the tracker (if any) has seen no hazard."""
    mr = compose(CHAINS[request.param])
    previous = rmm.mr.get_current_device_resource()
    rmm.mr.set_current_device_resource(mr)
    try:
        yield mr
    finally:
        rmm.mr.set_current_device_resource(previous)
    if request.param == "tracker":
        mr.check()
        assert list(mr.hazards) == [], mr.hazards


def _frames(pd, seed=0):
    """A fact table (ROWS rows: integer keys, float64 values, strings, ids) and a dimension
    table over its keys, as pandas frames of real random data."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, KEYS, ROWS)
    words = np.array(["alpha", "Beta", "gamma", "DELTA", "epsilon", "zeta", "Eta", "theta"])
    fact = pd.DataFrame(
        {
            "id": np.arange(ROWS, dtype=np.int64),
            "key": keys.astype(np.int64),
            "x": rng.standard_normal(ROWS) * 1e3,
            "y": rng.uniform(-1.0, 1.0, ROWS),
            "s": words[rng.integers(0, len(words), ROWS)],
        }
    )
    dim = pd.DataFrame(
        {"key": np.arange(0, KEYS, 2, dtype=np.int64), "w": rng.uniform(1.0, 2.0, (KEYS + 1) // 2)}
    )
    return fact, dim


def _plain(frame):
    """``frame`` without its index, strings as Python objects (cuDF and pandas 3 name their
    string dtypes differently)."""
    text = [c for c in frame.columns if frame[c].dtype.kind not in "biuf"]
    return frame.reset_index(drop=True).astype({c: object for c in text})


def _assert_frame_close(got, expected):
    import pandas as pd

    pd.testing.assert_frame_equal(
        _plain(got),
        _plain(expected),
        check_dtype=False,
        check_index_type=False,
        check_column_type=False,
        rtol=1e-9,
        atol=1e-9,
    )


def test_cudf_pipeline_matches_pandas(chain, tmp_path):
    cudf = _import("cudf")
    import pandas as pd

    fact, dim = _frames(pd)
    gfact, gdim = cudf.from_pandas(fact), cudf.from_pandas(dim)

    # groupby-aggregate
    got = gfact.groupby("key").agg({"x": ["sum", "mean"], "y": "max"}).sort_index().to_pandas()
    expected = fact.groupby("key").agg({"x": ["sum", "mean"], "y": "max"}).sort_index()
    got.columns, expected.columns = (
        ["_".join(c) for c in got.columns],
        ["_".join(c) for c in expected.columns],
    )
    _assert_frame_close(got, expected)

    # merge (inner: half the keys), then a sort on two columns
    got = gfact.merge(gdim, on="key").sort_values(["key", "id"]).to_pandas()
    expected = fact.merge(dim, on="key").sort_values(["key", "id"])
    _assert_frame_close(got[expected.columns], expected)

    # strings: case, search, length
    upper = gfact["s"].str.upper()
    got = pd.DataFrame(
        {
            "u": upper.to_pandas(),
            "has_t": gfact["s"].str.contains("t").to_pandas(),
            "n": gfact["s"].str.len().to_pandas(),
        }
    )
    expected = pd.DataFrame(
        {"u": fact["s"].str.upper(), "has_t": fact["s"].str.contains("t"), "n": fact["s"].str.len()}
    )
    _assert_frame_close(got, expected)

    # window function: rolling mean over the ids' order
    got = gfact.sort_values("id")["x"].rolling(7).mean().to_pandas()
    expected = fact.sort_values("id")["x"].rolling(7).mean()
    np.testing.assert_allclose(
        got.to_numpy(dtype=np.float64, na_value=np.nan),
        expected.to_numpy(dtype=np.float64, na_value=np.nan),
        rtol=1e-9,
        atol=1e-9,
    )

    # parquet round trip
    path = tmp_path / "fact.parquet"
    gfact.to_parquet(path)
    back = cudf.read_parquet(path).sort_values("id").to_pandas()
    _assert_frame_close(back[fact.columns], fact)


def test_pylibcudf_on_four_streams_from_four_threads(chain):
    plc = _import("pylibcudf")
    from rmm.pylibrmm.stream import Stream

    threads, rounds = 4, 5
    results, errors = {}, []

    def work(t):
        try:
            stream = Stream()  # a new non-blocking stream per thread
            rng = np.random.default_rng(100 + t)
            for r in range(rounds):
                host = rng.standard_normal(2_000_003) * (t + 1)
                col = plc.Column.from_array(host, stream=stream)
                table = plc.sorting.sort(
                    plc.Table([col]),
                    [plc.types.Order.ASCENDING],
                    [plc.types.NullOrder.AFTER],
                    stream=stream,
                )
                total = plc.reduce.reduce(
                    col, plc.aggregation.sum(), plc.DataType(plc.TypeId.FLOAT64), stream=stream
                )
                scan = plc.reduce.scan(
                    col, plc.aggregation.sum(), plc.reduce.ScanType.INCLUSIVE, stream=stream
                )
                got_sorted = (
                    table.columns()[0].to_arrow(stream=stream).to_numpy(zero_copy_only=False)
                )
                got_scan = scan.to_arrow(stream=stream).to_numpy(zero_copy_only=False)
                got_total = total.to_py(stream=stream)
                stream.synchronize()
                results[t, r] = (host, got_sorted, got_scan, got_total)
        except Exception as exc:  # reported in the main thread
            errors.append((t, repr(exc)))

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    assert len(results) == threads * rounds
    for (t, r), (host, got_sorted, got_scan, got_total) in results.items():
        np.testing.assert_array_equal(got_sorted, np.sort(host), err_msg=f"thread {t} round {r}")
        np.testing.assert_allclose(got_scan, np.cumsum(host), rtol=1e-9, atol=1e-6)
        assert got_total == pytest.approx(float(np.sum(host, dtype=np.float64)), rel=1e-9, abs=1e-6)


def _polars_query(pl, fact, dim):
    return (
        fact.filter(pl.col("y") > -0.5)
        .join(dim, on="key")
        .with_columns((pl.col("x") * pl.col("w")).alias("xw"), pl.col("s").str.to_uppercase())
        .group_by("key", "s")
        .agg(pl.col("xw").sum(), pl.col("x").mean(), pl.len().alias("n"))
        .sort("key", "s")
    )


@pytest.mark.parametrize("executor", ["in-memory", "streaming"])
def test_polars_gpu_engine_matches_the_cpu(chain, executor):
    pl = _import("polars")
    _import("cudf_polars")
    import pandas as pd

    fact, dim = _frames(pd, seed=1)
    query = _polars_query(pl, pl.from_pandas(fact).lazy(), pl.from_pandas(dim).lazy())
    expected = query.collect()
    engine = pl.GPUEngine(memory_resource=chain, raise_on_fail=True, executor=executor)
    got = query.collect(engine=engine)
    from polars.testing import assert_frame_equal

    assert_frame_equal(got, expected, check_dtypes=False, rel_tol=1e-9, abs_tol=1e-9)
