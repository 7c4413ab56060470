# SPDX-License-Identifier: Apache-2.0
"""Dask-cuDF on several GPUs per chain: a groupby-aggregate, a merge of two large tables (a full
shuffle) and a sort on a ``LocalCUDACluster`` (one worker per GPU), the chain installed on every
worker by :class:`rmm_fences.dask.FencesPlugin`, against the cluster's own ``rmm_async=True``
and ``rmm_pool_size``. ``benchmarks/dask_multi_gpu.py`` runs it; this module holds the parts a
CPU can test: the chains, the tables' data, the checks and the report.

The tables are made on the workers from formulas of the global row index ``i`` that NumPy and
CuPy compute alike (integer arithmetic that wraps at 64 bits), so any key's rows can be rebuilt
on the host: ``key = i mod keys``, ``x`` a pseudo-random float in [0, 1) and ``y = i mod 7``;
the right table of the merge holds each key once with ``z = key * 0.5``. Weak scaling: each
GPU gets ``rows_per_gpu`` rows of the left table and half as many of the right.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import numpy as np

#: The chains: how each worker gets its memory resource. ``cluster``: LocalCUDACluster keyword
#: arguments (dask-cuda's own resources); ``spec``: an rmm_fences chain installed by
#: ``FencesPlugin`` on a cluster given no rmm option.
CHAINS = {
    "cuda_async": {"cluster": {"rmm_async": True}},
    "rmm_pool": {"cluster": {"rmm_pool_size": 0.5, "rmm_maximum_pool_size": 0.95}},
    "rmm_fences_pool": {"spec": "pool(cuda)"},
    "tracking_pool": {"spec": "tracking(pool(cuda), on_hazard=record)"},
    "sync_on_free_deferred": {
        "spec": "sync_on_free(rmm_pool(cuda, initial_pool_size=0), mode=deferred)"
    },
}
OPERATIONS = ("groupby", "merge", "sort")
_MULT = np.uint64(6364136223846793005)
_INC = np.uint64(1442695040888963407)


def chain_setup(name: str) -> tuple[dict, str | None]:
    """(LocalCUDACluster keyword arguments, FencesPlugin spec or None) of the chain ``name``."""
    if name not in CHAINS:
        raise ValueError(f"chain must be one of {', '.join(CHAINS)}; got {name!r}")
    entry = CHAINS[name]
    return dict(entry.get("cluster", {})), entry.get("spec")


def worker_preloads() -> list[str]:
    """The ``preload`` of a LocalCUDACluster here: ``row_stack_alias.py``, which gives numpy
    ``row_stack`` where it lacks it. Always: each worker is a new process, so what numpy holds in
    this one (which may have made the alias itself) says nothing of the workers'."""
    return [str(pathlib.Path(__file__).with_name("row_stack_alias.py"))]


def left_columns(xp, start: int, stop: int, keys: int) -> dict:
    """Rows ``start`` to ``stop`` of the left table as arrays of ``xp`` (NumPy or CuPy)."""
    i = xp.arange(start, stop, dtype=xp.uint64)
    mixed = i * xp.uint64(_MULT) + xp.uint64(_INC)  # wraps at 2**64 in both
    x = (mixed >> xp.uint64(11)).astype(xp.float64) * (1.0 / 2.0**53)
    return {
        "key": (i % xp.uint64(keys)).astype(xp.int64),
        "x": x,
        "y": (i % xp.uint64(7)).astype(xp.int64),
    }


def right_columns(xp, start: int, stop: int) -> dict:
    """Keys ``start`` to ``stop`` of the right table (each key once)."""
    key = xp.arange(start, stop, dtype=xp.int64)
    return {"key": key, "z": key.astype(xp.float64) * 0.5}


def expected_groups(sample_keys, rows: int, keys: int) -> dict:
    """For each key of ``sample_keys``: (sum of x, count, sum of y) over the ``rows`` rows of
    the left table, rebuilt on the host from the key's own rows ``key, key + keys, ...``."""
    out = {}
    for k in np.asarray(sample_keys, dtype=np.int64).tolist():
        i = np.arange(k, rows, keys, dtype=np.uint64)
        mixed = i * _MULT + _INC
        x = (mixed >> np.uint64(11)).astype(np.float64) * (1.0 / 2.0**53)
        out[k] = (float(x.sum()), int(i.size), int((i % np.uint64(7)).astype(np.int64).sum()))
    return out


def check_groups(got: dict, expected: dict) -> list[str]:
    """What differs between the computed ``got`` (key -> (x sum, count, y sum)) and
    :func:`expected_groups`: one line per wrong or missing key; empty when all match."""
    bad = []
    for k, (xs, n, ys) in expected.items():
        if k not in got:
            bad.append(f"key {k}: missing")
            continue
        gx, gn, gy = got[k]
        if gn != n or gy != ys or not np.isclose(gx, xs, rtol=1e-9, atol=1e-9):
            bad.append(f"key {k}: got ({gx}, {gn}, {gy}), want ({xs}, {n}, {ys})")
    return bad


def sample_keys(keys: int, count: int = 64, seed: int = 0) -> np.ndarray:
    """``count`` distinct keys out of ``keys``, the first and last among them."""
    rng = np.random.default_rng(seed)
    picked = rng.choice(keys, size=min(count, keys), replace=False)
    return np.unique(np.concatenate([picked, [0, keys - 1]]).astype(np.int64))


def check_sorted(bounds: list[tuple[float, float, int]]) -> list[str]:
    """Partition ``(min, max, rows)`` of a sorted column, in order: each partition's values
    come after the previous one's (empty partitions skipped); what breaks the order."""
    bad, last = [], -np.inf
    for p, (lo, hi, n) in enumerate(bounds):
        if n == 0:
            continue
        if lo < last or hi < lo:
            bad.append(f"partition {p}: [{lo}, {hi}] after {last}")
        last = hi
    return bad


@dataclasses.dataclass
class Row:
    """One measurement: an operation of a chain on ``gpus`` GPUs."""

    gpus: int
    chain: str
    operation: str
    seconds: float
    rows: int
    peak_mib: list[float]  # per GPU, the most device memory in use above the idle baseline
    spilled: dict | None = None  # per worker, what dask-cuda moved off the device
    hazards: int | None = None  # the tracker's, summed over the workers
    problems: list[str] = dataclasses.field(default_factory=list)  # failed checks

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


def read_rows(path) -> tuple[dict | None, list[Row]]:
    """(environment, rows) of a ``--out`` file: its ``{"environment": ...}`` line (the commit,
    GPU, driver and package versions of the run; None where the file has none) and its rows."""
    env, rows = None, []
    for line in pathlib.Path(path).read_text().splitlines():
        if not line.strip():
            continue
        data = json.loads(line)
        if "environment" in data:
            env = data["environment"]
        else:
            rows.append(Row(**data))
    return env, rows


def scaling(rows: list[Row], chain: str, operation: str) -> dict[int, float]:
    """Per GPU count: the time on 1 GPU over the time on N (weak scaling: 1.0 is perfect)."""
    times = {r.gpus: r.seconds for r in rows if r.chain == chain and r.operation == operation}
    if 1 not in times:
        return {}
    return {n: times[1] / t for n, t in sorted(times.items()) if t > 0}


def render(rows: list[Row], reference: str = "cuda_async") -> list[str]:
    """A markdown table: per GPU count, operation and chain, the seconds, the time against
    ``reference`` on the same GPU count, the weak-scaling efficiency against its own 1-GPU
    run, the largest per-GPU peak and the checks."""
    out = [
        "| GPUs | operation | chain | seconds | vs " + reference + " | scaling | "
        "peak GiB per GPU | hazards | checks |",
        "|---:|---|---|---:|---:|---:|---:|---:|---|",
    ]
    by = {(r.gpus, r.operation, r.chain): r for r in rows}
    for gpus, op, chain in sorted(by, key=lambda k: (k[0], OPERATIONS.index(k[1]), k[2])):
        r = by[(gpus, op, chain)]
        ref = by.get((gpus, op, reference))
        vs = f"{r.seconds / ref.seconds:.3f}" if ref and ref.seconds > 0 else "-"
        eff = scaling(rows, chain, op).get(gpus)
        out.append(
            f"| {gpus} | {op} | {chain} | {r.seconds:.2f} | {vs} | "
            f"{'-' if eff is None else f'{eff:.2f}'} | "
            f"{max(r.peak_mib, default=0.0) / 1024:.1f} | "
            f"{'-' if r.hazards is None else r.hazards} | "
            f"{'ok' if not r.problems else '; '.join(r.problems)} |"
        )
    return out


def chart(rows: list[Row], png, reference: str = "cuda_async") -> None:
    """A column per operation: on top each chain's seconds over the reference's on the same GPU
    count (1.0: as fast), below its weak scaling (its time on 1 GPU over its time on N: 1.0
    is perfect), per GPU count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted({r.gpus for r in rows})
    chains = list(dict.fromkeys(r.chain for r in rows))
    by = {(r.gpus, r.operation, r.chain): r for r in rows}
    fig, axes = plt.subplots(
        2, len(OPERATIONS), figsize=(4.5 * len(OPERATIONS), 7), sharex=True, sharey="row"
    )
    for (speed, scale), op in zip(axes.T, OPERATIONS):
        for chain in chains:
            vs = [
                (n, by[(n, op, chain)].seconds / by[(n, op, reference)].seconds)
                for n in counts
                if (n, op, chain) in by and (n, op, reference) in by
            ]
            if vs:
                speed.plot(*zip(*vs), marker="o", label=chain)
            eff = scaling(rows, chain, op)
            if eff:
                scale.plot(list(eff), list(eff.values()), marker="o", label=chain)
        for ax in (speed, scale):
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_xscale("log", base=2)
            ax.set_xticks(counts, [str(n) for n in counts])
        speed.set_title(op)
        scale.set_xlabel("GPUs")
    axes[0][0].set_ylabel(f"seconds / {reference}'s")
    axes[1][0].set_ylabel("time on 1 GPU / time on N")
    axes[0][-1].legend(fontsize=8)
    per_gpu = max((r.rows // r.gpus for r in rows), default=0)
    fig.suptitle(f"Dask-cuDF per chain, {per_gpu:,} rows per GPU (weak scaling)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
