# SPDX-License-Identifier: Apache-2.0
"""RAPIDS dataframes per chain: a cuDF pipeline at 10M and 100M rows, and the 22 PDS-H queries
(TPC-H derived, cudf-polars' own definitions) on the Polars GPU engine. Wall time of one run of
the pipeline or query after a warm-up run, and the peak device memory the chain held for it
(``rmm_fences_bench.FootprintMeter``: the CudaAsync leaf's memory pool, or a statistics adaptor
over the leaf), each chain against CudaAsync (cuDF's default) and rmm's pool.

The chain is rmm's current device resource while cuDF runs, and the Polars engine's
``memory_resource`` (in-memory executor). PDS-H reads parquet files made beforehand, one per
table, from the folder ``RMM_FENCES_PDSH_DATA`` names (default ``asv_bench/pdsh-data``)::

    tpchgen-cli parquet -s 10 --output-dir=asv_bench/pdsh-data

(``pip install tpchgen-cli``; scale factor 10 is about 3.5 GB). Without cuDF, cudf-polars, a GPU
or the data, every benchmark is skipped with the reason.
"""

from __future__ import annotations

import gc
import os
import pathlib
import types

from ._common import require_gpu

#: The chains, as specs before ``rmm_fences_bench.with_footprint`` puts the statistics adaptor
#: over their leaf; the pools start empty, so that their peak is what the work made them take.
SPECS = {
    "cuda_async": "cuda_async",
    "rmm_pool": "rmm_pool(cuda, initial_pool_size=0)",
    "rmm_fences_pool": "pool(cuda)",
    "rmm_fences_vmm_pool": "vmm_pool",
    "tracking_pool": "tracking(pool(cuda), on_hazard=record)",
    "sync_on_free_deferred": "sync_on_free(rmm_pool(cuda, initial_pool_size=0), mode=deferred)",
}
ROWS = [10_000_000, 100_000_000]
KEYS = 100_003
WORDS = ["alpha", "Beta", "gamma", "DELTA", "epsilon", "zeta", "Eta", "theta"]


def pdsh_data() -> pathlib.Path:
    """The folder of the PDS-H parquet files: ``RMM_FENCES_PDSH_DATA``, by default
    asv_bench/pdsh-data."""
    default = pathlib.Path(__file__).resolve().parents[1] / "pdsh-data"
    return pathlib.Path(os.environ.get("RMM_FENCES_PDSH_DATA", default))


DATA = pdsh_data()


def missing_pdsh_data(data) -> str | None:
    """Why the folder ``data`` holds no PDS-H data, or None when it does."""
    if (data / "lineitem.parquet").is_file():
        return None
    return f"no PDS-H data in {data}: make it with tpchgen-cli (see this module's docstring)"


QUERIES = list(range(1, 23))


def _rapids(*names):
    """The modules, or NotImplementedError (asv skips) naming what is missing."""
    import importlib

    import numpy as np

    if not hasattr(np, "row_stack"):  # numba-cuda <= 0.30.4 registers it; gone in numpy 2.5
        np.row_stack = np.vstack
    try:
        return [importlib.import_module(n) for n in names]
    except ImportError as exc:
        raise NotImplementedError(f"needs cuDF and cudf-polars: {exc}") from None


def _chain(name):
    from rmm_fences.specs import compose

    from rmm_fences_bench import FootprintMeter, with_footprint

    mr = compose(with_footprint(SPECS[name]))
    return mr, FootprintMeter(mr)


def cudf_tables(rows):
    """The pipeline's tables, made on the GPU: a fact table of ``rows`` rows (an id, a key of
    ``KEYS`` values, two float columns, a string column of ``WORDS``) and a dimension table of
    every other key."""
    (cudf,) = _rapids("cudf")
    import cupy

    rng = cupy.random.default_rng(0)
    keys = rng.integers(0, KEYS, rows, dtype=cupy.int64)
    return {
        "fact": cudf.DataFrame(
            {
                "id": cupy.arange(rows, dtype=cupy.int64),
                "key": keys,
                "x": rng.standard_normal(rows) * 1e3,
                "y": rng.uniform(-1.0, 1.0, rows),
                "s": cudf.Series(WORDS)
                .take(rng.integers(0, len(WORDS), rows))
                .reset_index(drop=True),
            }
        ),
        "dim": cudf.DataFrame(
            {
                "key": cupy.arange(0, KEYS, 2, dtype=cupy.int64),
                "w": rng.uniform(1.0, 2.0, (KEYS + 1) // 2),
            }
        ),
    }


def cudf_pipeline(tables):
    """groupby-aggregate, merge with the dimension table, a two-column sort, string case and
    search, a rolling mean: (groups, joined rows, rows with a "T", the rolling means' sum)."""
    fact, dim = tables["fact"], tables["dim"]
    agg = fact.groupby("key").agg({"x": ["sum", "mean"], "y": "max"})
    joined = fact.merge(dim, on="key").sort_values(["key", "id"])
    upper = fact["s"].str.upper()
    found = upper.str.contains("T").sum()
    rolled = fact["x"].rolling(7).mean()
    return len(agg), len(joined), int(found), float(rolled.sum())


def pdsh_frame(query, data=DATA):
    """The PDS-H query ``query`` (cudf-polars' ``PDSHQueries``) over the parquet files in
    ``data``, as a Polars LazyFrame; NotImplementedError (asv skips) naming what is missing."""
    pl, _ = _rapids("polars", "cudf_polars")
    try:
        from cudf_polars.streaming.benchmarks.pdsh import PDSHQueries
    except ImportError as exc:
        raise NotImplementedError(f"cudf-polars without its PDS-H queries: {exc}") from None
    missing = missing_pdsh_data(data)
    if missing:
        raise NotImplementedError(missing)
    suppliers = pl.scan_parquet(data / "supplier.parquet").select(pl.len()).collect().item()
    run_config = types.SimpleNamespace(
        dataset_path=str(data), suffix=".parquet", scale_factor=suppliers / 10_000
    )
    return getattr(PDSHQueries, f"q{query}")(run_config).frame


class _OnChain:
    """Installs the chain as rmm's current device resource for the benchmark's process; one
    run per sample (each runs for seconds)."""

    timeout = 1200
    number = 1
    repeat = (3, 5, 120.0)

    def _install(self, chain):
        import rmm

        self.mr, self.meter = _chain(chain)
        self.previous = rmm.mr.get_current_device_resource()
        rmm.mr.set_current_device_resource(self.mr)

    def _measured(self, run):
        """Runs ``run()`` once (the warm-up) under the footprint meter: its peak."""
        import cupy

        self.meter.start()
        run()
        cupy.cuda.Device().synchronize()
        self.peak = self.meter.peak()

    def teardown(self, *args):
        import rmm

        self.__dict__.pop("data", None)
        gc.collect()
        if getattr(self, "previous", None) is not None:
            rmm.mr.set_current_device_resource(self.previous)


class CudfPipeline(_OnChain):
    """groupby-aggregate, merge with a dimension table, a two-column sort, string case and
    search, a rolling mean: one pipeline over ``rows`` rows of random data made on the GPU."""

    params = [ROWS, list(SPECS)]
    param_names = ["rows", "chain"]

    def setup(self, rows, chain):
        require_gpu()
        _rapids("cudf")
        self._install(chain)
        self.data = cudf_tables(rows)
        self._measured(self._pipeline)

    def _pipeline(self):
        return cudf_pipeline(self.data)

    def time_pipeline(self, rows, chain):
        import cupy

        self._pipeline()
        cupy.cuda.Device().synchronize()

    def track_peak_mib(self, rows, chain):
        return None if self.peak is None else self.peak / 2**20

    track_peak_mib.unit = "MiB"


class PdsH(_OnChain):
    """The PDS-H query ``query`` (cudf-polars' ``PDSHQueries``) on the Polars GPU engine
    (in-memory executor) with the chain as its memory resource."""

    params = [QUERIES, list(SPECS)]
    param_names = ["query", "chain"]

    def setup(self, query, chain):
        require_gpu()
        pl, _ = _rapids("polars", "cudf_polars")
        frame = pdsh_frame(query)
        self._install(chain)
        self.frame = frame
        self.engine = pl.GPUEngine(
            memory_resource=self.mr, executor="in-memory", raise_on_fail=True
        )
        self._measured(self._query)

    def _query(self):
        return self.frame.collect(engine=self.engine)

    def time_query(self, query, chain):
        self._query()

    def track_peak_mib(self, query, chain):
        return None if self.peak is None else self.peak / 2**20

    track_peak_mib.unit = "MiB"
