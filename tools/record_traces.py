# SPDX-License-Identifier: Apache-2.0
"""Record rmm allocation logs of real workloads for the replay benchmarks
(asv_bench/benchmarks/replay.py). On a GPU host, not in CI.

    python tools/record_traces.py                      # every workload
    python tools/record_traces.py reduce_1m cupy_pipeline --max-events 20000
    python tools/record_traces.py --list

Each workload runs in a fresh process with rmm's ``LoggingResourceAdaptor`` over ``--upstream``
(a compose spec, default ``cuda_async``) installed as the current device resource, CuPy's
allocator set to rmm's (``rmm.allocators.cupy.rmm_cupy_allocator``) and, for the PyTorch
workloads, PyTorch's to ``rmm.allocators.torch.rmm_torch_allocator``: every device allocation of
the workload goes through the log. The Dask workload on a dask-cuda cluster installs the same in
its worker. The log as rmm wrote it, cut after its first ``--max-events`` events, is written
gzip-compressed to ``--out`` (default asv_bench/traces/) as ``<workload>.csv.gz``, with
``<workload>.json`` (what was recorded, where, whether the log was cut, ``Trace.stats()``), and
read back with ``rmm_fences_bench.read_allocation_log``, which must accept it.

Workloads (``--list``): the CUB temp-storage loop (``rmm_fences.reduce.device_sum``) on 1M and
256M float32 elements, the 4 GiB Dask reduction of tests/dask/test_dask_gpu.py (on a dask-cuda
cluster, or Dask's threaded scheduler over CuPy chunks), a CuPy pipeline on two streams (sort,
reductions, scans, FFT, elementwise, mixed sizes), CuPy on four streams with sizes from 256 B
to 1 GiB and short- and long-lived blocks interleaved, a few training steps of the
GPT-2-small-shaped and ResNet-50-shaped models of asv_bench/benchmarks/_torch_workloads.py
(skipped without PyTorch), and the dataframe benchmark's cuDF pipeline at 10M rows and its 22
PDS-H queries on the Polars GPU engine (asv_bench/benchmarks/dataframes.py; skipped without
cuDF and cudf-polars, PDS-H without its data).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
TRACES = ROOT / "asv_bench" / "traces"
HEADER = "Thread,Time,Action,Pointer,Size,Stream"

sys.path.insert(0, str(ROOT / "asv_bench" / "benchmarks"))
import _torch_workloads as workloads  # noqa: E402 (stdlib only at import; torch loads lazily)

# the benchmarks' library, for the log reader (never installed: benchmarks/, built in place)
sys.path.insert(0, str(ROOT / "benchmarks"))


def _check_close(got: float, ref: float, what: str) -> None:
    if abs(got - ref) > 1e-3 * abs(ref) + 1e-2:
        raise AssertionError(f"{what}: got {got}, float64 reference {ref}")


def reduce_loop(n: int, iterations: int) -> dict:
    """``iterations`` calls of the CUB temp-storage loop on ``n`` float32 elements, on one
    non-blocking stream: the input, the outputs and every call's temp storage come from the
    current device resource."""
    import cupy

    from rmm_fences.reduce import device_sum

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        x = cupy.random.RandomState(0).standard_normal(n, dtype=cupy.float32)
        out = cupy.empty(iterations, dtype=cupy.float32)
    for i in range(iterations):
        device_sum(x, out[i : i + 1], stream=stream)
    stream.synchronize()
    ref = float(x.astype(cupy.float64).sum())
    _check_close(float(out[-1]), ref, "the CUB reduce loop")
    return {"n": n, "iterations": iterations}


def _dask_values(cupy, da, n, chunks):
    return da.arange(n, chunks=chunks, dtype="float64").map_blocks(cupy.asarray) % 1_000_003


def _dask_expected(n: int) -> float:
    period = 1_000_003
    full, rest = divmod(n, period)
    return full * period * (period - 1) / 2 + rest * (rest - 1) / 2


def _install_worker_log(path, upstream, dask_worker=None):
    """In a dask worker: the logging adaptor as its current device resource, CuPy through rmm."""
    import cupy
    import rmm
    from rmm.allocators.cupy import rmm_cupy_allocator

    from rmm_fences.specs import compose

    log = rmm.mr.LoggingResourceAdaptor(compose(upstream), log_file_name=path)
    rmm.mr.set_current_device_resource(log)
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    dask_worker.rmm_fences_trace_log = log
    return log.get_file_name()


def _flush_worker_log(dask_worker=None):
    dask_worker.rmm_fences_trace_log.flush()
    return dask_worker.rmm_fences_trace_log.get_file_name()


def dask_reduction(log_path: str, upstream: str, mode: str) -> dict:
    """The 4 GiB float64 reduction of tests/dask/test_dask_gpu.py (values ``arange % 1000003``,
    exact sum known in closed form). ``mode="cluster"``: on a dask-cuda ``LocalCUDACluster`` of one
    worker (two threads), the log installed in the worker (its log is the trace);
    ``mode="threads"``: Dask's threaded scheduler (four threads) in this process."""
    import cupy
    import dask
    import dask.array as da

    n = 1 << 29
    if mode == "threads":
        with dask.config.set(scheduler="threads", num_workers=4):
            got = float(_dask_values(cupy, da, n, n // 8).sum().compute())
        if got != _dask_expected(n):
            raise AssertionError(f"dask reduction: {got} != {_dask_expected(n)}")
        return {"mode": mode, "n": n}
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    worker_log = str(pathlib.Path(log_path).with_suffix("")) + ".worker.csv"
    with (
        LocalCUDACluster(n_workers=1, threads_per_worker=2) as cluster,
        Client(cluster) as client,
    ):
        client.run(_install_worker_log, worker_log, upstream)
        got = float(_dask_values(cupy, da, n, n // 8).sum().compute())
        if got != _dask_expected(n):
            raise AssertionError(f"dask reduction: {got} != {_dask_expected(n)}")
        (log,) = client.run(_flush_worker_log).values()
    return {"mode": mode, "n": n, "log": log}


def cupy_pipeline(rounds: int = 12) -> dict:
    """Two non-blocking streams, each round on each stream: random input of a size that varies
    (1 Ki to 4 Mi float32), sort, cumulative sum, real FFT and its magnitude, an elementwise
    expression, reductions; the last four rounds' results stay live (blocks of mixed lifetimes),
    checked against float64 on the host at the end."""
    import cupy
    import numpy as np

    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
    sizes = [1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22, 3 << 16]
    kept = []
    for r in range(rounds):
        for k, stream in enumerate(streams):
            with stream:
                n = sizes[(3 * r + k) % len(sizes)]
                x = cupy.random.RandomState(100 * r + k).standard_normal(n, dtype=cupy.float32)
                ordered = cupy.sort(x)
                scan = cupy.cumsum(ordered, dtype=cupy.float64)
                spectrum = cupy.abs(cupy.fft.rfft(x))
                wave = cupy.exp(-x * x) * cupy.sin(3 * x) + cupy.sqrt(cupy.abs(x))
                sums = cupy.stack([wave.sum(), spectrum.max(), x.astype(cupy.float64).sum()])
                kept.append((stream, x, ordered, scan, sums))
                kept = kept[-8:]
    for stream, x, ordered, scan, sums in kept:
        stream.synchronize()
        h = cupy.asnumpy(x).astype(np.float64)
        if not bool((cupy.diff(ordered) >= 0).all()):
            raise AssertionError("cupy.sort: not sorted")
        _check_close(float(scan[-1]), h.sum(), "cumsum")
        wave = np.exp(-h * h) * np.sin(3 * h) + np.sqrt(np.abs(h))
        _check_close(float(sums[0]), wave.sum(), "elementwise sum")
        _check_close(float(sums[1]), np.abs(np.fft.rfft(h)).max(), "rfft")
    return {"rounds": rounds, "streams": 2}


#: cupy_mixed's sizes, in float32 elements: 256 B to 1 GiB.
MIXED_SIZES = [1 << 6, 1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28]
#: cupy_mixed's lifetimes, in rounds: freed in the round that made it, kept two rounds, eight,
#: and to the end (arrays of at most 16M elements: the long-lived ones stay small).
MIXED_KEEP = [0, 2, 8, None]


def cupy_mixed(rounds: int = 24, streams: int = 4) -> dict:
    """Four non-blocking streams; each round on each stream: random input of a size from 256 B
    to 1 GiB (the sizes cycle at a different phase per stream), a sort, a float64 cumulative
    sum and an elementwise expression, the input and the sums kept for a lifetime that cycles
    too (freed at once, two rounds, eight rounds, to the end), so that blocks of every size and
    lifetime interleave on every stream. Each sum checked against float64 on the host as its
    block is freed (inputs of at most 16M elements; the larger ones against a float64 sum on
    the device)."""
    import cupy
    import numpy as np

    ss = [cupy.cuda.Stream(non_blocking=True) for _ in range(streams)]
    live: list[tuple[int | None, object, object, object]] = []  # (last round, stream, x, sum)

    def check(stream, x, total):
        stream.synchronize()
        if x.size <= 1 << 24:
            ref = cupy.asnumpy(x).astype(np.float64).sum()
        else:
            ref = float(x.astype(cupy.float64).sum())
        _check_close(float(total), ref, f"cumulative sum of {x.size} floats")

    for r in range(rounds):
        for k, stream in enumerate(ss):
            with stream:
                n = MIXED_SIZES[(5 * r + 3 * k) % len(MIXED_SIZES)]
                keep = MIXED_KEEP[(r + 2 * k) % len(MIXED_KEEP)]
                if keep is None and n > 1 << 24:
                    keep = 1
                x = cupy.random.RandomState(1000 * r + k).standard_normal(n, dtype=cupy.float32)
                ordered = cupy.sort(x)
                total = cupy.cumsum(x, dtype=cupy.float64)[-1]
                wave = cupy.exp(-x * x) * cupy.sin(3 * x)
                if not bool(ordered[0] <= ordered[-1]) or not bool(cupy.isfinite(wave).all()):
                    raise AssertionError(f"round {r}, stream {k}: sort or elementwise")
                del ordered, wave
                live.append((None if keep is None else r + keep, stream, x, total))
        for item in [e for e in live if e[0] is not None and e[0] <= r]:
            live.remove(item)
            check(*item[1:])
    for _, stream, x, total in live:
        check(stream, x, total)
    return {"rounds": rounds, "streams": streams, "sizes": [4 * n for n in MIXED_SIZES]}


def torch_steps(model: str, steps: int, batch: int) -> dict:
    """``steps`` training steps (bf16 autocast, AdamW) of a model of
    asv_bench/benchmarks/_torch_workloads.py, PyTorch allocating through
    ``rmm_torch_allocator`` (the current device resource: the log)."""
    import torch
    from rmm.allocators.torch import rmm_torch_allocator

    torch.cuda.memory.change_current_allocator(rmm_torch_allocator)

    torch.backends.cudnn.benchmark = False  # as the training benchmark runs
    torch.backends.cudnn.deterministic = True
    torch.manual_seed(0)
    net, loss_of, batch = workloads.model_and_loss(model, batch)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_of()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    torch.cuda.synchronize()
    if not all(v == v and abs(v) < 1e4 for v in losses):
        raise AssertionError(f"{model}: losses {losses}")
    return {"model": model, "steps": steps, "batch": batch, "losses": losses}


def _dataframes():
    """asv_bench/benchmarks/dataframes.py (a module of the benchmarks package)."""
    if str(ROOT / "asv_bench") not in sys.path:
        sys.path.insert(0, str(ROOT / "asv_bench"))
    from benchmarks import dataframes

    return dataframes


def cudf_pipeline_run(rows: int) -> dict:
    """The dataframe benchmark's cuDF pipeline (groupby-aggregate, merge, sort, strings, a
    rolling mean) on ``rows`` rows made on the GPU, twice (its warm-up and one timed run), with
    cuDF allocating from the current device resource; the number of groups and the rolling
    means' sum checked against pandas on the host."""
    dataframes = _dataframes()
    tables = dataframes.cudf_tables(rows)
    first = dataframes.cudf_pipeline(tables)
    again = dataframes.cudf_pipeline(tables)
    if first[:3] != again[:3]:
        raise AssertionError(f"cuDF pipeline: {first}, then {again}")
    _check_close(again[3], first[3], "the rolling means, run again")
    fact = tables["fact"].to_pandas()
    groups = fact["key"].nunique()
    rolled = float(fact["x"].rolling(7).mean().sum())
    if first[0] != groups:
        raise AssertionError(f"groupby: {first[0]} groups, pandas {groups}")
    _check_close(first[3], rolled, "rolling mean")
    return {"rows": rows, "groups": first[0], "joined": first[1]}


def pdsh_run(data: pathlib.Path) -> dict:
    """The 22 PDS-H queries of the dataframe benchmark, in order, each collected twice (its
    warm-up and one timed run) on the Polars GPU engine (in-memory executor) with the current
    device resource as its memory resource, over the parquet files in ``data``; each result
    compared with Polars on the CPU (row count)."""
    import polars as pl
    import rmm

    dataframes = _dataframes()
    engine = pl.GPUEngine(
        memory_resource=rmm.mr.get_current_device_resource(),
        executor="in-memory",
        raise_on_fail=True,
    )
    rows = {}
    for q in dataframes.QUERIES:
        frame = dataframes.pdsh_frame(q, data)
        gpu = [frame.collect(engine=engine).height for _ in range(2)]
        cpu = frame.collect().height
        if gpu != [cpu, cpu]:
            raise AssertionError(f"PDS-H q{q}: {gpu} rows on the GPU, {cpu} on the CPU")
        rows[f"q{q}"] = cpu
    return {"data": str(data), "rows": rows}


#: name -> (what it records, how the child runs it: f(log_path, upstream) -> dict)
WORKLOADS = {
    "reduce_1m": (
        "the CUB temp-storage loop, 1M float32, 200 calls",
        lambda log, up: reduce_loop(1 << 20, 200),
    ),
    "reduce_256m": (
        "the CUB temp-storage loop, 256M float32, 50 calls",
        lambda log, up: reduce_loop(1 << 28, 50),
    ),
    "dask_4gib": (
        "the 4 GiB Dask reduction of tests/dask/test_dask_gpu.py on a dask-cuda cluster (the "
        "worker's log; Dask's threaded scheduler without dask-cuda)",
        lambda log, up: dask_reduction(log, up, "cluster" if _has("dask_cuda") else "threads"),
    ),
    "dask_4gib_threads": (
        "the same reduction on Dask's threaded scheduler, four threads, in one process",
        lambda log, up: dask_reduction(log, up, "threads"),
    ),
    "cupy_pipeline": (
        "a CuPy pipeline on two streams: sort, scans, FFT, elementwise, reductions",
        lambda log, up: cupy_pipeline(),
    ),
    "cupy_mixed": (
        "CuPy on four streams: sizes from 256 B to 1 GiB, blocks freed at once, after two or "
        "eight rounds and at the end, interleaved on every stream",
        lambda log, up: cupy_mixed(),
    ),
    "torch_gpt2_small": (
        "2 training steps of the GPT-2-small-shaped model, batch 4, through rmm_torch_allocator",
        lambda log, up: torch_steps("gpt2_small", 2, 4),
    ),
    "torch_resnet50": (
        "2 training steps of the ResNet-50-shaped model, batch 32, through rmm_torch_allocator",
        lambda log, up: torch_steps("resnet50", 2, 32),
    ),
    "torch_gpt2_small_train": (
        "13 training steps of the GPT-2-small-shaped model, batch 8 (the training benchmark's "
        "3 warm-up and 10 timed steps), through rmm_torch_allocator",
        lambda log, up: torch_steps("gpt2_small", 13, 8),
    ),
    "torch_resnet50_train": (
        "13 training steps of the ResNet-50-shaped model, batch 128 (the training benchmark's "
        "3 warm-up and 10 timed steps), through rmm_torch_allocator",
        lambda log, up: torch_steps("resnet50", 13, 128),
    ),
    "cudf_pipeline_10m": (
        "the dataframe benchmark's cuDF pipeline on 10M rows, its warm-up and one timed run",
        lambda log, up: cudf_pipeline_run(10_000_000),
    ),
    "pdsh_sf10": (
        "the 22 PDS-H queries on the Polars GPU engine over the parquet files in "
        "RMM_FENCES_PDSH_DATA (scale factor 10: tpchgen-cli), each its warm-up and one timed run",
        lambda log, up: pdsh_run(_dataframes().pdsh_data()),
    ),
}


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _missing(name: str) -> str | None:
    """What the workload ``name`` needs that this machine lacks, or None."""
    if name.startswith("torch_") and not _has("torch"):
        return "PyTorch is not installed"
    if name.startswith(("cudf_", "pdsh_")) and not _has("cudf"):
        return "cuDF is not installed"
    if name.startswith("pdsh_"):
        if not _has("cudf_polars"):
            return "cudf-polars is not installed"
        dataframes = _dataframes()
        return dataframes.missing_pdsh_data(dataframes.pdsh_data())
    return None


def child(name: str, log_path: str, upstream: str) -> int:
    """In the workload's own process: the log installed first, then the workload; prints one
    JSON line (what the workload returned, and ``log``: the file to keep)."""
    import rmm

    from rmm_fences.specs import compose

    log = rmm.mr.LoggingResourceAdaptor(compose(upstream), log_file_name=log_path)
    rmm.mr.set_current_device_resource(log)
    if _has("cupy"):
        import cupy
        from rmm.allocators.cupy import rmm_cupy_allocator

        cupy.cuda.set_allocator(rmm_cupy_allocator)
    info = WORKLOADS[name][1](log_path, upstream) or {}
    import gc

    gc.collect()  # the workload's arrays are freed (and logged) before the flush
    log.flush()
    info.setdefault("log", log.get_file_name())
    print(json.dumps(info), flush=True)
    return 0


def cut_and_compress(src: str, dst: pathlib.Path, max_events: int) -> dict:
    """The header and the first ``max_events`` event lines of ``src``, gzip-compressed (no
    time stamp in the gzip header: the same log gives the same file)."""
    lines = kept = 0
    with open(src, newline="") as f, open(dst, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as out:
            header = f.readline()
            if header.strip() != HEADER:
                raise ValueError(f"{src}: header {header.strip()!r}, expected {HEADER!r}")
            out.write(header.encode())
            for line in f:
                if not line.strip():
                    continue
                lines += 1
                if kept < max_events:
                    out.write(line.encode())
                    kept += 1
    return {"events_recorded": lines, "events_kept": kept, "cut": kept < lines}


def record(name: str, out_dir: pathlib.Path, upstream: str, max_events: int, timeout: float):
    from rmm_fences_bench import read_allocation_log

    with tempfile.TemporaryDirectory() as tmp:
        log_path = os.path.join(tmp, f"{name}.csv")
        t0 = time.perf_counter()
        info = workloads.run_json(
            [sys.executable, __file__, "--child", name, "--log", log_path, "--upstream", upstream],
            timeout,
        )
        dst = out_dir / f"{name}.csv.gz"
        info.update(cut_and_compress(info.pop("log"), dst, max_events))
    trace = read_allocation_log(dst)  # must read what rmm wrote
    meta = {
        "workload": name,
        "what": WORKLOADS[name][0],
        "upstream": upstream,
        "max_events": max_events,
        "wall_s": round(time.perf_counter() - t0, 1),
        **info,
        "trace": trace.stats(),
        "versions": _versions(),
    }
    (out_dir / f"{name}.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("rmm-cu13", "rmm-cu12", "cupy-cuda13x", "cupy-cuda12x", "dask", "torch"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    try:
        import cupy

        out["gpu"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except Exception as exc:  # the GPU name is information, not a requirement
        out["gpu"] = f"unknown ({type(exc).__name__})"
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workloads", nargs="*", help="default: all (see --list)")
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    parser.add_argument("--out", type=pathlib.Path, default=TRACES)
    parser.add_argument("--upstream", default="cuda_async", help="compose spec under the log")
    parser.add_argument("--max-events", type=int, default=50_000)
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per workload")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--log", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.log, args.upstream)
    if args.list:
        for name, (what, _) in WORKLOADS.items():
            print(f"{name:20} {what}")
        return 0
    unknown = sorted(set(args.workloads) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workloads {unknown}; valid: {sorted(WORKLOADS)}")
    if args.max_events < 1:
        parser.error(f"--max-events must be positive, got {args.max_events}")
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in args.workloads or list(WORKLOADS):
        missing = _missing(name)
        if missing:
            print(f"{name}: skipped, {missing}")
            continue
        try:
            meta = record(name, args.out, args.upstream, args.max_events, args.timeout)
        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
            print(f"{name}: FAILED\n{exc}")
            failed += 1
            continue
        cut = f", cut from {meta['events_recorded']}" if meta["cut"] else ""
        print(f"{name}: {meta['events_kept']} events{cut} -> {args.out / name}.csv.gz")
        print(f"  {meta['trace']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
