# SPDX-License-Identifier: Apache-2.0
"""``rmm-fences doctor``: must you sync before ``deallocate``? Answered on this GPU, as a matrix.

Rows are resource chains (specs, see :mod:`rmm_fences.specs`), columns are scenarios; each
cell runs ``trials`` times: a slow kernel reads a block of fresh random data and sums it in
float64 while the host frees the block at once, without a sync (the race trial), then

- ``same_stream_reuse``: allocates the same size on the same stream and overwrites it;
- ``cross_stream_reuse``: allocates the same size on another stream and overwrites it there;
- ``free_in_flight``: allocates nothing; the free alone must not hurt the running kernel.

A cell is *correct* when every checksum matches the float64 reference, *corrupted* with the
rate otherwise, *crashed* with the CUDA error when the context died (chains over
``vmm_unmap`` run each cell in a child process for that reason), and lists the hazards a
tracking adaptor in the chain reported. Each cell also reports the median host time of the
``deallocate`` call.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys

from rmm_fences._cuda import environment
from rmm_fences._optional import missing, require

MODES = ("device", "stream", "deferred")
# the scenarios of rmm_fences._scenarios.race (not imported here: that module needs CuPy)
SCENARIOS = ("same_stream_reuse", "cross_stream_reuse", "free_in_flight")
VMM = "vmm_unmap(reserve_size=16GiB)"
# The safety matrix: the unsafe allocators bare and under each sync mode, beside the safe
# peers. asv_bench/benchmarks/_common.py CHAINS (performance peers, pools pre-sized, named
# for asv) is a different set on purpose; neither is derived from the other.
CHAINS = (
    "cuda",
    "cuda_async",
    "rmm_pool(cuda, initial_pool_size=256MiB)",
    "naive_cache(cuda)",
    VMM,
    *(f"sync_on_free(naive_cache(cuda), mode={m})" for m in MODES),
    *(f"sync_on_free({VMM}, mode={m})" for m in MODES),
    "pool(cuda)",
    "tracking(naive_cache(cuda), on_hazard=record)",
)


@dataclasses.dataclass
class Cell:
    """The outcome of one scenario on one chain."""

    chain: str
    scenario: str
    trials: int
    corrupted: int = 0
    crashed: str | None = None
    hazards: tuple[str, ...] = ()
    free_us: float | None = None

    @property
    def outcome(self) -> str:
        if self.crashed:
            return "crashed"
        return "corrupted" if self.corrupted else "correct"

    def label(self) -> str:
        if self.crashed:
            text = f"crashed ({self.crashed.split(':')[0]})"
        elif self.corrupted:
            text = f"corrupted {self.corrupted}/{self.trials}"
        else:
            text = "correct"
        if self.hazards:
            text += " + " + ",".join(self.hazards)
        return text


def run_cell(
    chain: str,
    scenario: str,
    trials: int,
    *,
    nbytes: int = 4 << 20,
    spin_ms: float = 0.5,
    random_state: int | None = None,
) -> Cell:
    """Run one cell in this process: the race trial (``rmm_fences._scenarios.race``) of
    ``scenario`` over a fresh ``chain`` (a crash loses this process's CUDA context)."""
    import numpy as np

    from rmm_fences._scenarios import race
    from rmm_fences.specs import compose

    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {', '.join(SCENARIOS)}; got {scenario!r}")
    mr = compose(chain)
    res = race(
        mr,
        trials=trials,
        nbytes=nbytes,
        spin_ms=spin_ms,
        rng=np.random.default_rng(random_state),
        scenario=scenario,
        catch=True,
    )
    cell = Cell(chain, scenario, trials, corrupted=res.corrupted, crashed=res.crashed)
    if not cell.crashed and hasattr(mr, "flush"):
        try:
            mr.flush()
        except Exception as exc:  # CUDARuntimeError once the context is lost
            cell.crashed = f"{type(exc).__name__}: {exc}".replace("CUDARuntimeError: ", "")
    cell.free_us = statistics.median(res.free_us) if res.free_us else None
    hazards = getattr(mr, "hazards", None)
    if hazards is not None and not cell.crashed:
        cell.hazards = tuple(sorted({h.kind for h in hazards}))
    return cell


def run_cell_in_child(chain: str, scenario: str, trials: int, **kwargs) -> Cell:
    """Run one cell in a child process; a lost context or a dead child is a crash."""
    args = [
        sys.executable,
        "-P",
        "-m",
        "rmm_fences._cli.doctor",
        chain,
        scenario,
        str(trials),
        json.dumps(kwargs),
    ]
    res = subprocess.run(args, capture_output=True, text=True, timeout=600)
    lines = [line for line in res.stdout.splitlines() if line.startswith("{")]
    if lines:
        data = json.loads(lines[-1])
        data["hazards"] = tuple(data["hazards"])
        return Cell(**data)
    tail = (res.stderr.strip().splitlines() or [f"exit code {res.returncode}"])[-1]
    return Cell(chain, scenario, trials, crashed=tail)


def needs_child(chain: str) -> bool:
    return "vmm_unmap" in chain


def run_matrix(
    chains=CHAINS, scenarios=SCENARIOS, trials: int = 100, *, progress=None, **kwargs
) -> list[Cell]:
    cells = []
    total = len(chains) * len(scenarios)
    for chain in chains:
        for scenario in scenarios:
            if progress:
                progress(len(cells), total, f"{chain} / {scenario}")
            run = run_cell_in_child if needs_child(chain) else run_cell
            cells.append(run(chain, scenario, trials, **kwargs))
    if progress:
        progress(total, total, "done")
    return cells


def progress_bar(stream=sys.stderr, width: int = 30):
    """A one-line progress bar on ``stream`` (no dependency)."""

    def show(done, total, what):
        filled = int(width * done / total) if total else width
        stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {what[:60]:<60}")
        if done == total:
            stream.write("\n")
        stream.flush()

    return show


def table(cells: list[Cell]) -> str:
    """The matrix as text: a row per chain, a column per scenario, then the cost per free."""
    chains = list(dict.fromkeys(c.chain for c in cells))
    scenarios = list(dict.fromkeys(c.scenario for c in cells))
    by = {(c.chain, c.scenario): c for c in cells}
    width = max(len(c) for c in chains)
    cols = [
        max([len(s)] + [len(by[(ch, s)].label()) for ch in chains if (ch, s) in by])
        for s in scenarios
    ]
    head = f"{'chain':<{width}}  " + "  ".join(f"{s:<{w}}" for s, w in zip(scenarios, cols))
    lines = [head + "  free us", "-" * (len(head) + 9)]
    for ch in chains:
        row = [by[(ch, s)].label() if (ch, s) in by else "" for s in scenarios]
        costs = [
            by[(ch, s)].free_us
            for s in scenarios
            if (ch, s) in by and by[(ch, s)].free_us is not None
        ]
        cost = f"{statistics.median(costs):8.2f}" if costs else "       -"
        lines.append(
            f"{ch:<{width}}  " + "  ".join(f"{r:<{w}}" for r, w in zip(row, cols)) + "  " + cost
        )
    return "\n".join(lines)


def to_json(cells: list[Cell], **meta) -> dict:
    return {
        **meta,
        "cells": [
            {**dataclasses.asdict(c), "outcome": c.outcome, "label": c.label()} for c in cells
        ],
    }


def plot(cells: list[Cell], path: str) -> None:
    """PNG: the median cost per free against the outcome, a point per cell."""
    matplotlib = require("matplotlib", "rmm-fences doctor --plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chains = list(dict.fromkeys(c.chain for c in cells))
    colors = {"correct": "tab:green", "corrupted": "tab:orange", "crashed": "tab:red"}
    markers = {s: m for s, m in zip(SCENARIOS, "os^")}
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(chains) + 1.5))
    for c in cells:
        if c.free_us is None:
            continue
        ax.scatter(
            max(c.free_us, 1e-2),
            chains.index(c.chain),
            c=colors[c.outcome],
            marker=markers.get(c.scenario, "o"),
            s=60,
            edgecolors="black",
            linewidths=0.4,
        )
    ax.set_yticks(range(len(chains)), chains, fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("median host time of deallocate (us, log scale)")
    ax.invert_yaxis()
    handles = [
        plt.Line2D([], [], color=v, marker="o", linestyle="", label=k) for k, v in colors.items()
    ]
    handles += [
        plt.Line2D([], [], color="gray", marker=m, linestyle="", label=s)
        for s, m in markers.items()
    ]
    ax.legend(handles=handles, fontsize=8, loc="lower right")
    ax.set_title("free without a sync: cost against outcome, per chain and scenario")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


HELP = "the hazard matrix: which chains survive freeing while a kernel still reads"
DESCRIPTION = (
    "Run the race trial in three scenarios (same-stream reuse, cross-stream reuse, "
    "free while a kernel is in flight) on every chain and print the outcome of each "
    "cell (correct, corrupted, crashed, hazards reported) with the cost per free."
)


def add_arguments(parser) -> None:
    from rmm_fences._cli._args import positive

    parser.add_argument(
        "--trials",
        type=positive,
        default=100,
        help="trials per cell (default 100; 20 with --quick)",
    )
    parser.add_argument("--quick", action="store_true", help="20 trials per cell")
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="also write the matrix as JSON, with the GPU, driver and package versions",
    )
    parser.add_argument(
        "--plot",
        metavar="PATH",
        help="also draw cost against outcome per chain (PNG, needs matplotlib)",
    )


def preflight(args) -> str | None:
    """What would make the run fail only at its end (checked before it starts), or None."""
    import importlib.util

    from rmm_fences._cli._args import writable_path

    for option, path in (("--json", args.json), ("--plot", args.plot)):
        if path:
            problem = writable_path(path, option)
            if problem:
                return problem
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        return str(missing("matplotlib", "rmm-fences doctor --plot"))
    return None


def run(args) -> int:
    """``rmm-fences doctor``: the matrix on this GPU, printed (and written with --json/--plot)."""
    cupy = require("cupy", "rmm-fences doctor")

    trials = 20 if args.quick and args.trials == 100 else args.trials
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    print(
        f"rmm-fences doctor on {name}: {trials} trials per cell, 4 MiB blocks, the reader "
        "spins 0.5 ms"
    )
    cells = run_matrix(trials=trials, progress=progress_bar())
    print(table(cells))
    if args.json:
        with open(args.json, "w") as f:
            meta = dict(device=name, trials=trials, quick=args.quick, environment=environment())
            json.dump(to_json(cells, **meta), f, indent=2)
        print(f"wrote {args.json}")
    if args.plot:
        plot(cells, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _child(argv: list[str]) -> int:
    chain, scenario, trials = argv[0], argv[1], int(argv[2])
    kwargs = json.loads(argv[3]) if len(argv) > 3 else {}
    cell = run_cell(chain, scenario, trials, **kwargs)
    print(json.dumps(dataclasses.asdict(cell)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
