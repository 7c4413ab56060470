# SPDX-License-Identifier: Apache-2.0
"""The CUDA calls deferred SyncOnFree makes per free and per allocation on the recorded
allocation logs, on its C++ core over host memory (no GPU).

    python tools/fence_calls.py                  # every log in asv_bench/traces
    python tools/fence_calls.py reduce_1m cupy_pipeline
    python tools/fence_calls.py --max-batch-frees 64 --max-batch-bytes 256MiB
    python tools/fence_calls.py --costs native.jsonl --replay replay.jsonl

Needs the host test harness (``rmm_fences_testing``, tests/native) and the benchmarks' library
(``rmm_fences_bench``, benchmarks/), both built in place by ``make install``.

Each log is replayed once through ``HostSyncOnFree`` (the adaptor's core in deferred mode, its
batch limits as given, blocks taken back on their stream), one event at a time in recorded
order, each recorded stream a stream of its own, every fence complete from the next call on
(an idle device, as in the replay benchmark, whose calls launch no work). The report counts
the calls the CUDA platform would make: event records and queries (an event per batch, from
the adaptor's pool of events), stream-identity queries (``cuStreamGetId``) and capture tests
(``cuStreamIsCapturing``); how many allocations took back a block freed on their stream
instead of calling the upstream; the most bytes freed and not yet handed to the upstream at
once (what the adaptor holds beyond its upstream's footprint); and how many blocks went
upstream on another stream than the one that freed them (a block goes upstream on the stream
of the call that found its fence complete: a pool keyed by stream then files it under that
stream). No block may reach the upstream before its fence: the run fails if the harness saw
one.

``--costs FILE`` (a ``tools/asv_bodies.py run native`` file) prices those calls at the
driver-API costs its ``FenceCalls`` row measured on a GPU (``cuEventRecord``,
``cuEventQuery``, ``cuStreamGetId``, ``cuStreamIsCapturing``): ns of CUDA calls per call of the
adaptor. ``--replay FILE`` (a ``run replay`` file of the same GPU) sets that against the time
of one call of rmm's pool alone in the replays (the median calls per second of its rounds):
the share of its upstream's call time the adaptor's CUDA calls add.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "native"), str(ROOT / "benchmarks"), str(ROOT / "tools")]
from asv_bodies import _rows, checkout_commit  # noqa: E402
from footprint_breakdown import STREAM_BASE, TRACES, log_events, log_names  # noqa: E402

from rmm_fences_bench.alloc_log import ALLOCATE  # noqa: E402
from rmm_fences_bench.cli import size as size_argument  # noqa: E402
from rmm_fences_testing import HostSyncOnFree  # noqa: E402

DEFAULT_FREES = 16
DEFAULT_BYTES = 64 << 20


def replay_calls(core, events):
    """Replays ``events`` (``footprint_breakdown.events_of``) through the SyncOnFree core
    ``core`` (a ``HostSyncOnFree``) one call at a time in recorded order, recorded stream k as
    stream ``STREAM_BASE + k``, every fence complete from the next call on (nothing runs on the
    streams). Yields per call ``(action, ptr, nbytes, stream, reached_upstream, releases)``:
    whether the call allocated from the upstream, and the blocks it handed upstream, in order,
    as ``(ptr, stream of its free, stream of its release)``. Frees of blocks the log did not
    allocate make no call."""
    live, freed_on, released = {}, {}, 0
    for action, ident, nbytes, stream in events:
        s = STREAM_BASE + stream
        before = core.calls["upstream_allocate"]
        if action == ALLOCATE:
            ptr = core.allocate(nbytes, stream=s)
            live[ident] = (ptr, nbytes)
        elif ident in live:
            ptr, nbytes = live.pop(ident)
            freed_on[ptr] = s
            core.deallocate(ptr, nbytes, stream=s)
        else:
            continue
        done = core.releases_since(released)
        released += len(done)
        # a block is freed again only after it went upstream or was taken back: the stream of
        # its last free is the one of the free its release ends
        releases = [(p, freed_on[p], on) for p, _, on, _ in done]
        yield action, ptr, nbytes, s, core.calls["upstream_allocate"] > before, releases
        core.signal_all()


def count(events, max_batch_frees=DEFAULT_FREES, max_batch_bytes=DEFAULT_BYTES) -> dict:
    """Replays ``events`` (``footprint_breakdown.events_of``) through deferred SyncOnFree's core;
    the platform's and the upstream's calls, the allocations and frees made, the take-backs."""
    core = HostSyncOnFree(max_batch_frees=max_batch_frees, max_batch_bytes=max_batch_bytes)
    _ = core.calls  # the counts start from the first call
    allocations, frees = 0, 0
    released, elsewhere = 0, 0  # blocks handed upstream; of those, on another stream
    for action, _, _, _, _, releases in replay_calls(core, events):
        allocations += action == ALLOCATE
        frees += action != ALLOCATE
        released += len(releases)
        elsewhere += sum(freed != on for _, freed, on in releases)
    calls = core.calls
    reuses = core.reuses
    if reuses["unsafe"]:
        raise RuntimeError(f"{reuses['unsafe']} block(s) reached the upstream before their fence")
    return {
        **calls,
        "allocations": allocations,
        "frees": frees,
        "take_backs": reuses["reuses"],
        "peak_pending_bytes": core.stats["peak_pending_bytes"],
        "released": released,
        "released_elsewhere": elsewhere,
    }


#: The CUDA calls the counts name, by the keys of asv_bodies' FenceCalls row (driver API).
CALL_COSTS = {
    "record": "cu_event_record",
    "ready": "cu_event_query",
    "stream_id": "cu_stream_get_id",
    "is_capturing": "cu_stream_is_capturing",
}


def call_costs(path: pathlib.Path) -> dict:
    """{count key: ns per CUDA call} from the FenceCalls row of a ``run native`` file."""
    for bench in _rows(path):
        if bench.get("bench") == "FenceCalls":
            return {key: bench["ns"][name] for key, name in CALL_COSTS.items()}
    raise ValueError(f"{path} holds no FenceCalls row: give a tools/asv_bodies.py run native file")


def upstream_call_ns(path: pathlib.Path, chain: str = "rmm_pool") -> dict:
    """{log: ns per call of ``chain`` alone} from a ``run replay`` file: 1e9 over the median
    calls per second of its rounds."""
    rates = {}
    for r in _rows(path):
        if r.get("chain") == chain and r.get("alloc_per_s"):
            rates.setdefault(r["trace"], []).append(r["alloc_per_s"])
    if not rates:
        raise ValueError(
            f"{path} holds no replay of {chain}: give a tools/asv_bodies.py run replay file"
        )
    return {trace: 1e9 / statistics.median(v) for trace, v in rates.items()}


def cuda_ns_per_call(c: dict, costs: dict) -> float:
    """ns of CUDA calls per call of the adaptor, at ``costs`` (``call_costs``)."""
    calls = max(c["allocations"] + c["frees"], 1)
    return sum(c[key] * ns for key, ns in costs.items()) / calls


def row(name: str, c: dict, costs=None, upstream=None) -> str:
    """One log's line: calls made, then per free and per call; with ``costs``, the ns of CUDA
    calls per call, and with ``upstream`` ({log: ns per upstream call}) their share of it."""
    frees, calls = max(c["frees"], 1), max(c["allocations"] + c["frees"], 1)
    cells = [
        f"{c['allocations'] + c['frees']}",
        f"{c['record'] / frees:.3f}",
        f"{c['ready'] / frees:.3f}",
        f"{c['stream_id'] / frees:.3f}",
        f"{c['is_capturing'] / calls:.2f}",
        f"{c['take_backs'] / max(c['allocations'], 1):.0%}",
        f"{c['upstream_allocate'] / max(c['allocations'], 1):.0%}",
        f"{c['peak_pending_bytes'] / 2**20:.0f}",
        f"{c['released_elsewhere'] / max(c['released'], 1):.0%}",
    ]
    if costs is not None:
        ns = cuda_ns_per_call(c, costs)
        cells.append(f"{ns:.1f}")
        if upstream is not None:
            cells.append(f"{ns / upstream[name]:.1%}" if name in upstream else "-")
    return f"| {name} | " + " | ".join(cells) + " |"


def report(
    names, traces, max_batch_frees, max_batch_bytes, costs=None, upstream=None, sources=()
) -> list[str]:
    limits = f"max_batch_frees {max_batch_frees}, max_batch_bytes " + (
        "none" if max_batch_bytes is None else f"{max_batch_bytes} bytes"
    )
    extra_head, extra_rule = "", ""
    if costs is not None:
        extra_head += " | its CUDA calls, ns per call"
        extra_rule += "---:|"
        if upstream is not None:
            extra_head += " | of rmm's pool's call in the replay"
            extra_rule += "---:|"
    priced = "".join(f"; {what} from {where}" for what, where in sources)
    lines = [
        "# SyncOnFree's CUDA calls per free (host model)",
        "",
        f"commit `{checkout_commit() or 'unknown'}`; deferred SyncOnFree's core over host memory,"
        f" no GPU; {limits}; every fence complete from the next call on{priced}",
        "",
        "| log | calls | event records per free | event queries per free "
        "| stream-identity queries per free | capture tests per call "
        "| allocations taken back | allocations that reached the upstream "
        f"| peak pending MiB | handed upstream on another stream than the free{extra_head} |",
        f"|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|{extra_rule}",
    ]
    for name in names:
        events = log_events(traces, name)
        counts = count(events, max_batch_frees, max_batch_bytes)
        lines.append(row(name, counts, costs, upstream))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="*", help="log names (default: every log in --traces)")
    parser.add_argument("--traces", type=pathlib.Path, default=TRACES)
    parser.add_argument("--max-batch-frees", type=int, default=DEFAULT_FREES)
    parser.add_argument(
        "--max-batch-bytes",
        type=lambda text: None if text == "none" else size_argument(text, "max_batch_bytes"),
        default=DEFAULT_BYTES,
        metavar="SIZE",
        help="the adaptor's max_batch_bytes (bytes, a size such as 64MiB, or none)",
    )
    parser.add_argument(
        "--costs", type=pathlib.Path, help="a run native file: price the calls at its FenceCalls"
    )
    parser.add_argument(
        "--replay", type=pathlib.Path, help="a run replay file: the share of rmm's pool's call"
    )
    args = parser.parse_args(argv)
    if args.max_batch_frees < 1:
        parser.error(f"--max-batch-frees must be at least 1, got {args.max_batch_frees}")
    if args.replay is not None and args.costs is None:
        parser.error("--replay needs --costs (the calls' prices)")
    names = args.logs or log_names(args.traces)
    costs = call_costs(args.costs) if args.costs else None
    upstream = upstream_call_ns(args.replay) if args.replay else None
    sources = [
        (what, path.name)
        for what, path in (("call costs", args.costs), ("rmm's pool's calls", args.replay))
        if path is not None
    ]
    lines = report(
        names, args.traces, args.max_batch_frees, args.max_batch_bytes, costs, upstream, sources
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
