#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What vmm_pool holds, and what moving pages costs it, when a recorded workload repeats: each
log replayed many times through the pool's core over a model of device pages (no GPU).

    python tools/remap_model.py                       # every log in asv_bench/traces
    python tools/remap_model.py cupy_pipeline --passes 96 --page-ns 3000 30000

Needs the host test harness (``rmm_fences_testing``, tests/native) and the benchmarks' library
(``rmm_fences_bench``, benchmarks/), both built in place by ``make install``.

The host arena models time: ``--call-ns`` per call of the pool (the work between calls too;
the default, 200 ns, is calls back to back with no work between them, as in the replay
benchmark), and, for the logs of PyTorch training steps, also the pace of those steps in the
training benchmark (``--training``: PyTorch's own allocator's median step time over the log's
calls per step),
``--page-ns`` per page mapped or unmapped and per range mapped (a page moved is two such calls;
several values: a row per log and value); the pool spends at most ``--fraction``
(``remap_time_fraction``) of that time moving pages once its peak in use stopped rising, from a
bucket that starts full (the fraction of a second). Each pass replays the log in recorded order on
idle streams (its work done at once) and frees what it leaves live. Per log, in markdown: the
footprint (the most pages the pool held) over the log's live peak after the first pass, after four
and after ``--passes``; the share of the modelled time spent moving pages in the first pass, in
passes 2 to 4 and in the last four; and the H200 replay's CudaAsync footprint for comparison
(``--gpu-replay``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "native"), str(ROOT / "benchmarks"), str(ROOT / "tools")]
from footprint_breakdown import (  # noqa: E402
    GPU_REPLAY,
    MIB,
    TRACES,
    events_of,
    gpu_footprints,
    log_names,
    one_pass,
)

from rmm_fences._cli._args import positive  # noqa: E402

from rmm_fences_bench import read_allocation_log  # noqa: E402
from rmm_fences_testing import HostStreamOrderedPool  # noqa: E402

PAGE = 2 << 20
TRAINING = ROOT / "docs" / "data" / "torch" / "training_2026-12-01.json"


def load(name: str, traces: pathlib.Path) -> tuple[list[tuple[int, int, int, int]], int]:
    """The log's events (``events_of``) and its peak of live bytes."""
    trace = read_allocation_log(traces / f"{name}.csv.gz")
    return events_of(trace), trace.peak_live_bytes


def training_pace(name: str, traces: pathlib.Path, training: pathlib.Path) -> int | None:
    """Nanoseconds per call of the log ``name`` at the pace of the training benchmark's steps
    (PyTorch's allocator's median step time for the log's model and batch, over the log's calls
    per step), or None for a log of no training benchmark's steps."""
    meta_path = traces / f"{name}.json"
    if not training.is_file() or not meta_path.is_file():
        return None
    meta = json.loads(meta_path.read_text())
    steps = [
        r["step_s"]
        for r in json.loads(training.read_text())
        if r["allocator"] == "torch"
        and (r["model"], r["batch"]) == (meta.get("model"), meta.get("batch"))
    ]
    if not steps or not meta.get("steps"):
        return None
    calls_per_step = meta["trace"]["events"] / meta["steps"]
    return round(statistics.median(steps) * 1e9 / calls_per_step)


def model(events, peak: int, passes: int, call_ns: int, page_ns: int, fraction: float) -> dict:
    """Footprints over the live peak and shares of time moving pages, per stretch of passes."""
    pool = HostStreamOrderedPool(
        arena_page_size=PAGE,
        arena_call_ns=call_ns,
        arena_page_ns=page_ns,
        arena_remap_time_fraction=fraction,
    )
    pool.set_idle()
    marks = {}  # passes done -> (remap ns so far, model ns so far, peak physical bytes)
    for done in range(1, passes + 1):
        one_pass(pool, events)
        if done in (1, 4, passes - 4, passes):
            arena = pool.arena
            marks[done] = (pool.stats["remap_ns"], arena["now_ns"], arena["peak_physical_bytes"])
    assert pool.violations == []

    def moving(first, last):
        (r0, t0, _), (r1, t1, _) = (0, 0, 0) if first == 0 else marks[first], marks[last]
        return (r1 - r0) / max(t1 - t0, 1)

    return {
        "footprint_1": marks[1][2] / peak,
        "footprint_4": marks[4][2] / peak,
        "footprint_n": marks[passes][2] / peak,
        "moving_1": moving(0, 1),
        "moving_2_4": moving(1, 4),
        "moving_last_4": moving(passes - 4, passes),
        "pass_ms": marks[1][1] / 1e6,
    }


def report(names, traces, passes, call_ns, page_costs, fraction, gpu_replay, training) -> list[str]:
    from asv_bodies import checkout_commit

    cuda = gpu_footprints(gpu_replay)
    lines = [
        "# vmm_pool when a workload repeats (host model)",
        "",
        f"commit `{checkout_commit() or 'unknown'}`; the pool's core over a model of 2 MiB "
        f"pages, no GPU: remap_time_fraction {fraction}, {passes} passes; training pace from "
        f"`{training.name if training.is_file() else 'none'}`; CudaAsync from "
        f"`{gpu_replay.name if gpu_replay.is_file() else 'none'}`",
        "",
        f"| log | ns per call | page call ns | first pass (model ms) "
        f"| footprint ÷ live peak: pass 1 | pass 4 "
        f"| pass {passes} | time moving pages: pass 1 | passes 2-4 | last 4 "
        "| H200 CudaAsync ÷ live peak |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        events, peak = load(name, traces)
        c = cuda.get((name, "cuda_async"))  # MiB
        async_cell = "-" if c is None else f"{c * MIB / peak:.3f}x"
        paces = [call_ns]
        pace = training_pace(name, traces, training)
        if pace is not None:
            paces.append(pace)
        for ns, page_ns in itertools.product(paces, page_costs):
            m = model(events, peak, passes, ns, page_ns, fraction)
            lines.append(
                f"| {name} | {ns} | {page_ns} | {m['pass_ms']:.1f} | {m['footprint_1']:.3f}x "
                f"| {m['footprint_4']:.3f}x | {m['footprint_n']:.3f}x | {m['moving_1']:.0%} "
                f"| {m['moving_2_4']:.0%} | {m['moving_last_4']:.0%} | {async_cell} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="*", help="log names (default: every log in --traces)")
    parser.add_argument("--traces", type=pathlib.Path, default=TRACES)
    parser.add_argument("--gpu-replay", type=pathlib.Path, default=GPU_REPLAY)
    parser.add_argument("--passes", type=positive, default=24, help="at least 8 (default 24)")
    parser.add_argument("--call-ns", type=positive, default=200)
    parser.add_argument("--page-ns", type=positive, nargs="+", default=[3000])
    parser.add_argument("--fraction", type=float, default=0.05, help="remap_time_fraction")
    parser.add_argument(
        "--training",
        type=pathlib.Path,
        default=TRAINING,
        help="the training benchmark's results (tools/torch_report.py train), for the pace of "
        "the training logs (a missing file: none)",
    )
    args = parser.parse_args(argv)
    if args.passes < 8:
        parser.error(f"--passes {args.passes}: expected at least 8 (pass 4 and the last four)")
    if not 0.0 <= args.fraction <= 1.0:
        parser.error(f"--fraction {args.fraction}: expected a number within [0, 1]")
    names = args.logs or log_names(args.traces)
    lines = report(
        names,
        args.traces,
        args.passes,
        args.call_ns,
        args.page_ns,
        args.fraction,
        args.gpu_replay,
        args.training,
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
