# SPDX-License-Identifier: Apache-2.0
"""PyTorch under each allocator, each run in its own process, as JSON and a markdown table
(docs/torch.md):

    python tools/torch_report.py hazards --json docs/data/torch/hazards.json [--trials 20]
    python tools/torch_report.py train --json docs/data/torch/training.json [--steps 10]
        [--warmup 3] [--repeat 2] [--allocators torch fences_pool ...]
    python tools/torch_report.py {hazards,train} --json FILE --table  # the table of saved rows

``hazards``: the record_stream patterns of asv_bench/benchmarks/_torch_workloads.py (``hazard``)
under every allocator: checksums corrupted, and what rmm_fences' allocator counted.
``train``: steps per second and peak device memory of each model under every allocator, with
ratios against PyTorch's caching allocator from the same run (medians over ``--repeat``
rounds) and the 95% interval of the ratio (from the per-round ratios, each against PyTorch's
allocator in the same round). ``--until-width 0.02`` runs rounds until every interval is
narrower than 2% (at least 3 rounds, at most ``--repeat``). Rows are saved after every run, so
a time limit keeps what ran, and ``--resume`` goes on from the rounds in ``--json`` (a run of
the same commit) up to ``--repeat`` rounds in all. The file is ``{"environment": ...,
"rows": [...]}``: the commit, GPU, driver and package versions of the run beside its rows
(``load`` also reads a bare list of rows, as older files hold).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "asv_bench" / "benchmarks"))

import _torch_workloads as workloads  # noqa: E402

HAZARD_ALLOCATORS = ["torch", "rmm_async", "rmm_pool", "fences_pool", "fences_tracker"]


def environment() -> dict:
    """``asv_bodies.recorded_environment()`` (the commit, GPU, driver and package versions this
    run measures), read in a process of its own (this one stays without a CUDA context, so that
    it holds no device memory while the runs measure theirs); the commit alone where that
    process fails."""
    tools = pathlib.Path(__file__).resolve().parent
    probe = (
        f"import json, sys; sys.path.insert(0, {str(tools)!r}); "
        "from asv_bodies import recorded_environment; print(json.dumps(recorded_environment()))"
    )
    try:
        run = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
        )
        return json.loads(run.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        sys.path.insert(0, str(tools))
        from asv_bodies import checkout_commit

        return {"commit": checkout_commit()}


def load(path: pathlib.Path) -> tuple[dict | None, list]:
    """(environment, rows) of a file this tool wrote; (None, rows) for a bare list of rows."""
    data = json.loads(path.read_text())
    if isinstance(data, list):
        return None, data
    return data.get("environment"), data["rows"]


def _run(command, allocator):
    try:
        return workloads.run(command, allocator, timeout=900)
    except RuntimeError as exc:
        print(f"{command} failed: {exc}", file=sys.stderr)
        return {"error": str(exc)[-2000:]}


def hazards(trials: int, save=lambda rows: None) -> tuple[list, str]:
    rows = []
    for pattern in workloads.PATTERNS:
        for allocator in HAZARD_ALLOCATORS:
            out = _run(["hazard", allocator, pattern, "--trials", str(trials)], allocator)
            out.setdefault("allocator", allocator)
            out.setdefault("pattern", pattern)
            rows.append(out)
            save(rows)  # what ran is kept when a time limit stops the rest
    return rows, hazard_table(rows)


def hazard_table(rows: list) -> str:
    """The hazard table from rows: corrupted trials and what rmm_fences' allocator counted."""
    lines = [
        "| allocator | pattern | corrupted | record_stream calls | stream waits | "
        "hazards reported |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for out in rows:
        stats = out.get("stats", {})
        corrupted = f"{out['corrupted']}/{out['trials']}" if "corrupted" in out else "failed"
        hz = out.get("hazards")
        lines.append(
            f"| {out['allocator']} | {out['pattern']} | {corrupted} | "
            f"{stats.get('record_stream_calls', '-')} | {stats.get('stream_waits', '-')} | "
            f"{'-' if hz is None else len(hz)} |"
        )
    return "\n".join(lines)


#: Two-sided 95% quantiles of Student's t with k degrees of freedom (k = 1..30); the normal
#: quantile beyond.
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042]  # fmt: skip


def ratio_interval(ratios: list[float]) -> tuple[float, float] | None:
    """The 95% interval of the geometric mean of per-round ratios (Student's t on their
    logarithms), or None with fewer than two rounds."""
    n = len(ratios)
    if n < 2 or min(ratios) <= 0:
        return None
    logs = [math.log(r) for r in ratios]
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    half = (_T95[n - 2] if n - 1 <= len(_T95) else 1.960) * sd / math.sqrt(n)
    return math.exp(mean - half), math.exp(mean + half)


def per_round_ratios(rows: list, model: str, allocator: str) -> list[float]:
    """Each round's step time of ``allocator`` over PyTorch's allocator's in that round."""
    ok = [r for r in rows if "step_s" in r and r["model"] == model]
    ref = {r.get("round", 0): r["step_s"] for r in ok if r["allocator"] == "torch"}
    return [
        r["step_s"] / ref[r.get("round", 0)]
        for r in ok
        if r["allocator"] == allocator and r.get("round", 0) in ref
    ]


def narrow_enough(rows: list, width: float) -> bool:
    """True when every allocator's ratio interval (against PyTorch's) is narrower than
    ``width`` (its high over its low, less 1), for every model."""
    pairs = {(r["model"], r["allocator"]) for r in rows if r.get("allocator") != "torch"}
    for model, allocator in pairs:
        interval = ratio_interval(per_round_ratios(rows, model, allocator))
        if interval is None or interval[1] / interval[0] - 1 >= width:
            return False
    return True


def train(
    steps: int,
    save=lambda rows: None,
    repeat: int = 1,
    allocators=None,
    until_width: float | None = None,
    warmup: int = 3,
    rows: list | None = None,
) -> tuple[list, str]:
    """Each model under each allocator, ``repeat`` rounds (allocators alternating within a
    round), one process per run; with ``until_width``, fewer rounds once every ratio interval
    is narrower than that (after 3 rounds at least). ``rows``: those of earlier rounds of the
    same run, which the rounds go on from (``repeat`` counts them)."""
    rows = list(rows or [])
    first = max((r.get("round", 0) for r in rows), default=-1) + 1
    for round_ in range(first, repeat):
        if until_width is not None and round_ >= 3 and narrow_enough(rows, until_width):
            break
        for model in workloads.MODELS:
            for allocator in allocators or workloads.ALLOCATORS:
                command = ["train", allocator, model, "--steps", str(steps)]
                out = _run([*command, "--warmup", str(warmup)], allocator)
                out.setdefault("allocator", allocator)
                out.setdefault("model", model)
                out["round"] = round_
                rows.append(out)
                save(rows)  # what ran is kept when a time limit stops the rest
                print(
                    f"round {round_}: {model} under {allocator}: "
                    f"{out.get('steps_per_s', out.get('error'))}",
                    file=sys.stderr,
                    flush=True,
                )
    return rows, train_table(rows)


def train_table(rows: list) -> str:
    """The training table from rows: per model and allocator, the median step time over the
    rounds, its ratio against PyTorch's allocator's median, the range and the 95% interval of
    the per-round ratios (each against PyTorch's allocator in the same round), and the peak
    device memory."""
    lines = [
        "| model | allocator | rounds | steps/s | step time / PyTorch's | per-round range | "
        "95% interval | peak MiB | peak / PyTorch's |",
        "| --- | --- | ---: | ---: | ---: | --- | --- | ---: | ---: |",
    ]
    ok = [r for r in rows if "step_s" in r]
    for model in workloads.MODELS:
        ref = {
            r.get("round", 0): r for r in ok if r["model"] == model and r["allocator"] == "torch"
        }
        ref_step = statistics.median(r["step_s"] for r in ref.values()) if ref else None
        ref_peak = max(r["peak_used_bytes"] for r in ref.values()) if ref else None
        names = list(dict.fromkeys(r["allocator"] for r in rows if r["model"] == model))
        for name in names:
            mine = [r for r in ok if r["model"] == model and r["allocator"] == name]
            if not mine:
                lines.append(f"| {model} | {name} | 0 | failed | | | | | |")
                continue
            step = statistics.median(r["step_s"] for r in mine)
            peak = max(r["peak_used_bytes"] for r in mine)
            per_round = per_round_ratios(rows, model, name)
            spread = f"{min(per_round):.3f}-{max(per_round):.3f}" if per_round else "-"
            interval = ratio_interval(per_round) if name != "torch" else None
            ci = f"{interval[0]:.3f}-{interval[1]:.3f}" if interval else "-"
            lines.append(
                f"| {model} | {name} | {len(mine)} | {1 / step:.2f} | "
                f"{f'{step / ref_step:.3f}' if ref_step else '-'} | {spread} | {ci} | "
                f"{peak / 2**20:.0f} | {f'{peak / ref_peak:.3f}' if ref_peak else '-'} |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("hazards", "train"))
    parser.add_argument("--json", type=pathlib.Path, help="write the rows here")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10, help="train: timed steps per run")
    parser.add_argument(
        "--warmup", type=int, default=3, help="train: untimed steps before them, per run"
    )
    parser.add_argument("--repeat", type=int, default=1, help="rounds of train (at most)")
    parser.add_argument(
        "--until-width",
        type=float,
        help="train: stop once every 95%% interval of the ratio is narrower than this (0.02)",
    )
    parser.add_argument("--allocators", nargs="+", choices=list(workloads.ALLOCATORS))
    parser.add_argument("--table", action="store_true", help="print the table of the --json rows")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="train: go on from the rounds already in --json (a run of the same commit)",
    )
    args = parser.parse_args()

    if args.table:
        if args.json is None:
            parser.error("--table prints the table of the rows in --json: give --json")
        table_of = hazard_table if args.what == "hazards" else train_table
        print(table_of(load(args.json)[1]))
        return 0
    env = environment() if args.json else None
    earlier = []
    if args.resume:
        if args.json is None or args.what != "train":
            parser.error("--resume goes on with the train rounds in --json: give train --json")
        if args.json.exists():
            was, earlier = load(args.json)
            if (was or {}).get("commit") != env.get("commit"):
                parser.error(
                    f"--resume: {args.json} holds a run of commit {(was or {}).get('commit')}, "
                    f"not of this one ({env.get('commit')}): start a new file"
                )

    def save(rows):
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            data = {"environment": env, "rows": rows}
            args.json.write_text(json.dumps(data, indent=1) + "\n")

    if args.what == "hazards":
        rows, table = hazards(args.trials, save)
    else:
        rows, table = train(
            args.steps, save, args.repeat, args.allocators, args.until_width, args.warmup, earlier
        )
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
