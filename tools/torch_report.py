# SPDX-License-Identifier: Apache-2.0
"""PyTorch under each allocator, each run in its own process, as JSON and a markdown table
(docs/torch.md):

    python tools/torch_report.py hazards --json docs/data/torch/hazards.json [--trials 20]
    python tools/torch_report.py train --json docs/data/torch/training.json [--steps 10]

``hazards``: the record_stream patterns of asv_bench/benchmarks/_torch_workloads.py (``hazard``)
under every allocator: checksums corrupted, and what rmm_fences' allocator counted.
``train``: steps per second and peak device memory of each model under every allocator, with
ratios against PyTorch's caching allocator from the same run.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "asv_bench" / "benchmarks"))

import _torch_workloads as workloads  # noqa: E402

HAZARD_ALLOCATORS = ["torch", "rmm_async", "rmm_pool", "fences_pool", "fences_tracker"]


def _run(command, allocator):
    try:
        return workloads.run(command, allocator, timeout=900)
    except RuntimeError as exc:
        print(f"{command} failed: {exc}", file=sys.stderr)
        return {"error": str(exc)[-2000:]}


def hazards(trials: int) -> tuple[list, str]:
    rows, lines = (
        [],
        [
            "| allocator | pattern | corrupted | record_stream calls | stream waits | "
            "hazards reported |",
            "| --- | --- | ---: | ---: | ---: | --- |",
        ],
    )
    for pattern in workloads.PATTERNS:
        for allocator in HAZARD_ALLOCATORS:
            out = _run(["hazard", allocator, pattern, "--trials", str(trials)], allocator)
            out.setdefault("allocator", allocator)
            out.setdefault("pattern", pattern)
            rows.append(out)
            stats = out.get("stats", {})
            corrupted = f"{out['corrupted']}/{out['trials']}" if "corrupted" in out else "failed"
            hz = out.get("hazards")
            lines.append(
                f"| {allocator} | {pattern} | {corrupted} | "
                f"{stats.get('record_stream_calls', '-')} | {stats.get('stream_waits', '-')} | "
                f"{'-' if hz is None else len(hz)} |"
            )
    return rows, "\n".join(lines)


def train(steps: int) -> tuple[list, str]:
    rows = []
    for model in workloads.MODELS:
        for allocator in workloads.ALLOCATORS:
            out = _run(["train", allocator, model, "--steps", str(steps)], allocator)
            out.setdefault("allocator", allocator)
            out.setdefault("model", model)
            rows.append(out)
    lines = [
        "| model | allocator | steps/s | step time / PyTorch's | peak MiB | peak / PyTorch's |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for model in workloads.MODELS:
        ref = next(
            (
                r
                for r in rows
                if r["model"] == model and r["allocator"] == "torch" and "step_s" in r
            ),
            None,
        )
        for r in (r for r in rows if r["model"] == model):
            if "step_s" not in r:
                lines.append(f"| {model} | {r['allocator']} | failed | | | |")
                continue
            ratio = f"{r['step_s'] / ref['step_s']:.3f}" if ref else "-"
            mem = f"{r['peak_used_bytes'] / ref['peak_used_bytes']:.3f}" if ref else "-"
            lines.append(
                f"| {model} | {r['allocator']} | {r['steps_per_s']:.3f} | {ratio} | "
                f"{r['peak_used_bytes'] / 2**20:.0f} | {mem} |"
            )
    return rows, "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("hazards", "train"))
    parser.add_argument("--json", type=pathlib.Path, help="write the rows here")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    rows, table = hazards(args.trials) if args.what == "hazards" else train(args.steps)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
