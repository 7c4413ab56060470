# SPDX-License-Identifier: Apache-2.0
"""rmm allocation logs (the CSV of ``rmm.mr.LoggingResourceAdaptor``) read into a
:class:`Trace`, and written back in the same format (re-exported by :mod:`rmm_fences_bench`).

The format, as librmm 26.x writes it (``logging_resource_adaptor_impl.cpp``): a header line
``Thread,Time,Action,Pointer,Size,Stream``, then one line per call,
``<thread>,<HH:MM:SS.ffffff>,<action>,<pointer>,<size>,<stream>``: the thread is the logger's
``%t`` (the OS thread id, decimal), the time its ``%H:%M:%S.%f`` (microseconds, time of day),
the action ``allocate``, ``free`` or ``allocate failure``, the pointer printf's ``%p``
(``0x7f...``, ``(nil)`` for a null pointer), the size decimal bytes and the stream the stream
handle as libstdc++ prints a pointer (``rmm::detail::format_stream``): ``0x55d9f1a2b3c0``, and
``0`` for the legacy default stream (hex without ``0x`` reads the same).
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import os
from typing import Any

import numpy as np

#: The header line rmm's logging adaptor writes, and its columns.
HEADER = ("Thread", "Time", "Action", "Pointer", "Size", "Stream")
ALLOCATE, FREE = 0, 1
_DAY = 86400.0
_FAKE_BASE = 0x7F0000000000  # pointers written for allocation ids: base + id * _FAKE_STEP
_FAKE_STEP = 0x1000


def _parse_time(text: str) -> float:
    """Seconds of the day of ``HH:MM:SS.ffffff`` (older rmm wrote ``HH:MM:SS:ffffff``)."""
    parts = text.strip().replace(".", ":").split(":")
    if len(parts) != 4:
        raise ValueError(f"bad time {text!r} (expected HH:MM:SS.ffffff)")
    h, m, s, frac = parts
    return int(h) * 3600 + int(m) * 60 + int(s) + int(frac) / 10 ** len(frac)


def _parse_pointer(text: str) -> int:
    text = text.strip()
    return 0 if text in ("(nil)", "") else int(text, 16)


@dataclasses.dataclass(frozen=True, eq=False)
class Trace:
    """An allocation log, event by event in recorded order (numpy arrays of one length).

    ``thread``: recorded thread index (0 .. threads - 1, in order of first appearance);
    ``action``: ``ALLOCATE`` (0) or ``FREE`` (1); ``id``: allocation id (a pointer is mapped
    to an id per lifetime: reused after its free it is a new id; ids count up from 0 in order of
    allocation); ``size``: bytes; ``stream``: recorded stream index (0 .. streams - 1);
    ``time``: seconds since the first event.

    ``thread_ids`` and ``stream_handles``: what the log recorded for each index (OS thread id,
    stream handle). ``start_time``: seconds of the day of the first event.
    ``failed_allocations``: ``allocate failure`` lines, left out (the recording's allocation
    threw, so nothing was allocated; rmm's replay ignores them too). ``dropped_frees``: frees of
    pointers the log never allocated (a log started mid-run), left out.
    """

    thread: np.ndarray
    action: np.ndarray
    id: np.ndarray
    size: np.ndarray
    stream: np.ndarray
    time: np.ndarray
    thread_ids: tuple[int, ...] = ()
    stream_handles: tuple[int, ...] = ()
    start_time: float = 0.0
    failed_allocations: int = 0
    dropped_frees: int = 0

    def __post_init__(self):
        n = len(self.action)
        columns = {
            "thread": np.uint32,
            "action": np.uint8,
            "id": np.uint64,
            "size": np.uint64,
            "stream": np.uint32,
            "time": np.float64,
        }
        for name, dtype in columns.items():
            value = np.ascontiguousarray(getattr(self, name), dtype=dtype)
            if value.shape != (n,):
                raise ValueError(f"Trace.{name} must have shape ({n},), got {value.shape}")
            value.flags.writeable = False
            object.__setattr__(self, name, value)
        if n and int(self.thread.max()) >= self.threads:
            raise ValueError("Trace.thread holds an index without a thread_ids entry")
        if n and int(self.stream.max()) >= self.streams:
            raise ValueError("Trace.stream holds an index without a stream_handles entry")
        if n and int(self.action.max()) > FREE:
            raise ValueError("Trace.action holds a value other than ALLOCATE (0) and FREE (1)")
        # each id allocated once, freed at most once, after its allocation
        state: dict[int, int] = {}
        for i, (act, ident) in enumerate(zip(self.action.tolist(), self.id.tolist())):
            if act == ALLOCATE:
                if ident in state:
                    raise ValueError(f"event {i}: allocation id {ident} allocated twice")
                state[ident] = 1
            elif state.get(ident) != 1:
                raise ValueError(f"event {i}: free of allocation id {ident}, which is not live")
            else:
                state[ident] = 2

    @classmethod
    def from_events(cls, events, *, threads=None, streams=None) -> Trace:
        """A trace of ``(thread, action, id, size, stream[, time])`` tuples (action
        ``"allocate"``/``"free"`` or ``ALLOCATE``/``FREE``); a free's size may be ``None`` (its
        allocation's size). ``threads``/``streams``: the recorded thread ids and stream handles
        (default: the indexes themselves)."""
        names = {"allocate": ALLOCATE, "free": FREE, ALLOCATE: ALLOCATE, FREE: FREE}
        cols: list[list[Any]] = [[], [], [], [], [], []]
        sizes: dict[int, int] = {}
        for k, e in enumerate(events):
            thread, action, ident, size, stream = e[:5]
            act = names[action]
            if act == ALLOCATE:
                sizes[ident] = size
            elif size is None:
                size = sizes[ident]
            for col, v in zip(cols, (thread, act, ident, size, stream, e[5] if len(e) > 5 else k)):
                col.append(v)
        n_threads = max(cols[0], default=-1) + 1
        n_streams = max(cols[4], default=-1) + 1
        return cls(
            *cols,
            thread_ids=tuple(range(n_threads)) if threads is None else tuple(threads),
            stream_handles=tuple(range(n_streams)) if streams is None else tuple(streams),
        )

    def __len__(self) -> int:
        return len(self.action)

    @property
    def events(self) -> int:
        return len(self.action)

    @property
    def threads(self) -> int:
        return len(self.thread_ids)

    @property
    def streams(self) -> int:
        return len(self.stream_handles)

    @property
    def allocations(self) -> int:
        return int(np.count_nonzero(self.action == ALLOCATE))

    @property
    def frees(self) -> int:
        return int(np.count_nonzero(self.action == FREE))

    @property
    def total_bytes(self) -> int:
        """Bytes of all allocations."""
        return int(self.size[self.action == ALLOCATE].sum(dtype=np.uint64))

    @property
    def peak_live_bytes(self) -> int:
        """Most bytes live at once, in recorded order (a free gives back its allocation's size,
        as the replay frees it)."""
        if not len(self):
            return 0
        allocs = self.action == ALLOCATE
        by_id = np.zeros(int(self.id.max()) + 1, dtype=np.int64)
        by_id[self.id[allocs]] = self.size[allocs]
        signed = np.where(allocs, self.size.astype(np.int64), -by_id[self.id])
        return int(max(np.cumsum(signed).max(), 0))

    def stats(self) -> dict:
        """``events``, ``threads``, ``streams``, ``allocations``, ``frees``, ``leftovers``
        (allocations never freed), ``total_bytes``, ``peak_live_bytes``,
        ``failed_allocations``, ``dropped_frees``, ``seconds`` (recorded span)."""
        return {
            "events": self.events,
            "threads": self.threads,
            "streams": self.streams,
            "allocations": self.allocations,
            "frees": self.frees,
            "leftovers": self.allocations - self.frees,
            "total_bytes": self.total_bytes,
            "peak_live_bytes": self.peak_live_bytes,
            "failed_allocations": self.failed_allocations,
            "dropped_frees": self.dropped_frees,
            "seconds": float(self.time[-1]) if len(self) else 0.0,
        }


def _open_text(path_or_file):
    """(text stream, whether we opened it): gzip by magic number, path or file object."""
    if hasattr(path_or_file, "read"):
        f = path_or_file
        if isinstance(f, io.TextIOBase):
            return f, False
        data = f.read()
        if isinstance(data, str):
            return io.StringIO(data), False
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        return io.StringIO(data.decode()), False
    path = os.fspath(path_or_file)
    with open(path, "rb") as raw:
        magic = raw.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", newline=""), True
    return open(path, newline=""), True


def read_allocation_log(path_or_file) -> Trace:
    """Reads an rmm allocation log (``rmm.mr.LoggingResourceAdaptor``'s CSV, gzip-compressed or
    not; a path or a file object) into a :class:`Trace`.

    The header line names the columns (rmm's ``Thread,Time,Action,Pointer,Size,Stream``, in
    any order; without a header that order is assumed). ``allocate failure`` lines are left out
    and counted (``failed_allocations``); frees of pointers the log never allocated are left out
    and counted (``dropped_frees``). A pointer allocated again while live (a free the log
    missed) starts a new id; the earlier one stays live to the end.
    """
    f, opened = _open_text(path_or_file)
    try:
        rows = csv.reader(f)
        col = {name: k for k, name in enumerate(HEADER)}
        thread_index: dict[int, int] = {}
        stream_index: dict[int, int] = {}
        live: dict[int, tuple[int, int]] = {}  # pointer -> (id, size)
        out: list[list[Any]] = [[], [], [], [], [], []]
        failed = dropped = next_id = 0
        start = None
        day = 0.0
        last = None
        first = True
        for line, row in enumerate(rows, 1):
            row = [c.strip() for c in row]
            if not row or not any(row):
                continue
            if first:
                first = False
                if set(row) & set(HEADER):  # a header (names, not values)
                    missing = set(HEADER) - set(row)
                    if missing:
                        raise ValueError(f"log header lacks the columns {sorted(missing)}")
                    col = {name: row.index(name) for name in HEADER}
                    continue
            try:
                action = row[col["Action"]]
                tid = int(row[col["Thread"]])
                t = _parse_time(row[col["Time"]])
                ptr = _parse_pointer(row[col["Pointer"]])
                size = int(row[col["Size"]])
                handle = int(row[col["Stream"]], 16)
            except (IndexError, ValueError) as e:
                raise ValueError(f"line {line}: not an rmm allocation log line: {row}") from e
            if last is not None and t + day < last - _DAY / 2:  # past midnight
                day += _DAY
            t += day
            last = t
            if start is None:
                start = t
            if action == "allocate failure":
                failed += 1
                continue
            if action == "allocate":
                ident = next_id
                next_id += 1
                live[ptr] = (ident, size)
                act = ALLOCATE
            elif action == "free":
                if ptr not in live:
                    dropped += 1
                    continue
                ident, _ = live.pop(ptr)
                act = FREE
            else:
                raise ValueError(f"line {line}: unknown action {action!r}")
            thread = thread_index.setdefault(tid, len(thread_index))
            stream = stream_index.setdefault(handle, len(stream_index))
            for column, v in zip(out, (thread, act, ident, size, stream, t - start)):
                column.append(v)
        return Trace(
            *out,
            thread_ids=tuple(thread_index),
            stream_handles=tuple(stream_index),
            start_time=start or 0.0,
            failed_allocations=failed,
            dropped_frees=dropped,
        )
    finally:
        if opened:
            f.close()


def _time_of_day(seconds: float) -> str:
    us = round(seconds * 1e6) % round(_DAY * 1e6)
    s, us = divmod(us, 1_000_000)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{h:02d}:{m:02d}:{s:02d}.{us:06d}"


def _stream_text(handle: int) -> str:
    """A stream handle as rmm logs it (a pointer printed by libstdc++)."""
    return hex(handle) if handle else "0"


def write_allocation_log(trace: Trace, path_or_file) -> None:
    """Writes ``trace`` in rmm's log format (header and columns as rmm's logging adaptor writes
    them; gzip-compressed when a path ends in ``.gz``).

    Written back: the recorded thread ids, stream handles and times (from ``start_time``).
    Pointers are not kept by a trace: allocation id ``k`` is written as the made-up address
    ``0x7f0000000000 + k * 0x1000``, so reading the log back gives the same ids.
    """
    lines = [",".join(HEADER)]
    for thread, act, ident, size, stream, t in zip(
        trace.thread.tolist(),
        trace.action.tolist(),
        trace.id.tolist(),
        trace.size.tolist(),
        trace.stream.tolist(),
        trace.time.tolist(),
    ):
        lines.append(
            f"{trace.thread_ids[thread]},{_time_of_day(trace.start_time + t)},"
            f"{'allocate' if act == ALLOCATE else 'free'},"
            f"{hex(_FAKE_BASE + ident * _FAKE_STEP)},{size},"
            f"{_stream_text(trace.stream_handles[stream])}"
        )
    text = "\n".join(lines) + "\n"
    if hasattr(path_or_file, "write"):
        if isinstance(path_or_file, io.TextIOBase):
            path_or_file.write(text)
        else:
            path_or_file.write(text.encode())
        return
    path = os.fspath(path_or_file)
    if path.endswith(".gz"):
        with gzip.open(path, "wt", newline="") as f:
            f.write(text)
    else:
        with open(path, "w", newline="") as f:
            f.write(text)
