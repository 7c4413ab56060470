# SPDX-License-Identifier: Apache-2.0
"""Run asv benchmark bodies once, without asv, as JSON lines; render them as markdown tables.

On a GPU machine, where asv's process per benchmark costs too much time, the
bodies of asv_bench/benchmarks/:

    python tools/asv_bodies.py run replay  > replay.jsonl   # asv's replay.py
    python tools/asv_bodies.py run streams > streams.jsonl  # asv's streams.py
    python tools/asv_bodies.py table replay  replay.jsonl
    python tools/asv_bodies.py table replay  replay.jsonl --png replay.png  # + chart
    python tools/asv_bodies.py table streams streams.jsonl
    python tools/asv_bodies.py run dataframes > dataframes.jsonl   # asv's dataframes.py
    python tools/asv_bodies.py table dataframes <file>.jsonl
    python tools/asv_bodies.py run native > native.jsonl  # alloc_free.py, reduce.py's plan loop
    python tools/asv_bodies.py table native native.jsonl

``run replay`` follows ``Replay``: one ordered replay of a fresh chain for the footprint, then
the free-running timed replays (``track_allocations_per_s``) and what the chain held by their
end (``footprint_after_mib``; the table adds "-> N MiB" where that is more); with ``--rounds N``
it runs that whole grid N times, and the table gives each chain's median calls/s, ratios taken
within each round (their median), and a third table with the range of the ratios of the pool
over CudaAsync, the tracker over the pool and deferred SyncOnFree over rmm's pool (its
upstream); ``run streams`` calls
``CrossStream``, ``StreamPerTask`` (three timed rounds) and reads the pool's stream slots
after 100, 2 000 and 20 000 short-lived streams (``StreamSlots``' measure at three counts);
``run dataframes`` sets up ``CudfPipeline`` and ``PdsH`` per parameter (a warm-up run under the
footprint meter) and times ``--rounds`` runs (default ``ROUNDS``; ``--resume FILE`` appends to
an interrupted run's FILE, leaving out the cases it holds); the chains of one parameter follow
each other, so that they see the same state of the machine. ``run native`` measures
``AllocFree`` (the native pair: the median of three loops; the Python pair: the median of
three timed calls), ``DeferredFence``, ``TrackingOverhead``, ``FenceCalls`` (on a created
stream, as the pairs), ``PageCalls`` (what moving a page of ``vmm_pool`` costs),
``CorePairs`` (the policy cores' pair alone, over platforms without CUDA calls) and
``CubTempStoragePlanLoop``'s ratio to the preallocated call; its table adds where the pair of
the rmm_fences pool, of the tracker over it and of deferred SyncOnFree is made of
(``FLOOR_CHAINS``), each part timed alone: the stream lookups' CUDA calls (the pool:
``cuStreamIsCapturing`` and ``cuStreamGetId`` in the allocation and in the free), the fence
records and the core alone (its cache, locks and lists). The first line of every run is
``{"environment": ...}``: the commit, GPU, driver and package versions it ran on, which
tools/asv_report.py prints above the tables it renders from the file.
"""

import argparse
import functools
import itertools
import json
import os
import pathlib
import statistics
import subprocess
import sys

ASV = pathlib.Path(__file__).resolve().parents[1] / "asv_bench"


def checkout_commit() -> str | None:
    """The checkout's commit, with "+uncommitted changes" when its tracked files differ from
    it; None outside a git checkout. ``RMM_FENCES_COMMIT`` in the environment overrides it,
    for a copy of the checkout whose git metadata is not its files' (as tools/downstream/run.py
    reads it)."""
    if os.environ.get("RMM_FENCES_COMMIT"):
        return os.environ["RMM_FENCES_COMMIT"]
    root = ASV.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+uncommitted changes" if dirty else "")


def recorded_environment() -> dict:
    """What a run here runs on: the checkout's commit (``checkout_commit``), the GPU, the
    driver and the package versions."""
    from rmm_fences._cuda import environment

    return {"commit": checkout_commit(), **environment()}


def _run_body(bench, args, row, out, measure):
    """Sets ``bench`` up with ``args``, adds what ``measure(bench, *args)`` returns to ``row``
    (or why the benchmark skipped), tears it down and prints the row."""
    try:
        bench.setup(*args)
        row.update(measure(bench, *args))
    except NotImplementedError as exc:
        row["skipped"] = str(exc)
    finally:
        if hasattr(bench, "teardown"):
            bench.teardown(*args)
    print(json.dumps(row), file=out, flush=True)


def _run_grid(bench, grid, out, measure):
    """``_run_body`` for every case of ``grid`` ({parameter name: values}, in that order): a
    fresh ``bench()`` per case, its row named by the class and the case's parameters."""
    for case in itertools.product(*grid.values()):
        row = {"bench": bench.__name__, **dict(zip(grid, case))}
        _run_body(bench(), case, row, out, measure)


def run_replay(out, rounds=1):
    """``rounds`` > 1: the whole grid (every log under every chain, a fresh chain each time)
    that many times, each row carrying its ``round``: the chains of one log follow each other in
    every round, so that a ratio taken within a round compares chains run moments apart."""
    from benchmarks import replay as R

    def measure(b, trace, chain):
        row = dict(
            alloc_per_s=b.track_allocations_per_s(trace, chain),
            footprint_mib=b.track_footprint_mib(trace, chain),
            fragmentation=b.track_fragmentation(trace, chain),
            ordered_peak_live=b.first["peak_live_bytes"],
            trace_peak_live=b.first["trace_peak_live_bytes"],
            errors=b.first["errors"],
        )
        after = b.timed["footprint_bytes"]  # the timed replays' high-water, the first's included
        row["footprint_after_mib"] = None if after is None else after / 2**20
        try:
            row["event_records_per_free"] = b.track_event_records_per_free(trace, chain)
        except NotImplementedError:
            pass  # its top resource counts no events
        stats = getattr(b.mr, "stats", None)
        if isinstance(stats, dict):
            row["stats"] = {k: v for k, v in stats.items() if isinstance(v, (int, float))}
        return row

    for k in range(rounds):
        for trace in R.trace_names():
            for chain in R.CHAINS:
                row = {"trace": trace, "chain": chain, **({"round": k} if rounds > 1 else {})}
                _run_body(R.Replay(), (trace, chain), row, out, measure)


def run_streams(out):
    from benchmarks import streams as S
    from benchmarks._common import make

    for chain in S._POOLS:
        for nbytes in (1 << 20, 64 << 20):
            b = S.CrossStream()
            b.setup(chain, nbytes)
            row = {
                "bench": "CrossStream",
                "chain": chain,
                "nbytes": nbytes,
                "cross_pair_ns": b.track_pair_ns(chain, nbytes),
                "same_pair_ns": b.track_same_stream_pair_ns(chain, nbytes),
            }
            print(json.dumps(row), file=out, flush=True)
        b = S.StreamPerTask()
        b.setup(chain)
        row = {
            "bench": "StreamPerTask",
            "chain": chain,
            "task_us": [b.track_task_us(chain) for _ in range(3)],
        }
        print(json.dumps(row), file=out, flush=True)
    mr = make("rmm_fences_pool")
    for tasks in (100, 2000, 20000):
        S._tasks(mr, tasks)
        stats = {k: v for k, v in mr.stats.items() if isinstance(v, (int, float))}
        row = {
            "bench": "StreamSlots",
            "after_tasks": tasks,
            "stream_slots": stats["stream_slots"],
            "pool_mib": stats["pool_bytes"] / 2**20,
            "stats": stats,
        }
        print(json.dumps(row), file=out, flush=True)


def run_native(out):
    import time

    from benchmarks import alloc_free as A
    from benchmarks import reduce as Rd
    from benchmarks._common import CHAINS, streams

    def pair(b, chain, nbytes):
        native = statistics.median(b.track_native_pair_ns(chain, nbytes) for _ in range(3))
        python = []
        for _ in range(3):
            t0 = time.perf_counter()
            b.time_python_pairs(chain, nbytes)
            python.append((time.perf_counter() - t0) / A.PAIRS * 1e6)
        return {"native_ns": native, "python_us": statistics.median(python)}

    _run_grid(A.AllocFree, {"chain": CHAINS, "nbytes": A.SIZES}, out, pair)
    _run_grid(
        A.DeferredFence,
        {"upstream": A.DeferredFence.params[0], "nbytes": A.SIZES},
        out,
        lambda b, u, n: {"ns": b.track_cost_per_free_ns(u, n)},
    )
    _run_grid(
        A.TrackingOverhead,
        {"upstream": A.UPSTREAMS},
        out,
        lambda b, u: {
            "native_ratio": b.track_native_ratio(u),
            "python_ratio": b.track_python_ratio(u),
        },
    )

    def calls(b, _call):  # every call at once, on a created stream as the pairs
        from rmm_fences_bench import fence_call_ns

        _, (stream,) = streams()
        return {"ns": fence_call_ns(stream=stream)}

    def pages(b, _call):  # every call at once
        from rmm_fences_bench import page_call_ns

        return {"ns": page_call_ns()}

    _run_body(A.FenceCalls(), ("cu_stream_get_id",), {"bench": "FenceCalls"}, out, calls)
    _run_body(A.PageCalls(), ("map",), {"bench": "PageCalls"}, out, pages)
    _run_grid(
        A.CorePairs,
        {"core": A.CorePairs.params[0], "nbytes": A.SIZES},
        out,
        lambda b, c, n: b.measure(c, n),
    )
    _run_grid(
        Rd.CubTempStoragePlanLoop,
        {"chain": ["preallocated", *CHAINS], "n": Rd.SIZES},
        out,
        lambda b, c, n: {"ratio": b.track_ratio_to_preallocated(c, n), "floor_us": b.floor_us},
    )


#: Timed runs per benchmark parameter and chain in ``run dataframes`` (the median is reported).
ROUNDS = 5


def run_dataframes(out, rounds=ROUNDS, done=()):
    """``done``: the (bench, param, chain) cases to leave out (those an earlier, interrupted
    run already wrote)."""
    import time

    from benchmarks import dataframes as D

    def measure(b, param, chain):
        timed = b.time_pipeline if isinstance(b, D.CudfPipeline) else b.time_query
        seconds = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            timed(param, chain)
            seconds.append(time.perf_counter() - t0)
        peak = b.track_peak_mib(param, chain)
        return {"seconds": statistics.median(seconds), "rounds": seconds, "peak_mib": peak}

    cases = [("CudfPipeline", rows) for rows in D.ROWS] + [("PdsH", q) for q in D.QUERIES]
    for bench, param in cases:
        for chain in D.SPECS:
            if (bench, param, chain) in done:
                continue
            row = {"bench": bench, "param": param, "chain": chain}
            _run_body(getattr(D, bench)(), (param, chain), row, out, measure)


def table_dataframes(path):
    """Per benchmark parameter: each chain's median time and peak over CudaAsync's; then the
    median and largest time ratio over the PDS-H queries."""
    by = {}
    for r in _rows(path):
        if "skipped" not in r:
            by.setdefault((r["bench"], r["param"]), {})[r["chain"]] = r
    chains = [c for c in next(iter(by.values())) if c != "cuda_async"] if by else []
    head = " | ".join(f"{c}: time, peak" for c in chains)
    lines = [
        f"| benchmark | CudaAsync s | CudaAsync peak MiB | {head} |",
        "|---|---:|---:|" + "---:|" * len(chains),
    ]
    ratios = {c: [] for c in chains}  # PDS-H: (over CudaAsync, over rmm's pool)
    for (bench, param), d in by.items():
        base = d["cuda_async"]
        cells = []
        for c in chains:
            t = d[c]["seconds"] / base["seconds"]
            if bench == "PdsH":
                ratios[c].append((t, d[c]["seconds"] / d["rmm_pool"]["seconds"]))
            peak = d[c]["peak_mib"]
            share = "-" if peak is None else f"{peak / base['peak_mib']:.2f}x"
            cells.append(f"{t:.3f}x, {share}")
        name = f"cuDF pipeline {param:,} rows" if bench == "CudfPipeline" else f"PDS-H q{param}"
        lines.append(
            f"| {name} | {base['seconds']:.3f} | {base['peak_mib']:.0f} | "
            + " | ".join(cells)
            + " |"
        )
    if any(ratios.values()):
        lines += [
            "",
            "| chain | PDS-H time / CudaAsync: median | largest | / rmm's pool: median | largest |",
            "|---|---:|---:|---:|---:|",
        ]
        for c, v in ratios.items():
            if v:
                a, p = [x for x, _ in v], [y for _, y in v]
                lines.append(
                    f"| {c} | {statistics.median(a):.3f}x | {max(a):.3f}x "
                    f"| {statistics.median(p):.3f}x | {max(p):.3f}x |"
                )
    return "\n".join(lines)


#: The parts of ``table native``, in order (``part=`` of tools/asv_report.py's kind ``native``).
NATIVE_PARTS = ("pairs", "python", "over", "calls", "floor", "pages", "plan")


def size_label(n, suffix="B"):
    """1048576 (or "1048576") -> "1 MiB" (bytes) or "1 Mi" (an element count, suffix "")."""
    n = int(n)
    for unit, k in (("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}{suffix}"
    return f"{n} {suffix}".strip()


def number(x):
    """A measurement as the docs' tables print it: three significant digits from 1e5, one
    decimal from 10, else two."""
    if x >= 1e5:
        return f"{x:.3g}"
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def _per_size(values, peers, suffix="B", fmt=number):
    """{(chain, size): value} as a row per chain, a column per size; each cell the value and
    its ratio to each peer of the same size."""
    chains = list(dict.fromkeys(c for c, _ in values))
    sizes = list(dict.fromkeys(n for _, n in values))
    lines = [
        "| chain | " + " | ".join(size_label(n, suffix) for n in sizes) + " |",
        "|---|" + "---:|" * len(sizes),
    ]
    for c in chains:
        cells = []
        for n in sizes:
            v = values.get((c, n))
            if v is None:
                cells.append("-")
                continue
            ratios = [
                "1x" if p == c else f"{v / values[(p, n)]:.2f}x"
                for p in peers
                if values.get((p, n))
            ]
            cells.append(fmt(v) + (f" ({' / '.join(ratios)})" if ratios else ""))
        lines.append(f"| `{c}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _over(fences, tracked):
    """What deferred SyncOnFree adds to its upstream's pair at each size (rows without a size
    are of 1 MiB) and what the tracker's 1 MiB pair costs over its upstream's, per upstream."""
    sizes = [256, 1 << 20, 64 << 20]
    added = {(r["upstream"], r.get("nbytes", 1 << 20)): r["ns"] for r in fences}
    ratios = {r["upstream"]: r for r in tracked}
    lines = [
        "| over its upstream | "
        + " | ".join(f"deferred SyncOnFree {size_label(n)}, ns" for n in sizes)
        + " | tracker, native pair | tracker, Python pair |",
        "|---|" + "---:|" * (len(sizes) + 2),
    ]
    for u in dict.fromkeys([*(u for u, _ in added), *ratios]):
        t = ratios.get(u)
        cells = [number(added[(u, n)]) if (u, n) in added else "-" for n in sizes]
        cells += [f"{t[k]:.2f}x" if t else "-" for k in ("native_ratio", "python_ratio")]
        lines.append(f"| `{u}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table_native(path, part=None):
    """The tables of ``run native`` (``part``: one of NATIVE_PARTS; None: all, in order)."""
    rows = [r for r in _rows(path) if "skipped" not in r]
    by = {}
    for r in rows:
        by.setdefault(r["bench"], []).append(r)
    pairs = by.get("AllocFree", [])
    peers = ("rmm_pool", "cuda_async")
    calls = next((r["ns"] for r in by.get("FenceCalls", [])), {})
    parts = {}
    parts["pairs"] = _per_size({(r["chain"], r["nbytes"]): r["native_ns"] for r in pairs}, peers)
    parts["python"] = _per_size({(r["chain"], r["nbytes"]): r["python_us"] for r in pairs}, peers)
    parts["over"] = _over(by.get("DeferredFence", []), by.get("TrackingOverhead", []))
    parts["calls"] = "\n".join(
        ["| CUDA call | ns |", "|---|---:|"]
        + [f"| `{k}` | {number(v)} |" for k, v in calls.items() if v]
    )
    parts["floor"] = _floor(pairs, calls, by.get("CorePairs", []))
    page = next((r["ns"] for r in by.get("PageCalls", [])), {})
    lines = ["| driver call | ns |", "|---|---:|"]
    if page.get("page"):
        size = size_label(int(page["page"]))
        lines += [
            f"| `cuMem{k[0].upper()}{k[1:]}` | {number(page[k])} |"
            for k in ("create", "map", "unmap", "release")
        ]
        lines.append(f"| `cuMemSetAccess` (a range of 64 pages) | {number(page['set_access'])} |")
        lines.append(
            f"| a page of {size} moved (unmap + map) | {number(page['unmap'] + page['map'])} |"
        )
    parts["pages"] = "\n".join(lines)
    plan = {(r["chain"], r["n"]): r["ratio"] for r in by.get("CubTempStoragePlanLoop", [])}
    parts["plan"] = _per_size(plan, (), suffix="", fmt=lambda x: f"{x:.3f}x")
    floors = {}  # the bare call's time per size, over the rounds of every chain (newer runs)
    for r in by.get("CubTempStoragePlanLoop", []):
        if "floor_us" in r:
            floors.setdefault(r["n"], []).append(r["floor_us"])
    if floors:
        cells = [
            number(statistics.median(floors[n])) if n in floors else "-"
            for n in dict.fromkeys(n for _, n in plan)
        ]
        parts["plan"] += "\n| the preallocated call itself, us | " + " | ".join(cells) + " |"
    if part is not None:
        return parts[part]
    return "\n\n".join(parts[p] for p in NATIVE_PARTS)


#: Per chain of the floor table: its policy core, and the CUDA calls of its two stream lookups
#: (one in allocate, one in deallocate) as (call, count) pairs of ``fence_call_ns``'s fields.
# the pool: cuStreamIsCapturing then cuStreamGetId, in each call
_POOL_LOOKUPS = (("cu_stream_is_capturing", 2), ("cu_stream_get_id", 2))
FLOOR_CHAINS = {
    "rmm_fences_pool": ("pool", _POOL_LOOKUPS),
    # deferred SyncOnFree: the allocation's take-back asks the capture state and the identity,
    # the free the capture state
    "sync_on_free_deferred": (
        "sync_on_free",
        (("cu_stream_is_capturing", 2), ("cu_stream_get_id", 1)),
    ),
    # the tracker over the pool: the pool's lookups (a same-stream free over a stream-ordered
    # upstream makes no CUDA call of the tracker's)
    "tracking_pool": ("tracking_pool", _POOL_LOOKUPS),
}


def _floor(pairs, calls, cores):
    """What a pair is made of, per chain of ``FLOOR_CHAINS`` and size, each part timed alone:
    its stream lookups' CUDA calls, its fence records (the core's fences per pair at
    ``cu_event_record``) and the policy core (``CorePairs``). Timed alone the parts may add up
    to more than the pair, whose calls the CPU overlaps: the table names the floor, it does not
    split the pair's time."""
    core = {(r["core"], r["nbytes"]): r for r in cores if "ns" in r}
    lines = [
        "| chain | block | pair ns | stream lookups' CUDA calls ns | fence records ns "
        "| the core alone ns |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in pairs:
        if r["chain"] not in FLOOR_CHAINS or not calls:
            continue
        name, lookups = FLOOR_CHAINS[r["chain"]]
        c = core.get((name, r["nbytes"]))
        cells = [
            number(r["native_ns"]),
            number(sum(calls.get(k, 0) * n for k, n in lookups)),
            number(c["fences_per_pair"] * calls.get("cu_event_record", 0)) if c else "-",
            number(c["ns"]) if c else "-",
        ]
        lines.append(f"| `{r['chain']}` | {size_label(r['nbytes'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _rows(path):
    """The measured rows of a file (its environment line left out)."""
    rows = (json.loads(line) for line in open(path) if line.strip())
    return [r for r in rows if "environment" not in r]


def _by_trace(path):
    """The replay rows of ``path`` as {trace: {chain: row}}, in file order. A run of several
    rounds gives one row per chain and log: the first round's, with ``alloc_per_s`` the median
    over the rounds, ``rates`` the rounds' values in order, and ``footprint_after_mib`` the
    largest."""
    rounds = {}
    for r in _rows(path):
        rounds.setdefault(r["trace"], {}).setdefault(r["chain"], []).append(r)
    by = {}
    for trace, chains in rounds.items():
        for chain, rows in chains.items():
            row = dict(rows[0])
            if "alloc_per_s" in row:
                row["rates"] = [x["alloc_per_s"] for x in rows]
                row["alloc_per_s"] = statistics.median(row["rates"])
            afters = [x.get("footprint_after_mib") for x in rows]
            if all(a is not None for a in afters):
                row["footprint_after_mib"] = max(afters)
            by.setdefault(trace, {})[chain] = row
    return by


def _rate_ratio(chain_row, peer_row):
    """``chain_row``'s calls/s over ``peer_row``'s: the median of the ratios taken within each
    round (one round: the plain ratio), and their smallest and largest."""
    ratios = [a / b for a, b in zip(chain_row["rates"], peer_row["rates"])]
    return statistics.median(ratios), min(ratios), max(ratios)


def _replay_cell(row):
    """Calls/s and footprint of one chain on one log; "-> N MiB" when the chain held more by
    the end of the timed replays than in the ordered one."""
    cell = f"{row['alloc_per_s'] / 1e6:.2f} M, {row['footprint_mib']:.0f} MiB"
    after = row.get("footprint_after_mib")
    if after is not None and round(after) > round(row["footprint_mib"]):
        cell += f" -> {after:.0f} MiB"
    return cell


def table_replay(path):
    by = _by_trace(path)
    lines = [
        "| trace | peak live MiB | rmm_fences pool calls/s | / rmm's pool | / CudaAsync "
        "| footprint MiB: rmm_fences pool | rmm's pool | CudaAsync | / rmm's pool "
        "| errors (all chains) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for trace, d in by.items():
        f, p, a = d["rmm_fences_pool"], d["rmm_pool"], d["cuda_async"]
        errors = sum(r.get("errors", 0) for r in d.values())
        rate = f["alloc_per_s"]
        lines.append(
            f"| {trace} | {f['trace_peak_live'] / 2**20:.0f} | {rate / 1e6:.2f} M "
            f"| {_rate_ratio(f, p)[0]:.1f}x | {_rate_ratio(f, a)[0]:.1f}x "
            f"| {f['footprint_mib']:.0f} | {p['footprint_mib']:.0f} | {a['footprint_mib']:.0f} "
            f"| {f['footprint_mib'] / p['footprint_mib']:.2f}x | {errors} |"
        )
    chains = list(next(iter(by.values())))
    lines += ["", "| trace | " + " | ".join(chains) + " |", "|---|" + "---:|" * len(chains)]
    for trace, d in by.items():
        cells = [_replay_cell(d[c]) for c in chains]
        lines.append(f"| {trace} | " + " | ".join(cells) + " |")
    rounds = max((len(r.get("rates", ())) for d in by.values() for r in d.values()), default=0)
    if rounds > 1:
        lines += _replay_round_ratios(by, rounds)
    return "\n".join(lines)


#: The calls/s ratios of a run of several rounds: (chain, peer, heading).
ROUND_RATIOS = (
    ("rmm_fences_pool", "cuda_async", "rmm_fences pool / CudaAsync"),
    ("tracking_pool", "rmm_fences_pool", "tracker / rmm_fences pool"),
    ("sync_on_free_deferred", "rmm_pool", "SyncOnFree deferred / rmm's pool (its upstream)"),
)


def _replay_round_ratios(by, rounds):
    """Per log, each ratio of ``ROUND_RATIOS``: the median of the per-round ratios, then their
    range."""
    pairs = [r for r in ROUND_RATIOS if all(r[0] in d and r[1] in d for d in by.values())]
    lines = [
        "",
        f"| trace ({rounds} rounds) | " + " | ".join(h for _, _, h in pairs) + " |",
        "|---|" + "---:|" * len(pairs),
    ]
    for trace, d in by.items():
        cells = []
        for chain, peer, _ in pairs:
            median, low, high = _rate_ratio(d[chain], d[peer])
            cells.append(f"{median:.2f}x ({low:.2f}-{high:.2f})")
        lines.append(f"| {trace} | " + " | ".join(cells) + " |")
    return lines


def chart_replay(path, png):
    """Two panels per trace: rmm_fences' pool's calls/s over rmm's pool's and CudaAsync's (log),
    and its footprint over rmm's pool's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    by = _by_trace(path)
    traces = list(by)
    x = range(len(traces))
    fig, (speed, room) = plt.subplots(1, 2, figsize=(14, 4.5))
    for i, (peer, label) in enumerate(
        (("rmm_pool", "over rmm's pool"), ("cuda_async", "over CudaAsync"))
    ):
        ratios = [_rate_ratio(by[t]["rmm_fences_pool"], by[t][peer])[0] for t in traces]
        speed.bar([j + i * 0.4 for j in x], ratios, 0.4, label=label)
    speed.set_yscale("log")
    speed.set_ylim(bottom=1.0)
    speed.set_yticks([1, 1.5, 2, 3, 5, 10, 20], ["1x", "1.5x", "2x", "3x", "5x", "10x", "20x"])
    speed.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    speed.set_ylabel("rmm_fences pool calls/s over the peer's (log)")
    speed.legend(fontsize=8)
    room.bar(
        list(x),
        [
            by[t]["rmm_fences_pool"]["footprint_mib"] / by[t]["rmm_pool"]["footprint_mib"]
            for t in traces
        ],
        0.6,
        color="tab:green",
    )
    room.axhline(1.0, color="black", linewidth=0.8)
    room.set_ylabel("footprint / rmm's pool's")
    for ax, shift in ((speed, 0.2), (room, 0.0)):
        ax.set_xticks([j + shift for j in x], traces, rotation=30, ha="right", fontsize=8)
    fig.suptitle(f"Replay of the allocation logs ({pathlib.Path(path).name})")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def table_streams(path):
    rows = _rows(path)
    lines = [
        "| chain | block | cross-stream pair ns | same-stream pair ns | a task (new stream) us |",
        "|---|---:|---:|---:|---:|",
    ]
    tasks = {r["chain"]: r["task_us"] for r in rows if r["bench"] == "StreamPerTask"}
    for r in rows:
        if r["bench"] == "CrossStream":
            t = ", ".join(f"{x:.1f}" for x in tasks[r["chain"]]) if r["nbytes"] == 1 << 20 else ""
            lines.append(
                f"| {r['chain']} | {r['nbytes'] >> 20} MiB | {r['cross_pair_ns']:.0f} "
                f"| {r['same_pair_ns']:.0f} | {t} |"
            )
    lines += [
        "",
        "| short-lived streams so far | stream slots held | pool MiB |",
        "|---:|---:|---:|",
    ]
    total = 0
    for r in rows:
        if r["bench"] == "StreamSlots":
            total += r["after_tasks"]
            lines.append(f"| {total} | {r['stream_slots']} | {r['pool_mib']:.0f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the bodies on a GPU host: JSON lines on stdout")
    run.add_argument("what", choices=["replay", "streams", "dataframes", "native"])
    run.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=f"dataframes: timed runs (default {ROUNDS}); replay: rounds of the whole grid "
        "(default 1), ratios then taken within each round",
    )
    run.add_argument(
        "--resume",
        metavar="FILE",
        help="dataframes: leave out the cases FILE (an interrupted run's output) holds; "
        "print no environment line when FILE has one",
    )
    table = sub.add_parser("table", help="markdown tables from a JSON-lines file")
    table.add_argument("what", choices=["replay", "streams", "dataframes", "native"])
    table.add_argument("path")
    table.add_argument("--png", help="replay only: also write the chart to this file (matplotlib)")
    args = parser.parse_args(argv)
    if args.command == "run":
        sys.path.insert(0, str(ASV))
        if args.rounds is not None and args.rounds < 1:
            parser.error(f"--rounds {args.rounds}: expected a positive number of runs")
        if args.rounds is not None and args.what not in ("dataframes", "replay"):
            parser.error("--rounds: only for dataframes and replay")
        if args.resume and args.what != "dataframes":
            parser.error("--resume: only for dataframes")
        resumed = pathlib.Path(args.resume) if args.resume else None
        written = []  # the rows of the interrupted run's file
        if resumed is not None and resumed.is_file():
            written = [json.loads(x) for x in resumed.read_text().splitlines() if x.strip()]
        done = {(r["bench"], r["param"], r["chain"]) for r in written if "bench" in r}
        runs = {
            "replay": functools.partial(run_replay, rounds=args.rounds or 1),
            "streams": run_streams,
            "dataframes": functools.partial(
                run_dataframes, rounds=args.rounds or ROUNDS, done=done
            ),
            "native": run_native,
        }
        if not any("environment" in r for r in written):
            print(json.dumps({"environment": recorded_environment()}), flush=True)
        runs[args.what](sys.stdout)
    else:
        tables = {
            "replay": table_replay,
            "streams": table_streams,
            "dataframes": table_dataframes,
            "native": table_native,
        }
        print(tables[args.what](args.path))
        if args.png:
            if args.what != "replay":
                parser.error("--png: only the replay table has a chart")
            chart_replay(args.path, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
