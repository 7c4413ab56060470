# SPDX-License-Identifier: Apache-2.0
"""Tables (markdown, ratios against the peers) and charts (PNG) from asv results.

    python tools/asv_report.py RESULTS_DIR [--machine h200] [--png-dir docs/img]

RESULTS_DIR is asv's results folder (benchmarks.json and one folder per machine). Where several
result files hold a benchmark, the newest file wins; each table names the commit it came from.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import os

PEERS = ("rmm_pool", "cuda_async")
PAIRS = 1000  # asv_bench/benchmarks/alloc_free.py: pairs per timed call
CALLS = 20  # asv_bench/benchmarks/reduce.py: calls per timed call
# Benchmarks renamed since results were published (docs/data/asv holds the old names).
RENAMED = {
    "reduce.SeedLoop.time_seed_loop": "reduce.CubTempStorageLoop.time_loop",
    "reduce.SeedLoop.track_bandwidth_gbs": "reduce.CubTempStorageLoop.track_bandwidth_gbs",
}


def load(results_dir: str, machine: str):
    """{benchmark: {param tuple: value}}, {benchmark: commit} from the newest file per benchmark."""
    meta = json.load(open(os.path.join(results_dir, "benchmarks.json")))
    files = [
        json.load(open(f))
        for f in glob.glob(os.path.join(results_dir, machine, "*.json"))
        if not f.endswith("machine.json")
    ]
    values, commits = {}, {}
    for res in sorted(files, key=lambda r: r["date"]):  # newer files overwrite older ones
        cols = res["result_columns"]
        for name, row in res["results"].items():
            row = dict(zip(cols, row))
            if row["result"] is None or name not in meta:
                continue
            params = [[p.strip("'") for p in ps] for ps in row["params"]]
            keys = list(itertools.product(*params)) if params else [()]
            name = RENAMED.get(name, name)
            values[name] = {k: v for k, v in zip(keys, row["result"]) if v is not None}
            commits[name] = res["commit_hash"][:8]
    return values, commits


def fmt(x: float) -> str:
    if x >= 1e5:
        return f"{x:.3g}"
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def table(title, header, rows):
    out = [
        f"**{title}**",
        "",
        "| " + " | ".join(header) + " |",
        "| " + " | ".join(["---"] + ["---:"] * (len(header) - 1)) + " |",
    ]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def per_size(values, name, scale, peers, label, unit, commit, higher_is_better=False, suffix="B"):
    """Rows chain x size, each cell 'value (ratio to each peer)'."""
    data = values.get(name)
    if not data:
        return ""
    chains = list(dict.fromkeys(k[0] for k in data))
    sizes = list(dict.fromkeys(k[1] for k in data))
    rows = []
    for c in chains:
        cells = []
        for s in sizes:
            v = data.get((c, s))
            if v is None:
                cells.append("failed")
                continue
            v *= scale
            ratios = []
            for p in peers:
                ref = data.get((p, s))
                if c == p:
                    ratios.append("1x" if len(peers) > 1 else "")
                elif ref:
                    r = (ref * scale) / v if higher_is_better else v / (ref * scale)
                    ratios.append(f"{r:.2f}x")
                else:
                    ratios.append("n/a")
            ratios = [r for r in ratios if r]
            cells.append(fmt(v) + (f" ({' / '.join(ratios)})" if ratios else ""))
        rows.append([f"`{c}`", *cells])
    header = ["chain", *[_size(s, suffix) for s in sizes]]
    return table(f"{label} ({unit}; commit {commit})", header, rows)


def _size(s: str, suffix: str = "B") -> str:
    """'1048576' -> '1 MiB' (bytes) or '1 Mi' (an element count, suffix "")."""
    n = int(s)
    for unit, k in (("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}{suffix}"
    return f"{n} {suffix}".strip()


def report(values, commits) -> str:
    parts = []
    b = "alloc_free.AllocFree.track_native_pair_ns"
    parts.append(
        per_size(
            values,
            b,
            1.0,
            PEERS,
            "Native allocate + deallocate, ns per pair "
            "(ratio to rmm_pool / to cuda_async; lower is better)",
            "ns",
            commits.get(b),
        )
    )
    b = "alloc_free.AllocFree.time_python_pairs"
    parts.append(
        per_size(
            values,
            b,
            1e6 / PAIRS,
            PEERS,
            "Python allocate + deallocate, us per pair (ratio to rmm_pool / to cuda_async)",
            "us",
            commits.get(b),
        )
    )
    b = "reduce.CubTempStorageLoop.time_loop"
    parts.append(
        per_size(
            values,
            b,
            1e6 / CALLS,
            ("preallocated",),
            "The CUB temp-storage "
            "loop over n float32, us per call (ratio to the preallocated temp "
            "buffer)",
            "us",
            commits.get(b),
            suffix="",
        )
    )
    b = "reduce.CubTempStorageLoop.track_bandwidth_gbs"
    parts.append(
        per_size(
            values,
            b,
            1.0,
            ("preallocated",),
            "The CUB temp-storage "
            "loop over n float32, achieved bandwidth (in brackets: its time per "
            "call over the preallocated buffer's)",
            "GB/s",
            commits.get(b),
            higher_is_better=True,
            suffix="",
        )
    )
    # the plan's loop against the floor of the same run (CubTempStorageLoop's preallocated row)
    b = "reduce.CubTempStoragePlanLoop.time_loop"
    if values.get(b):
        floor = values.get("reduce.CubTempStorageLoop.time_loop", {})
        merged = {k: v for k, v in floor.items() if k[0] == "preallocated"}
        merged.update(values[b])
        parts.append(
            per_size(
                {b: merged},
                b,
                1e6 / CALLS,
                ("preallocated",),
                "The CUB temp-storage loop through a ReducePlan over n float32, us per call "
                "(ratio to the preallocated temp buffer)",
                "us",
                commits.get(b),
                suffix="",
            )
        )
    b = "reduce.CubTempStoragePlanLoop.track_ratio_to_preallocated"
    parts.append(
        per_size(
            values,
            b,
            1.0,
            (),
            "The CUB temp-storage loop through a ReducePlan over n float32, time per call over "
            "the preallocated buffer's (CUDA events, interleaved rounds)",
            "ratio",
            commits.get(b),
            suffix="",
        )
    )
    for b, label, unit, scale, peer in (
        (
            "throughput.RandomAllocations.track_ops_per_s",
            "Random allocations (RMM's RANDOM_ALLOCATIONS shape), ops/s, speed-up over rmm_pool",
            "ops/s",
            1.0,
            "rmm_pool",
        ),
        (
            "reduce.CupySum.time_cupy_sum",
            "cupy.sum of 1M float32 with CUB, us per call (ratio to CuPy's MemoryPool)",
            "us",
            1e6 / CALLS,
            "cupy_pool",
        ),
        (
            "alloc_free.DeferredFence.track_cost_per_free_ns",
            "What a deferred SyncOnFree adds per free over its upstream",
            "ns",
            1.0,
            None,
        ),
        (
            "high_water.HighWater.track_peak_device_bytes",
            "Device memory high-water of the "
            "CUB temp-storage loop on two streams plus 64 MiB held (ratio to cuda)",
            "MiB",
            1 / (1 << 20),
            "cuda",
        ),
    ):
        data = values.get(b)
        if not data:
            continue
        rows = []
        for (k,), v in data.items():
            ref = data.get((peer,)) if peer else None
            if ref and k != peer:
                ratio = f"{v / ref:.2f}x"
            else:
                ratio = ""
            rows.append([f"`{k}`", fmt(v * scale), ratio][: 3 if peer else 2])
        header = ["", unit, "ratio"][: 3 if peer else 2]
        parts.append(table(f"{label} ({unit}; commit {commits[b]})", header, rows))
    b = "throughput.Threads.track_pairs_per_s"
    data = values.get(b)
    if data:
        rows = []
        for c in dict.fromkeys(k[0] for k in data):
            one, eight = data.get((c, "1")), data.get((c, "8"))
            rows.append([f"`{c}`", fmt(one), fmt(eight), f"{eight / one:.2f}x"])
        parts.append(
            table(
                f"Threads: 1 MiB pairs per second, 1 thread and 8 threads on 8 "
                f"streams (commit {commits[b]})",
                ["chain", "1 thread", "8 threads", "scaling"],
                rows,
            )
        )
    return "\n".join(p for p in parts if p)


def charts(values, png_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    data = values.get("alloc_free.AllocFree.track_native_pair_ns", {})
    chains = list(dict.fromkeys(k[0] for k in data))
    sizes = list(dict.fromkeys(k[1] for k in data))
    width = 0.8 / max(len(sizes), 1)
    for i, s in enumerate(sizes):
        axes[0].bar(
            [j + i * width for j in range(len(chains))],
            [data.get((c, s), 0) for c in chains],
            width,
            label=_size(s),
        )
    axes[0].set_xticks(
        [j + width for j in range(len(chains))], chains, rotation=30, ha="right", fontsize=8
    )
    axes[0].set_yscale("log")
    axes[0].set_ylabel("ns per native allocate + deallocate (log)")
    axes[0].legend(fontsize=8)
    data = values.get("reduce.CubTempStorageLoop.time_loop", {})
    chains = [c for c in dict.fromkeys(k[0] for k in data) if c != "preallocated"]
    sizes = list(dict.fromkeys(k[1] for k in data))
    width = 0.8 / max(len(sizes), 1)
    for i, s in enumerate(sizes):
        floor = data.get(("preallocated", s))
        axes[1].bar(
            [j + i * width for j in range(len(chains))],
            [data.get((c, s), 0) / floor for c in chains],
            width,
            label=_size(s, ""),
        )
    axes[1].axhline(1.0, color="black", linewidth=0.8)
    axes[1].set_xticks(
        [j + 1.5 * width for j in range(len(chains))], chains, rotation=30, ha="right", fontsize=8
    )
    axes[1].set_ylabel("loop time / preallocated temp buffer")
    axes[1].legend(title="n (float32)", fontsize=8)
    data = values.get("throughput.RandomAllocations.track_ops_per_s", {})
    chains = [k[0] for k in data]
    axes[2].bar(chains, [data[(c,)] for c in chains], color="tab:green")
    axes[2].set_yscale("log")
    axes[2].set_ylabel("random allocations, ops/s (log)")
    axes[2].tick_params(axis="x", rotation=30, labelsize=8)
    for label in axes[2].get_xticklabels():
        label.set_ha("right")
    fig.tight_layout()
    path = os.path.join(png_dir, "asv_h200.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results_dir")
    ap.add_argument("--machine", default="h200")
    ap.add_argument("--png-dir")
    args = ap.parse_args()
    values, commits = load(args.results_dir, args.machine)
    print(report(values, commits))
    if args.png_dir:
        for path in charts(values, args.png_dir):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
