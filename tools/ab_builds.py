# SPDX-License-Identifier: Apache-2.0
"""Two installed builds of rmm_fences, A and B, compared at fine grain on one GPU host:

    python tools/ab_builds.py SITE_A SITE_B ROUNDS > ab.jsonl   # SITE: a --target install dir
    python tools/ab_builds.py --summary ab.jsonl

Two worker processes (one per build, pinned to the same CPU, ``CPU``: 5) answer one measurement
at a time, in turn (which goes first alternates by round), so that a change in the machine's
load hits both alike: each line holds one measurement of both builds, and the summary gives the
median of B/A and its quartiles. Measured: the native allocate+deallocate pair (50 000 pairs on
a created stream) of the pool, the tracker over the pool and rmm's pool (a control: the same
code in both builds, its ratio shows the method's noise) at 1 MiB and 64 MiB, then each
recorded allocation log replayed through rmm_fences' pool (asv's ``Replay``, one call with its
three repetitions per measurement; the chains of one log are made, measured and dropped before
the next, so that one process never holds every log's pool). Each log is replayed twice: as
asv does (each call makes the log's streams anew, so the pool sees new streams every call)
and with streams made once and kept, as in the program the log was recorded from. The timing
loops and the replay engine are the checkout's (benchmarks/, built in place by ``make install``),
one build of them for both sites: only the resources differ.
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
from collections import defaultdict

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAIRS = ["pool(cuda_async)", "tracking(pool(cuda_async), on_hazard=record)", "rmm_pool(cuda_async)"]
WORKER = r"""
import gc, json, sys
sys.path[:0] = ["benchmarks", "asv_bench"]  # rmm_fences_bench; asv's suite
import rmm
from rmm_fences import compose  # the function, in every build
from rmm_fences_bench import alloc_free_ns, replay
from benchmarks import replay as R
stream = rmm.pylibrmm.stream.Stream()
mrs, reps = {}, {}
for line in sys.stdin:
    q = json.loads(line)
    if "pair" in q:
        mr = mrs.get(q["pair"]) or mrs.setdefault(q["pair"], compose(q["pair"]))
        v = alloc_free_ns(mr, q["nbytes"], 50000, stream)
    elif "drop" in q:
        reps.clear(); gc.collect(); v = 0
    else:
        key = (q["replay"], q["chain"])
        if key not in reps:
            b = R.Replay(); b.setup(*key); reps[key] = b
            b.kept = [rmm.pylibrmm.stream.Stream() for _ in b.trace.stream_handles]
        b = reps[key]
        if q.get("kept_streams"):  # the recorded program's streams live across replays
            v = replay(b.mr, b.trace, streams=b.kept, repeat=b.repeat_replays)
            v = v["allocations_per_s"]
        else:  # asv's measurement: each replay makes its streams
            v = b.track_allocations_per_s(*key)
    print(json.dumps(v), flush=True)
"""


def _start(site):
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")]))
    )
    cmd = ["taskset", "-c", os.environ.get("CPU", "5"), sys.executable, "-P", "-c", WORKER]
    return subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )


def _ask(worker, query):
    worker.stdin.write(json.dumps(query) + "\n")
    worker.stdin.flush()
    line = worker.stdout.readline()
    if not line:
        raise RuntimeError(f"a worker stopped on {query}")
    return json.loads(line)


def run(site_a, site_b, rounds, out=sys.stdout):
    a, b = _start(site_a), _start(site_b)

    def block(queries):
        for q in queries:  # warm both
            _ask(a, q)
            _ask(b, q)
        for r in range(rounds):
            first, second = (a, b) if r % 2 == 0 else (b, a)
            for q in queries:
                x, y = _ask(first, q), _ask(second, q)
                va, vb = (x, y) if first is a else (y, x)
                print(json.dumps({"round": r, **q, "a": va, "b": vb}), file=out, flush=True)
        _ask(a, {"drop": 1})
        _ask(b, {"drop": 1})

    block([{"pair": s, "nbytes": n} for s in PAIRS for n in (1 << 20, 64 << 20)])
    for trace in sorted(p.name[:-7] for p in (ROOT / "asv_bench" / "traces").glob("*.csv.gz")):
        q = {"replay": trace, "chain": "rmm_fences_pool"}
        block([q, {**q, "kept_streams": True}])
    for w in (a, b):
        w.stdin.close()
        w.wait()


def summary(rows):
    """Lines of the summary: per measurement, the median of B/A and its quartiles."""
    ratios = defaultdict(list)
    for r in rows:
        key = (
            (r["pair"], f"{r['nbytes'] >> 20} MiB pair ns")
            if "pair" in r
            else (
                r["replay"],
                "replay calls/s" + (", streams kept" if r.get("kept_streams") else ""),
            )
        )
        ratios[key].append(r["b"] / r["a"])
    lines = ["| measured | what | B/A median | quartiles | rounds |", "|---|---|---:|---|---:|"]
    for (name, what), v in ratios.items():
        v = sorted(v)
        q1, q3 = v[len(v) // 4], v[(3 * len(v)) // 4]
        lines.append(
            f"| {name} | {what} | {statistics.median(v):.3f} | {q1:.3f}-{q3:.3f} | {len(v)} |"
        )
    return lines


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--summary"]:
        rows = [json.loads(line) for line in open(argv[1]) if line.strip()]
        print("\n".join(summary(rows)))
        return 0
    if len(argv) != 3:
        sys.exit(__doc__)
    run(argv[0], argv[1], int(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
