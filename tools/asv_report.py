# SPDX-License-Identifier: Apache-2.0
"""Every measured table of the docs, rendered from its data file in docs/data.

    python tools/asv_report.py                # rewrite the marked tables in docs/*.md
    python tools/asv_report.py --check        # exit 1 naming each marked table that differs
    python tools/asv_report.py --charts       # also redraw the marked charts (needs matplotlib)
    python tools/asv_report.py --results asv_bench/results [--machine NAME] [--png-dir DIR]
                                              # every asv table of a results folder (your run)
    python tools/asv_report.py --stamp asv_bench/results   # make bench: record what HEAD ran on

A page marks each table it publishes:

    <!-- table: KIND PATH [key=value ...] -->
    ... what the renderer wrote ...
    <!-- /table -->

KIND is a renderer of ``KINDS`` below and PATH its data file (or asv results folder), relative
to docs/. The first line of every rendered table names the file and what it records of the run:
commit, GPU, driver and package versions, "not recorded" where the file holds none. A chart is
marked the same way on the line before its image (``<!-- chart: KIND PATH -->``, then
``![...](img/NAME.png)``); ``--charts`` redraws it. The CPU tests re-render every marked table
and fail on any difference (tests/test_docs_tables.py).

To publish a new run: ``make bench`` (asv, stamped with its environment) and copy
``asv_bench/results`` into ``docs/data/asv``; or write a new data file with the tool that made
the old one (``tools/asv_bodies.py run``, ``tools/torch_report.py``, ``rmm-fences doctor
--json``, ``make downstream``); point the marker at it, then run this script.
"""

from __future__ import annotations

import argparse
import ast
import glob
import importlib.util
import itertools
import json
import os
import pathlib
import re
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

PEERS = ("rmm_pool", "cuda_async")
PAIRS = 1000  # asv_bench/benchmarks/alloc_free.py: pairs per timed call
CALLS = 20  # asv_bench/benchmarks/reduce.py: calls per timed call
# Benchmarks renamed since results were published (docs/data/asv holds the old names).
RENAMED = {
    "reduce.SeedLoop.time_seed_loop": "reduce.CubTempStorageLoop.time_loop",
    "reduce.SeedLoop.track_bandwidth_gbs": "reduce.CubTempStorageLoop.track_bandwidth_gbs",
}
NOT_RECORDED = "not recorded"


def _load_file(path: pathlib.Path, name: str):
    """The Python file ``path``, imported once as the module ``name``."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _tool(name: str):
    """Another script of tools/, imported as a module."""
    return _load_file(pathlib.Path(__file__).parent / name, name)


# One number format and one size label for every table of the docs (tools/asv_bodies.py's).
fmt = _tool("asv_bodies.py").number
_size = _tool("asv_bodies.py").size_label


# -- asv results ------------------------------------------------------------------------------


def load(results_dir: str, machine: str):
    """{benchmark: {param tuple: value}}, {benchmark: source} from the newest file per
    benchmark; a source is {"file", "commit", "date", "machine", "environment"}."""
    meta = json.load(open(os.path.join(results_dir, "benchmarks.json")))
    files = []
    for f in glob.glob(os.path.join(results_dir, machine, "*.json")):
        if not f.endswith("machine.json"):
            files.append((f, json.load(open(f))))
    values, sources = {}, {}
    for path, res in sorted(files, key=lambda fr: fr[1]["date"]):  # newer overwrite older
        cols = res["result_columns"]
        source = {
            "file": path,
            "commit": res["commit_hash"][:8],
            "date": res["date"],
            "machine": res.get("params", {}).get("machine", machine),
            "environment": res.get("environment"),
        }
        for name, row in res["results"].items():
            row = dict(zip(cols, row))
            if row["result"] is None or name not in meta:
                continue
            params = [[p.strip("'") for p in ps] for ps in row["params"]]
            keys = list(itertools.product(*params)) if params else [()]
            name = RENAMED.get(name, name)
            values[name] = {k: v for k, v in zip(keys, row["result"]) if v is not None}
            sources[name] = source
    return values, sources


def table(header, rows) -> str:
    out = [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join(["---"] + ["---:"] * (len(header) - 1)) + " |",
    ]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def per_size(data, scale, peers, higher_is_better=False, suffix="B"):
    """Rows chain x size, each cell 'value (ratio to each peer)'."""
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
    return table(["chain", *[_size(s, suffix) for s in sizes]], rows)


def per_chain(data, scale, unit, peer):
    """One value per chain, with its ratio to ``peer`` (None: no ratio column)."""
    rows = []
    for (k,), v in data.items():
        ref = data.get((peer,)) if peer else None
        ratio = f"{v / ref:.2f}x" if ref and k != peer else ""
        rows.append([f"`{k}`", fmt(v * scale), ratio][: 3 if peer else 2])
    return table(["", unit, "ratio"][: 3 if peer else 2], rows)


def threads(data):
    rows = []
    for c in dict.fromkeys(k[0] for k in data):
        one, eight = data.get((c, "1")), data.get((c, "8"))
        rows.append([f"`{c}`", fmt(one), fmt(eight), f"{eight / one:.2f}x"])
    return table(["chain", "1 thread", "8 threads", "scaling"], rows)


def summary(values):
    """rmm_fences' pool against rmm's pool and CudaAsync: one row per benchmark, each ratio a
    speed-up (the peer's time over the pool's, or the pool's rate over the peer's)."""
    pool = "rmm_fences_pool"
    mib, big = "1048576", str(256 << 20)
    rows = []
    for label, bench, key, peer_keys, scale, rate in (
        (
            "native allocate + deallocate, 1 MiB (ns per pair)",
            "alloc_free.AllocFree.track_native_pair_ns",
            (pool, mib),
            [("rmm_pool", mib), ("cuda_async", mib)],
            1.0,
            False,
        ),
        (
            "Python allocate + deallocate, 1 MiB (us per pair)",
            "alloc_free.AllocFree.time_python_pairs",
            (pool, mib),
            [("rmm_pool", mib), ("cuda_async", mib)],
            1e6 / PAIRS,
            False,
        ),
        (
            "random allocations (operations per s)",
            "throughput.RandomAllocations.track_ops_per_s",
            (pool,),
            [("rmm_pool",), ("cuda_async",)],
            1.0,
            True,
        ),
        (
            "8 threads on 8 streams, 1 MiB pairs (pairs per s)",
            "throughput.Threads.track_pairs_per_s",
            (pool, "8"),
            [("rmm_pool", "8"), ("cuda_async", "8")],
            1.0,
            True,
        ),
        (
            "the CUB temp-storage loop, 256 Mi float32 (us per call)",
            "reduce.CubTempStorageLoop.time_loop",
            (pool, big),
            [("rmm_pool", big), ("cuda_async", big)],
            1e6 / CALLS,
            False,
        ),
        (
            "`cupy.sum` of 1M float32 through `CupyAllocator` (us per call)",
            "reduce.CupySum.time_cupy_sum",
            (f"CupyAllocator({pool})",),
            [None, ("CupyAllocator(cuda_async)",)],
            1e6 / CALLS,
            False,
        ),
    ):
        data = values.get(bench)
        if not data or key not in data:
            continue
        v = data[key]
        cells = []
        for pk in peer_keys:
            ref = data.get(pk) if pk else None
            cells.append("" if ref is None else f"{(v / ref) if rate else (ref / v):.2f}x")
        rows.append([label, fmt(v * scale), *cells])
    return table(
        ["benchmark", "rmm_fences pool", "speed-up over rmm_pool", "over cuda_async"], rows
    )


#: The asv tables, by kind: (benchmark, builder of its table from the benchmark's values).
ASV_TABLES = {
    "asv-native-pair": (
        "alloc_free.AllocFree.track_native_pair_ns",
        lambda d: per_size(d, 1.0, PEERS),
        "Native allocate + deallocate, ns per pair (ratio to rmm_pool / to cuda_async)",
    ),
    "asv-python-pair": (
        "alloc_free.AllocFree.time_python_pairs",
        lambda d: per_size(d, 1e6 / PAIRS, PEERS),
        "Python allocate + deallocate, us per pair (ratio to rmm_pool / to cuda_async)",
    ),
    "asv-deferred-fence": (
        "alloc_free.DeferredFence.track_cost_per_free_ns",
        # results of before the benchmark took a size are of 1 MiB, one value per upstream
        lambda d: (
            per_size(d, 1.0, ()) if all(len(k) == 2 for k in d) else per_chain(d, 1.0, "ns", None)
        ),
        "What a deferred SyncOnFree adds to its upstream's pair of the same size, ns",
    ),
    "asv-random": (
        "throughput.RandomAllocations.track_ops_per_s",
        lambda d: per_chain(d, 1.0, "ops/s", "rmm_pool"),
        "Random allocations (RMM's RANDOM_ALLOCATIONS shape), operations per s (ratio to rmm_pool)",
    ),
    "asv-threads": (
        "throughput.Threads.track_pairs_per_s",
        threads,
        "1 MiB pairs per second, 1 thread and 8 threads on 8 streams",
    ),
    "asv-cub-loop": (
        "reduce.CubTempStorageLoop.time_loop",
        lambda d: per_size(d, 1e6 / CALLS, ("preallocated",), suffix=""),
        "The CUB temp-storage loop over n float32, us per call (ratio to the preallocated "
        "temp buffer)",
    ),
    "asv-cub-bandwidth": (
        "reduce.CubTempStorageLoop.track_bandwidth_gbs",
        lambda d: per_size(d, 1.0, ("preallocated",), higher_is_better=True, suffix=""),
        "The CUB temp-storage loop over n float32, GB/s (in brackets: its time per call over "
        "the preallocated buffer's)",
    ),
    "asv-plan-loop": (
        "reduce.CubTempStoragePlanLoop.track_ratio_to_preallocated",
        lambda d: per_size(d, 1.0, (), suffix=""),
        "The CUB temp-storage loop through a ReducePlan, time per call over the preallocated "
        "buffer's (CUDA events, interleaved rounds)",
    ),
    "asv-cupy-sum": (
        "reduce.CupySum.time_cupy_sum",
        lambda d: per_chain(d, 1e6 / CALLS, "us", "cupy_pool"),
        "cupy.sum of 1M float32 with CUB, us per call (ratio to CuPy's MemoryPool)",
    ),
    "asv-high-water": (
        "high_water.HighWater.track_peak_device_bytes",
        lambda d: per_chain(d, 1 / (1 << 20), "MiB", "cuda"),
        "Device memory high-water of the CUB temp-storage loop on two streams plus 64 MiB "
        "held (ratio to cuda)",
    ),
}


def report(values) -> str:
    """Every asv table a results folder holds, titled (``--results``)."""
    parts = []
    for bench, build, title in ASV_TABLES.values():
        if values.get(bench):
            parts.append(f"**{title}**\n\n{build(values[bench])}\n")
    if values:
        parts.insert(0, f"**Summary: rmm_fences' pool against the peers**\n\n{summary(values)}\n")
    return "\n".join(parts)


def _asv_meta(sources, bench, path):
    src = sources[bench]
    env = src["environment"] or {}
    return {
        "file": path,
        "commit": env.get("commit") or src["commit"],
        "date": _date(src["date"]),
        "gpu": env.get("gpu"),
        "driver": env.get("driver"),
        "versions": env.get("versions"),
        "note": f"asv machine `{src['machine']}`",
    }


def _date(ms: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).date().isoformat()


def render_asv(kind):
    def render(path: pathlib.Path, rel: str, options: dict):
        values, sources = load(str(path), options.get("machine", "h200"))
        if kind == "asv-summary":
            bench = "alloc_free.AllocFree.track_native_pair_ns"
            return _asv_meta(sources, bench, rel), summary(values)
        bench, build, _ = ASV_TABLES[kind]
        if bench not in values:
            raise LookupError(f"{rel} holds no results of {bench}")
        return _asv_meta(sources, bench, rel), build(values[bench])

    return render


def stamp(results_dir: str) -> list[str]:
    """Adds what HEAD ran on (commit, GPU, driver, package versions) to the asv result files of
    HEAD's commit that lack it; asv ignores the key. Returns the files stamped."""
    env = _tool("asv_bodies.py").recorded_environment()
    head = (env["commit"] or "").split("+")[0]
    stamped = []
    if not head:  # not a git checkout: no result file can be matched to a commit
        return stamped
    for f in glob.glob(os.path.join(results_dir, "*", "*.json")):
        if f.endswith(("machine.json", "benchmarks.json")):
            continue
        res = json.load(open(f))
        if res.get("commit_hash") == head and "environment" not in res:
            res["environment"] = env
            with open(f, "w") as out:
                json.dump(res, out, indent=2)
            stamped.append(f)
    return stamped


# -- the other data files -----------------------------------------------------------------------


def _env_meta(path, env):
    env = env or {}
    return {
        "file": path,
        "commit": env.get("commit"),
        "gpu": env.get("gpu"),
        "driver": env.get("driver"),
        "versions": env.get("versions"),
    }


def _jsonl_environment(path: pathlib.Path):
    """The ``{"environment": ...}`` line of a tools/asv_bodies.py file, or None."""
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            if "environment" in row:
                return row["environment"]
    return None


def render_doctor(path, rel, options):
    """The hazard matrix of ``rmm-fences doctor --json``: a row per chain, a column per
    scenario, unsafe outcomes in bold, and the median host time of a free over the row."""
    data = json.loads(path.read_text())
    env = data.get("environment") or {}
    meta = _env_meta(rel, env)
    meta["gpu"] = env.get("gpu") or data.get("device")
    meta["note"] = f"{data['trials']} trials per cell"
    cells = data["cells"]
    chains = list(dict.fromkeys(c["chain"] for c in cells))
    scenarios = list(dict.fromkeys(c["scenario"] for c in cells))
    by = {(c["chain"], c["scenario"]): c for c in cells}
    rows = []
    for ch in chains:
        row = [f"`{ch}`"]
        for s in scenarios:
            c = by.get((ch, s))
            label = c["label"].replace(",", ", ") if c else ""
            row.append(f"**{label}**" if c and c["outcome"] != "correct" else label)
        costs = [by[(ch, s)]["free_us"] for s in scenarios if by.get((ch, s), {}).get("free_us")]
        row.append(f"{statistics.median(costs):.1f}" if costs else "-")
        rows.append(row)
    names = [s.replace("_", " ") for s in scenarios]
    header = ["chain", *names, "free (us)"]
    lines = [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join(["---"] * (len(header) - 1) + ["---:"]) + " |",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return meta, "\n".join(lines)


def render_replay(path, rel, options):
    bodies = _tool("asv_bodies.py")
    return _env_meta(rel, _jsonl_environment(path)), bodies.table_replay(path)


def render_streams(path, rel, options):
    bodies = _tool("asv_bodies.py")
    return _env_meta(rel, _jsonl_environment(path)), bodies.table_streams(path)


def render_dataframes(path, rel, options):
    bodies = _tool("asv_bodies.py")
    return _env_meta(rel, _jsonl_environment(path)), bodies.table_dataframes(path)


def render_native(path, rel, options):
    """``tools/asv_bodies.py run native``'s tables; ``part=NAME`` (one of its NATIVE_PARTS:
    pairs, python, over, calls, floor, plan) renders that table alone."""
    bodies = _tool("asv_bodies.py")
    part = options.get("part")
    if part is not None and part not in bodies.NATIVE_PARTS:
        raise ValueError(f"part={part}: expected one of {', '.join(bodies.NATIVE_PARTS)}")
    return _env_meta(rel, _jsonl_environment(path)), bodies.table_native(path, part)


def render_reduce_plan(path, rel, options):
    """Rows {chain, n, ratio} of ``CubTempStoragePlanLoop.track_ratio_to_preallocated``: a row
    per chain, a column per n."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "ratio" in r]
    data = {(r["chain"], str(r["n"])): r["ratio"] for r in rows}
    chains = list(dict.fromkeys(k[0] for k in data))
    sizes = list(dict.fromkeys(k[1] for k in data))
    out = [
        [f"`{c}`", *[f"{data[(c, s)]:.3f}x" if (c, s) in data else "-" for s in sizes]]
        for c in chains
    ]
    body = table(["chain", *[_size(s, "") for s in sizes]], out)
    return _env_meta(rel, _jsonl_environment(path)), body


def render_stress(path, rel, options):
    """The summary lines of the native stress (``stress NAME, T threads, S s: exit C, {...}``)."""
    rows = []
    for line in path.read_text().splitlines():
        m = re.match(r"stress (\S+), (\d+) threads, ([\d.]+) s: exit (\d+), (\{.*\})$", line)
        if not m:
            continue
        r = ast.literal_eval(m.group(5))
        rows.append(
            [
                f"`{m.group(1)}`",
                m.group(2),
                f"{float(m.group(3)):.0f}",
                f"{r['iterations']:.3g}",
                str(r["out_of_memory"]),
                f"{r['cross_stream_frees']:.3g}",
                str(r["background_calls"]),
                f"**{r['errors']:.3g}**" if r["errors"] else "**0**",
            ]
        )
    header = [
        "resource",
        "threads",
        "seconds",
        "iterations",
        "out of memory",
        "cross-stream frees",
        "background calls",
        "wrong words",
    ]
    return _env_meta(rel, None), table(header, rows)


def render_torch_hazards(path, rel, options):
    env, rows = _tool("torch_report.py").load(path)
    return _env_meta(rel, env), _tool("torch_report.py").hazard_table(rows)


def render_torch_training(path, rel, options):
    env, rows = _tool("torch_report.py").load(path)
    if "model" in options:
        rows = [r for r in rows if r.get("model") == options["model"]]
    return _env_meta(rel, env), _tool("torch_report.py").train_table(rows)


def render_downstream(path, rel, options):
    """The counts table of a ``make downstream`` summary.md (without its suite column; option
    ``suite=NAME``: that suite's rows alone, where the run holds several), and the run's commit,
    versions, GPU and driver from the line under its title."""
    text = path.read_text()
    lines = text.splitlines()
    meta = _env_meta(rel, None)
    stamp_line = next((x for x in lines if "commit `" in x), "")
    m = re.search(r"commit `([0-9a-f]+)([^`]*)`; (.*?)(?:; GPU (.+), driver (\S+))?$", stamp_line)
    if m:
        meta["commit"] = m.group(1)[:8] + m.group(2)
        meta["versions"] = m.group(3)
        meta["gpu"], meta["driver"] = m.group(4), m.group(5)
    start = next(i for i, x in enumerate(lines) if x.startswith("| suite |"))
    rows = []
    for x in lines[start:]:
        if not x.startswith("|"):
            break
        cells = [c.strip() for c in x.strip("|").split("|")]
        if len(rows) < 2 or options.get("suite", cells[0]) == cells[0]:
            rows.append(cells[1:])
    keep = [i for i in range(len(rows[0])) if any(r[i] != "-" for r in rows[2:])]
    rows = [[r[i] for i in keep] for r in rows]
    out = ["| " + " | ".join(rows[0]) + " |", "|---|" + "---:|" * (len(rows[0]) - 1)]
    out += ["| " + " | ".join(r) + " |" for r in rows[2:]]
    return meta, "\n".join(out)


def _host_report(path, rel):
    """A host-model tool's report (tools/footprint_breakdown.py, tools/fence_calls.py,
    tools/rmm_pool_lists.py): its lines, and the commit and note from the line under its
    title."""
    lines = path.read_text().splitlines()
    meta = _env_meta(rel, None)
    m = re.search(
        r"commit `([0-9a-f]+)([^`]*)`; (.*)$", next((x for x in lines if "commit `" in x), "")
    )
    if m:
        meta["commit"] = m.group(1)[:8] + m.group(2)
        meta["note"] = m.group(3)
    return lines, meta


def _log_table(lines):
    """The report's first table, the one whose first column is the log."""
    start = next(i for i, x in enumerate(lines) if x.startswith("| log |"))
    return "\n".join(x for x in _table_at(lines, start))


def _multi_gpu():
    """benchmarks/rmm_fences_bench/multi_gpu.py, loaded alone (the package's __init__ needs
    its native loops, which rendering does not)."""
    return _load_file(ROOT / "benchmarks" / "rmm_fences_bench" / "multi_gpu.py", "_multi_gpu")


def render_dask_multi_gpu(path, rel, options):
    """benchmarks/dask_multi_gpu.py's ``--out`` file: the table of ``multi_gpu.render``."""
    multi_gpu = _multi_gpu()
    env, rows = multi_gpu.read_rows(path)
    return _env_meta(rel, env), "\n".join(multi_gpu.render(rows))


def render_host_table(path, rel, options):
    """The report of tools/fence_calls.py or tools/rmm_pool_lists.py: its table of logs, with
    the commit from the line under its title."""
    lines, meta = _host_report(path, rel)
    return meta, _log_table(lines)


def render_footprint(path, rel, options):
    """tools/footprint_breakdown.py's report: its summary table (``part=summary``, the default)
    or, ``part=places``, each log's census at the pool's peak, MiB per place (a row per log),
    with the commit from the line under its title."""
    lines, meta = _host_report(path, rel)
    part = options.get("part", "summary")
    if part == "summary":
        return meta, _log_table(lines)
    if part != "places":
        raise ValueError(f"part={part}: expected summary or places")
    rows, places = [], []
    for i, x in enumerate(lines):
        if x.startswith("## "):
            log = x[3:].strip()
            start = next(j for j in range(i, len(lines)) if lines[j].startswith("| place |"))
            cells = [[c.strip() for c in r.strip("|").split("|")] for r in _table_at(lines, start)]
            places = [c[0] for c in cells[2:]]
            rows.append([log, *[c[1] for c in cells[2:]]])
    out = ["| log | " + " | ".join(places) + " |", "|---|" + "---:|" * len(places)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return meta, "\n".join(out)


def _table_at(lines, start):
    """The lines of the markdown table that starts at ``lines[start]``."""
    for x in lines[start:]:
        if not x.startswith("|"):
            break
        yield x


KINDS = {
    **{kind: render_asv(kind) for kind in ASV_TABLES},
    "asv-summary": render_asv("asv-summary"),
    "doctor": render_doctor,
    "replay": render_replay,
    "streams": render_streams,
    "dataframes": render_dataframes,
    "native": render_native,
    "reduce-plan": render_reduce_plan,
    "stress": render_stress,
    "torch-hazards": render_torch_hazards,
    "torch-training": render_torch_training,
    "downstream": render_downstream,
    "footprint": render_footprint,
    "fence-calls": render_host_table,
    "rmm-pool-lists": render_host_table,
    "dask-multi-gpu": render_dask_multi_gpu,
}


def header(meta: dict) -> str:
    """The line that opens a rendered table: its data file, then what that file records of the
    run (commit, date, GPU, driver, package versions) and names what it does not."""

    def value(v):
        return ", ".join(f"{k} {x}" for k, x in v.items()) if isinstance(v, dict) else str(v)

    known, missing = [], []
    for key, label in (
        ("commit", "commit"),
        ("date", None),
        ("gpu", "GPU"),
        ("driver", "driver"),
        ("versions", "package versions"),
        ("note", None),
    ):
        v = meta.get(key)
        if v:
            known.append(value(v) if label is None else f"{label} {value(v)}")
        elif label is not None:
            missing.append(label)
    if len(missing) > 1:
        missing = [", ".join(missing[:-1]) + " and " + missing[-1]]
    parts = known + [f"{missing[0]} {NOT_RECORDED}"] if missing else known
    rel = meta["file"]
    link = rel.rstrip("/") + "/" if (DOCS / rel).is_dir() else rel
    return f"*Data: [{rel}]({link}); " + "; ".join(parts) + ".*"


# -- the pages ---------------------------------------------------------------------------------

BLOCK = re.compile(
    r"^<!-- table: (?P<kind>[\w-]+) (?P<path>\S+)(?P<options>(?: [\w]+=\S+)*) -->\n"
    r"(?P<body>.*?)"
    r"^<!-- /table -->$",
    re.M | re.S,
)
CHART = re.compile(
    r"^<!-- chart: (?P<kind>[\w-]+) (?P<path>\S+) -->\n!\[[^\]]*\]\((?P<png>[^)]+)\)$", re.M
)


def render(kind: str, rel: str, options: dict) -> str:
    meta, body = KINDS[kind](DOCS / rel, rel, options)
    return f"{header(meta)}\n\n{body}\n"


def render_page(text: str) -> str:
    """``text`` with every marked table rendered anew from its data."""

    def replace(m):
        options = dict(o.split("=", 1) for o in m.group("options").split())
        rendered = render(m.group("kind"), m.group("path"), options)
        opening = m.group(0).split("\n", 1)[0]
        return f"{opening}\n{rendered}<!-- /table -->"

    return BLOCK.sub(replace, text)


def marked_tables(text: str):
    """(kind, path, options, published body) of every marked table of a page."""
    for m in BLOCK.finditer(text):
        options = dict(o.split("=", 1) for o in m.group("options").split())
        yield m.group("kind"), m.group("path"), options, m.group("body")


def pages():
    return sorted(DOCS.glob("*.md"))


def check() -> list[str]:
    """The marked tables whose published text differs from what their data renders."""
    stale = []
    for page in pages():
        for kind, rel, options, body in marked_tables(page.read_text()):
            if render(kind, rel, options) != body:
                stale.append(f"{page.relative_to(ROOT)}: table {kind} {rel}")
    return stale


def charts(values, png: str):
    """The asv chart: native pair per chain and size, the CUB temp-storage loop over the
    preallocated floor, random allocations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.savefig(png, dpi=110)
    plt.close(fig)


def draw(kind: str, rel: str, png: pathlib.Path) -> None:
    """Redraws one marked chart."""
    path = DOCS / rel
    if kind == "asv":
        charts(load(str(path), "h200")[0], str(png))
    elif kind == "replay":
        _tool("asv_bodies.py").chart_replay(path, str(png))
    elif kind == "dask-multi-gpu":
        multi_gpu = _multi_gpu()
        multi_gpu.chart(multi_gpu.read_rows(path)[1], str(png))
    elif kind == "doctor":
        from rmm_fences._cli.doctor import Cell, plot

        cells = [
            Cell(**{k: v for k, v in c.items() if k not in ("outcome", "label")})
            for c in json.loads(path.read_text())["cells"]
        ]
        plot(cells, str(png))
    else:
        raise ValueError(f"no chart of kind {kind!r}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare, write nothing; 1 if stale")
    ap.add_argument("--charts", action="store_true", help="also redraw the marked charts")
    ap.add_argument("--results", metavar="DIR", help="print every asv table of a results folder")
    ap.add_argument("--machine", default="h200", help="with --results: the asv machine name")
    ap.add_argument("--png-dir", help="with --results: also draw the asv chart there")
    ap.add_argument("--stamp", metavar="DIR", help="record HEAD's environment in its results")
    args = ap.parse_args(argv)
    if args.stamp:
        for f in stamp(args.stamp):
            print(f"stamped {f}")
        return 0
    if args.results:
        values, _ = load(args.results, args.machine)
        print(report(values))
        if args.png_dir:
            charts(values, os.path.join(args.png_dir, f"asv_{args.machine}.png"))
        return 0
    if args.check:
        stale = check()
        for s in stale:
            print(f"stale: {s}")
        return 1 if stale else 0
    for page in pages():
        text = page.read_text()
        new = render_page(text)
        if new != text:
            page.write_text(new)
            print(f"rendered {page.relative_to(ROOT)}")
        if args.charts:
            for m in CHART.finditer(new):
                png = DOCS / m.group("png")
                draw(m.group("kind"), m.group("path"), png)
                print(f"drew {png.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
