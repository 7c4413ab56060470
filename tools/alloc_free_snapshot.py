# SPDX-License-Identifier: Apache-2.0
"""The bodies of the asv alloc/free and thread benchmarks, once, as JSON on stdout.

Runs whatever rmm_fences is importable, so two builds can be compared in one session on the
GPU host (run it once per build, alternating, and compare the ratios against rmm's pool that
each run measured itself):

    PYTHONPATH=/tmp/old python3 -P tools/alloc_free_snapshot.py --label before > before.json
    PYTHONPATH=/tmp/new python3 -P tools/alloc_free_snapshot.py --label after > after.json

The chains and sizes are asv_bench's (asv_bench/benchmarks/_common.py, alloc_free.py,
throughput.py); only the repetition counts are smaller. ``--compare BEFORE... -- AFTER...``
prints a markdown table of the snapshots (round by round, and as ratios against rmm's pool of
the same snapshot).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "asv_bench"))

from benchmarks._common import make, streams  # noqa: E402

DEFAULT_CHAINS = [
    "rmm_fences_pool",
    "rmm_pool",
    "cuda_async",
    "sync_on_free_deferred",
    "tracking_pool",
]
SIZES = [256, 1 << 20, 64 << 20]


COMPARED = [
    "native_pair_ns_256",
    "native_pair_ns_1048576",
    "native_pair_ns_67108864",
    "python_pair_us_1048576",
    "threads_1_pairs_per_s",
    "threads_8_pairs_per_s",
]


def compare(before_files, after_files):
    """Markdown: per chain and measure, each round's before -> after, and the mean ratio
    against rmm's pool of the same snapshot before and after."""
    load = lambda fs: [json.load(open(f))["results"] for f in fs]  # noqa: E731
    before, after = load(before_files), load(after_files)
    rounds = " | ".join(f"round {i + 1}" for i in range(len(before)))
    print(f"| chain | measure | {rounds} | / rmm_pool before | / rmm_pool after |")
    print("|---|---|" + "---:|" * (len(before) + 2))
    for chain in before[0]:
        if chain == "rmm_pool":
            continue
        for key in COMPARED:
            cells = " | ".join(
                f"{b[chain][key]:.4g} -> {a[chain][key]:.4g}" for b, a in zip(before, after)
            )
            rb = statistics.mean(b[chain][key] / b["rmm_pool"][key] for b in before)
            ra = statistics.mean(a[chain][key] / a["rmm_pool"][key] for a in after)
            print(f"| {chain} | {key} | {cells} | {rb:.3f} | {ra:.3f} |")
    for key in COMPARED:
        cells = " | ".join(
            f"{b['rmm_pool'][key]:.4g} -> {a['rmm_pool'][key]:.4g}" for b, a in zip(before, after)
        )
        print(f"| rmm_pool (peer) | {key} | {cells} | 1 | 1 |")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--compare":
        split = argv.index("--")
        return compare(argv[1:split], argv[split + 1 :])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", required=True)
    ap.add_argument("--chains", nargs="*", default=DEFAULT_CHAINS)
    args = ap.parse_args(argv)

    import rmm_fences

    from rmm_fences_bench import alloc_free_ns, python_pair_us, threaded_alloc_free

    out = {"label": args.label, "rmm_fences": rmm_fences.__file__, "results": {}}
    for chain in args.chains:
        mr = make(chain)
        _, (stream,) = streams()
        cupy_streams, _ = streams(8)
        row = {}
        for nbytes in SIZES:
            row[f"native_pair_ns_{nbytes}"] = statistics.median(
                alloc_free_ns(mr, nbytes, 20000, stream) for _ in range(3)
            )
            row[f"python_pair_us_{nbytes}"] = python_pair_us(mr, nbytes, stream)
        for threads in (1, 8):
            row[f"threads_{threads}_pairs_per_s"] = statistics.median(
                threaded_alloc_free(mr, 1 << 20, 20000, cupy_streams[:threads]) for _ in range(3)
            )
        out["results"][chain] = row
        print(
            f"{args.label} {chain}: " + ", ".join(f"{k}={v:.4g}" for k, v in row.items()),
            file=sys.stderr,
        )
        del mr
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
