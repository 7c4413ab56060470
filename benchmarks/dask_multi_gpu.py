# SPDX-License-Identifier: Apache-2.0
"""Dask-cuDF on 1 to N GPUs, per chain: groupby-aggregate, merge (a full shuffle) and sort.

    python benchmarks/dask_multi_gpu.py [--gpus 1,2,4,8] [--chain NAME ...]
        [--rows-per-gpu N] [--out results.jsonl]

For each GPU count (those the machine has) and chain (``rmm_fences_bench.multi_gpu.CHAINS``): a
``LocalCUDACluster`` with one worker per GPU, the chain's resource on every worker (dask-cuda's
own ``rmm_async`` / ``rmm_pool_size``, or an rmm_fences chain installed by ``FencesPlugin``),
the tables made on the workers, then each operation persisted and timed. A result row per
(GPUs, chain, operation) goes to ``--out`` as JSON lines: seconds, the peak device memory of
each GPU above its idle use (NVML, sampled every 5 ms), what dask-cuda spilled, the tracker's
hazards, and the checks (sampled groups rebuilt on the host, the merge's rows and values, the
sort's order), after a first line ``{"environment": ...}`` (the commit, GPU, driver and
package versions of the run; ``--out`` is written anew). The markdown table
(``multi_gpu.render``) is printed last; tools/asv_report.py renders it and its chart
(``multi_gpu.chart``) into docs/dask.md from the file. Needs dask-cuda, dask-cudf,
distributed, cuDF, CuPy and pynvml.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tools")]

from asv_bodies import recorded_environment  # noqa: E402

from rmm_fences_bench import multi_gpu as M  # noqa: E402


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="dask_multi_gpu.py", description=__doc__.splitlines()[0])
    top.add_argument("--gpus", default="1,2,4,8", help="GPU counts (default 1,2,4,8)")
    top.add_argument("--chain", action="append", choices=list(M.CHAINS), help="repeat; all")
    top.add_argument("--rows-per-gpu", type=int, default=400_000_000, help="left table rows")
    top.add_argument("--partitions-per-gpu", type=int, default=8)
    top.add_argument("--shuffle", default="tasks", help="dask's shuffle method (tasks, p2p)")
    top.add_argument("--out", type=pathlib.Path, default=pathlib.Path("multi_gpu.jsonl"))
    return top


class PeakSampler:
    """The most device memory in use on each GPU above its use at start (NVML, every 5 ms)."""

    def __init__(self, devices):
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(d) for d in devices]
        self._base = [self._used(h) for h in self._handles]
        self.peak = list(self._base)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _used(self, handle):
        return self._nvml.nvmlDeviceGetMemoryInfo(handle).used

    def _run(self):
        while not self._stop.wait(0.005):
            for k, h in enumerate(self._handles):
                self.peak[k] = max(self.peak[k], self._used(h))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def peak_mib(self):
        return [(p - b) / 2**20 for p, b in zip(self.peak, self._base)]


def _left(part, rows_per_part, keys):
    import cudf
    import cupy

    start = part * rows_per_part
    return cudf.DataFrame(M.left_columns(cupy, start, start + rows_per_part, keys))


def _right(part, keys_per_part):
    import cudf
    import cupy

    start = part * keys_per_part
    return cudf.DataFrame(M.right_columns(cupy, start, start + keys_per_part))


def _spilled(dask_worker):
    """What dask-cuda moved off this worker's device: keys per tier, where it says."""
    data = dask_worker.data
    out = {}
    for tier in ("device", "host", "disk"):
        buf = getattr(data, tier, None)
        if buf is not None and hasattr(buf, "__len__"):
            out[tier] = len(buf)
    return out or None


def _meta(columns):
    """An empty cuDF frame with the dtypes of ``columns`` (arrays of one backend)."""
    import cudf

    return cudf.DataFrame({k: v[:0] for k, v in columns.items()})


def _bounds(s):
    """A one-row frame of the partition's (min, max, count) of the Series ``s``."""
    n = len(s)
    lo, hi = (float(s.min()), float(s.max())) if n else (0.0, 0.0)
    return type(s.to_frame())({"min": [lo], "max": [hi], "count": [n]})


def run_one(gpus, chain, args):
    """The three operations on ``gpus`` GPUs with ``chain``: a list of ``multi_gpu.Row``."""
    import cupy
    import dask
    import dask.dataframe as dd
    from dask_cuda import LocalCUDACluster
    from distributed import Client, wait

    from rmm_fences.dask import FencesPlugin, gather_stats

    import rmm_fences_bench.row_stack_alias  # noqa: F401  (numpy 2.5: before cuDF, here too)

    cluster_kwargs, spec = M.chain_setup(chain)
    devices = list(range(gpus))
    parts = gpus * args.partitions_per_gpu
    rows_per_part = args.rows_per_gpu // args.partitions_per_gpu
    rows = rows_per_part * parts
    keys_per_part = rows_per_part // 2
    keys = keys_per_part * parts
    out = []
    with (
        LocalCUDACluster(
            CUDA_VISIBLE_DEVICES=",".join(map(str, devices)),
            n_workers=gpus,
            preload=M.worker_preloads(),
            **cluster_kwargs,
        ) as cluster,
        Client(cluster) as client,
        dask.config.set({"dataframe.backend": "cudf", "dataframe.shuffle.method": args.shuffle}),
    ):
        if spec is not None:
            client.register_plugin(FencesPlugin(spec))
        left = dd.from_map(
            _left,
            range(parts),
            rows_per_part=rows_per_part,
            keys=keys,
            meta=_meta(M.left_columns(cupy, 0, 1, 1)),
        )
        right = dd.from_map(
            _right,
            range(parts),
            keys_per_part=keys_per_part,
            meta=_meta(M.right_columns(cupy, 0, 1)),
        )
        left, right = client.persist([left, right])
        wait([left, right])
        x_sum = float(left.x.sum().compute())
        ops = {
            "groupby": lambda: left.groupby("key").agg({"x": ["sum", "count"], "y": "sum"}),
            "merge": lambda: left.merge(right, on="key", how="inner"),
            "sort": lambda: left.sort_values("x"),
        }
        for name in M.OPERATIONS:
            with PeakSampler(devices) as sampler:
                start = time.perf_counter()
                frame = client.persist(ops[name]())
                wait(frame)
                seconds = time.perf_counter() - start
            problems = _check(name, frame, rows, keys, x_sum)
            hazards = None
            if chain == "tracking_pool":
                hazards = sum(
                    len(r.get("hazards", []))
                    for w in gather_stats(client).values()
                    for r in w["chain"]
                )
            out.append(
                M.Row(
                    gpus=gpus,
                    chain=chain,
                    operation=name,
                    seconds=seconds,
                    rows=rows,
                    peak_mib=sampler.peak_mib(),
                    spilled=client.run(_spilled),
                    hazards=hazards,
                    problems=problems,
                )
            )
            del frame
    return out


def _check(name, frame, rows, keys, x_sum):
    """The checks of one operation's result (``multi_gpu``'s formulas; host-side)."""
    problems = []
    if name == "groupby":
        sample = M.sample_keys(keys)
        wanted = sample.tolist()
        got = frame.map_partitions(lambda df: df[df.index.isin(wanted)]).compute().to_pandas()
        got = {
            int(k): (float(r[("x", "sum")]), int(r[("x", "count")]), int(r[("y", "sum")]))
            for k, r in got.iterrows()
        }
        problems += M.check_groups(got, M.expected_groups(sample, rows, keys))
    elif name == "merge":
        n = int(frame.shape[0].compute())
        if n != rows:
            problems.append(f"{n} rows, want {rows}")
        wrong = int(((frame.z - frame.key.astype("float64") * 0.5).abs() > 0).sum().compute())
        if wrong:
            problems.append(f"{wrong} rows with the wrong z")
    else:
        meta = {"min": "f8", "max": "f8", "count": "i8"}
        bounds = frame.x.map_partitions(_bounds, meta=meta).compute().to_pandas()
        b = [(float(r["min"]), float(r["max"]), int(r["count"])) for _, r in bounds.iterrows()]
        problems += M.check_sorted(b)
        n = sum(c for _, _, c in b)
        if n != rows:
            problems.append(f"{n} rows, want {rows}")
        s = float(frame.x.sum().compute())
        if abs(s - x_sum) > 1e-9 * abs(x_sum):
            problems.append(f"sum of x {s}, want {x_sum}")
    return problems


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    import cupy

    have = cupy.cuda.runtime.getDeviceCount()
    counts = sorted({int(g) for g in args.gpus.split(",") if 0 < int(g) <= have})
    if not counts:
        print(f"no GPU count of {args.gpus} fits the {have} GPUs here", file=sys.stderr)
        return 2
    rows = []
    with args.out.open("w") as out:
        print(json.dumps({"environment": recorded_environment()}), file=out, flush=True)
        for gpus in counts:
            for chain in args.chain or list(M.CHAINS):
                for row in run_one(gpus, chain, args):
                    print(row.to_json(), file=out, flush=True)
                    rows.append(row)
    print("\n".join(M.render(rows)))
    return 0 if all(not r.problems for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
