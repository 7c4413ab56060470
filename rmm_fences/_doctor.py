# SPDX-License-Identifier: Apache-2.0
"""``rmm-fences doctor``: must you sync before ``deallocate``? Answered on this GPU, as a matrix.

Rows are resource chains (specs, see :mod:`rmm_fences.compose`), columns are scenarios; each
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
import time

MODES = ("device", "stream", "deferred")
SCENARIOS = ("same_stream_reuse", "cross_stream_reuse", "free_in_flight")
VMM = "vmm_unmap(reserve_size=16GiB)"
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


def run_cell(chain: str, scenario: str, trials: int, *, nbytes: int = 4 << 20,
             spin_ms: float = 0.5, random_state: int | None = None) -> Cell:
    """Run one cell in this process (a crash loses this process's CUDA context)."""
    import cupy
    import numpy as np
    import rmm

    from rmm_fences import _scenarios
    from rmm_fences.compose import compose

    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {', '.join(SCENARIOS)}; got {scenario!r}")
    mr = compose(chain)
    rng = np.random.default_rng(random_state)
    count = nbytes // 4
    s1 = cupy.cuda.Stream(non_blocking=True)
    s2 = cupy.cuda.Stream(non_blocking=True)
    r1, r2 = rmm.pylibrmm.stream.Stream(s1), rmm.pylibrmm.stream.Stream(s2)
    out = cupy.empty(1, dtype=cupy.float64)
    cell = Cell(chain, scenario, trials)
    free_us = []
    try:
        for trial in range(trials):
            host = rng.standard_normal(count, dtype=np.float32) + np.float32(1.0)
            reference = host.astype(np.float64).sum()
            a = mr.allocate(nbytes, r1)
            _scenarios.as_array(a, count, np.float32).set(host, stream=s1)
            with s1:
                out.fill(0.0)
            _scenarios.slow_checksum(a, count, spin_ms, out, s1)
            start = time.perf_counter()
            mr.deallocate(a, nbytes, r1)
            free_us.append((time.perf_counter() - start) * 1e6)
            b = None
            if scenario == "same_stream_reuse":
                b, stream, rs = mr.allocate(nbytes, r1), s1, r1
            elif scenario == "cross_stream_reuse":
                b, stream, rs = mr.allocate(nbytes, r2), s2, r2
            if b is not None:
                _scenarios.fill(b, count, pattern=trial + 1, stream=stream)
            s1.synchronize()
            s2.synchronize()
            if not np.isclose(float(out.get()[0]), reference, rtol=1e-9, atol=1e-6):
                cell.corrupted += 1
            if b is not None:
                mr.deallocate(b, nbytes, rs)
        if hasattr(mr, "flush"):
            mr.flush()
    except Exception as exc:  # CUDARuntimeError once the context is lost
        cell.crashed = f"{type(exc).__name__}: {exc}".replace("CUDARuntimeError: ", "")
    cell.free_us = statistics.median(free_us) if free_us else None
    hazards = getattr(mr, "hazards", None)
    if hazards is not None and not cell.crashed:
        cell.hazards = tuple(sorted({h.kind for h in hazards}))
    return cell


def run_cell_in_child(chain: str, scenario: str, trials: int, **kwargs) -> Cell:
    """Run one cell in a child process; a lost context or a dead child is a crash."""
    args = [sys.executable, "-P", "-m", "rmm_fences._doctor", chain, scenario, str(trials),
            json.dumps(kwargs)]
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


def run_matrix(chains=CHAINS, scenarios=SCENARIOS, trials: int = 100, *, progress=None,
               **kwargs) -> list[Cell]:
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
    cols = [max([len(s)] + [len(by[(ch, s)].label()) for ch in chains if (ch, s) in by])
            for s in scenarios]
    head = f"{'chain':<{width}}  " + "  ".join(f"{s:<{w}}" for s, w in zip(scenarios, cols))
    lines = [head + "  free us", "-" * (len(head) + 9)]
    for ch in chains:
        row = [by[(ch, s)].label() if (ch, s) in by else "" for s in scenarios]
        costs = [by[(ch, s)].free_us for s in scenarios
                 if (ch, s) in by and by[(ch, s)].free_us is not None]
        cost = f"{statistics.median(costs):8.2f}" if costs else "       -"
        lines.append(f"{ch:<{width}}  " + "  ".join(f"{r:<{w}}" for r, w in zip(row, cols))
                     + "  " + cost)
    return "\n".join(lines)


def to_json(cells: list[Cell], **meta) -> dict:
    return {**meta, "cells": [{**dataclasses.asdict(c), "outcome": c.outcome,
                               "label": c.label()} for c in cells]}


def plot(cells: list[Cell], path: str) -> None:
    """PNG: the median cost per free against the outcome, a point per cell."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError("--plot needs matplotlib (pip install matplotlib)") from exc
    chains = list(dict.fromkeys(c.chain for c in cells))
    colors = {"correct": "tab:green", "corrupted": "tab:orange", "crashed": "tab:red"}
    markers = {s: m for s, m in zip(SCENARIOS, "os^")}
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(chains) + 1.5))
    for c in cells:
        if c.free_us is None:
            continue
        ax.scatter(max(c.free_us, 1e-2), chains.index(c.chain), c=colors[c.outcome],
                   marker=markers.get(c.scenario, "o"), s=60, edgecolors="black", linewidths=0.4)
    ax.set_yticks(range(len(chains)), chains, fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("median host time of deallocate (us, log scale)")
    ax.invert_yaxis()
    handles = [plt.Line2D([], [], color=v, marker="o", linestyle="", label=k)
               for k, v in colors.items()]
    handles += [plt.Line2D([], [], color="gray", marker=m, linestyle="", label=s)
                for s, m in markers.items()]
    ax.legend(handles=handles, fontsize=8, loc="lower right")
    ax.set_title("free without a sync: cost against outcome, per chain and scenario")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(trials: int, *, json_path: str | None = None, plot_path: str | None = None,
        quick: bool = False) -> int:
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    print(f"rmm-fences doctor on {name}: {trials} trials per cell, 4 MiB blocks, the reader "
          "spins 0.5 ms")
    cells = run_matrix(trials=trials, progress=progress_bar())
    print(table(cells))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(to_json(cells, device=name, trials=trials, quick=quick), f, indent=2)
        print(f"wrote {json_path}")
    if plot_path:
        plot(cells, plot_path)
        print(f"wrote {plot_path}")
    return 0


def _child(argv: list[str]) -> int:
    chain, scenario, trials = argv[0], argv[1], int(argv[2])
    kwargs = json.loads(argv[3]) if len(argv) > 3 else {}
    cell = run_cell(chain, scenario, trials, **kwargs)
    print(json.dumps(dataclasses.asdict(cell)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
