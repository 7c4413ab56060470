# SPDX-License-Identifier: Apache-2.0
"""Allocation logs of shapes the recorded ones lack, made from a seed (test-only): events
``(action, id, bytes, stream)`` (action 0 allocates, 1 frees), every block freed at the end.

- ``mixed``: half the requests from 256 B to 1 GiB (log-uniform), half from 256 B to 64 KiB;
  a tenth of the blocks long-lived; frees among the 50 latest blocks; four streams, a fifth of
  the frees on another stream than the allocation's;
- ``one_stream``: the same on one stream;
- ``big``: requests from 1 MiB to 2 GiB;
- ``fifo``: the mixed sizes, each free of the oldest short-lived block.

The live bytes stay below 16 GiB (the oldest blocks are freed first past it).
"""

from __future__ import annotations

import random

GIB = 1 << 30
LIVE_CAP = 16 * GIB


def shape(kind: str, seed: int, events: int = 4000) -> list[tuple[int, int, int, int]]:
    r = random.Random(seed)
    out: list[tuple[int, int, int, int]] = []
    live: dict[int, tuple[int, int]] = {}  # id -> (bytes, stream), in allocation order
    long_lived: set[int] = set()
    streams = 1 if kind == "one_stream" else 4
    live_bytes = next_id = 0

    def size() -> int:
        if kind == "big":
            return int(2 ** r.uniform(20, 31))
        return int(2 ** r.uniform(8, 30)) if r.random() < 0.5 else int(2 ** r.uniform(8, 16))

    def free(ident: int, stream: int) -> None:
        nonlocal live_bytes
        nbytes, _ = live.pop(ident)
        long_lived.discard(ident)
        live_bytes -= nbytes
        out.append((1, ident, nbytes, stream))

    for _ in range(events):
        stream = r.randrange(streams)
        if r.random() < 0.55 or not live:
            nbytes = size()
            out.append((0, next_id, nbytes, stream))
            live[next_id] = (nbytes, stream)
            live_bytes += nbytes
            if r.random() < 0.1:
                long_lived.add(next_id)
            next_id += 1
        else:
            short = [i for i in live if i not in long_lived] or list(live)
            ident = short[0] if kind == "fifo" else r.choice(short[-50:])
            freeing = live[ident][1] if r.random() < 0.8 else stream
            free(ident, freeing)
        while live_bytes > LIVE_CAP:
            ident = next(iter(live))
            free(ident, live[ident][1])
    for ident in list(live):
        free(ident, live[ident][1])
    return out


def replay_pass(pool, events: list[tuple[int, int, int, int]], stream_base: int = 100) -> None:
    """Replays ``events`` once, in order, on a host pool (stream ``s`` of the log is
    ``stream_base + s``); what the log leaves live is freed after it."""
    live = {}
    for action, ident, nbytes, stream in events:
        if action == 0:
            live[ident] = (pool.allocate(nbytes, stream=stream_base + stream), nbytes, stream)
        else:
            pool.deallocate(live.pop(ident)[0], nbytes, stream=stream_base + stream)
    for ptr, nbytes, stream in live.values():
        pool.deallocate(ptr, nbytes, stream=stream_base + stream)


def peak_live_bytes(events: list[tuple[int, int, int, int]]) -> int:
    """The most bytes live at once."""
    now = peak = 0
    for action, _, nbytes, _ in events:
        now += nbytes if action == 0 else -nbytes
        peak = max(peak, now)
    return peak


#: name -> a function that makes the log (each of two seeds).
SHAPES = {
    f"{kind}_{seed}": (lambda kind=kind, seed=seed: shape(kind, seed))
    for kind in ("mixed", "one_stream", "big", "fifo")
    for seed in (1, 2)
}
