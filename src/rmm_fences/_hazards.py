# SPDX-License-Identifier: Apache-2.0
"""Hazard records, errors and reports of :class:`rmm_fences.HazardTrackingResourceAdaptor`.

Pure Python, importable without a GPU; only :data:`HAZARD_KINDS` (the names of the C++
``hazard_kind``) comes from the extension, on first use.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


def __getattr__(name):
    # HAZARD_KINDS: the names of the C++ enum hazard_kind, in its order, as the extension
    # exports them (one definition); read lazily because the extension imports this module.
    if name == "HAZARD_KINDS":
        from rmm_fences._lib.memory_resource import HAZARD_KINDS

        return HAZARD_KINDS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class AllocationRecord:
    """A live allocation seen by a tracker."""

    pointer: int
    size: int
    stream: int
    """Key of the allocation stream: its handle (0: the legacy default stream), or for a
    per-thread default stream ``(thread << 3) | 2`` (see :func:`stream_name`)."""
    streams: tuple[int, ...] = ()
    """Other streams declared with ``record_stream``."""
    stack: str | None = None
    """Where it was allocated (``capture_stacks=True``)."""


@dataclass(frozen=True)
class HazardRecord:
    """One hazard observed by a tracker."""

    kind: str
    """One of :data:`HAZARD_KINDS`."""
    pointer: int
    size: int
    """Bytes named by the call that showed the hazard."""
    stream: int
    """Stream of that call (the freeing or allocating stream)."""
    streams: tuple[int, ...]
    """Streams whose unfinished work makes it a hazard."""
    message: str
    tracked_size: int = 0
    """Bytes of the block as allocated (0 when the pointer was not a live block)."""
    stack: str | None = None
    """Where the hazard showed (``capture_stacks=True``)."""
    allocation_stack: str | None = None
    """Where the block was allocated (``capture_stacks=True``)."""
    serial: int = 0
    raised: bool = field(default=False, repr=False, compare=False)


class HazardError(RuntimeError):
    """A memory hazard seen by a tracker with ``on_hazard="raise"`` (or by ``check()``).

    ``hazards`` holds the :class:`HazardRecord` objects that caused it.
    """

    def __init__(self, hazards):
        self.hazards = list(hazards)
        lines = [h.message for h in self.hazards[:10]]
        if len(self.hazards) > 10:
            lines.append(f"... and {len(self.hazards) - 10} more")
        super().__init__("\n".join(lines))


class HazardWarning(RuntimeWarning):
    """A memory hazard seen by a tracker with ``on_hazard="warn"``."""


def is_per_thread_key(key: int) -> bool:
    """Whether a stream key names a per-thread default stream (``(thread << 3) | 2``; stream
    handles are 8-byte aligned)."""
    return key & 7 == 2 and key > 7


def stream_name(handle: int) -> str:
    """A stream key in words: its handle, or the per-thread default stream of a thread (the
    tracker numbers threads from 1 in the order they first used it)."""
    if handle == 0:
        return "the legacy default stream"
    if handle == 2:
        return "the per-thread default stream"
    if is_per_thread_key(handle):
        return f"the per-thread default stream of thread {handle >> 3}"
    return f"stream {handle:#x}"


def _streams(handles) -> str:
    return ", ".join(stream_name(s) for s in handles)


def describe(kind, ptr, size, tracked_size, stream, streams) -> str:
    """The message of a hazard, from its fields."""
    where = f"{size} bytes at {ptr:#x}"
    if kind == "freed_in_flight":
        return (
            f"freed_in_flight: {where} freed on {stream_name(stream)} while "
            f"{_streams(streams)} still had work queued, and the upstream may hand the block "
            "out again at once (wrap it in SyncOnFreeResourceAdaptor)"
        )
    if kind == "reuse_before_fence":
        return (
            f"reuse_before_fence: the upstream handed {where} to {stream_name(stream)} while "
            f"the fence of its free on {_streams(streams)} had not completed"
        )
    if kind == "cross_stream_free" and any(is_per_thread_key(s) and s != stream for s in streams):
        return (
            f"cross_stream_free: {where} freed on {stream_name(stream)}, which cannot be "
            f"ordered after {_streams(streams)}: another thread's per-thread default stream "
            "cannot be named from the freeing thread, so the tracker can neither wait for it "
            "nor check it (counted in stats['unchecked']); free the block on its allocation "
            "thread, or use streams you created"
        )
    if kind == "cross_stream_free":
        return (
            f"cross_stream_free: {where} freed on {stream_name(stream)}, which was not ordered "
            f"after the work still running on {_streams(streams)}, its allocation stream "
            "(order the streams, or declare the use with record_stream)"
        )
    if kind == "double_free":
        return f"double_free: {where} freed again on {stream_name(stream)}; not passed upstream"
    if kind == "foreign_free":
        return (
            f"foreign_free: {where} freed on {stream_name(stream)} was never allocated by this "
            "resource; not passed upstream"
        )
    if kind == "size_mismatch":
        return (
            f"size_mismatch: {ptr:#x} freed with {size} bytes but allocated with "
            f"{tracked_size}; not passed upstream"
        )
    if kind == "leak":
        return f"leak: {where} allocated on {stream_name(stream)} was never freed"
    if kind == "allocated_while_live":
        return (
            f"allocated_while_live: the upstream handed {where} to {stream_name(stream)} "
            f"while its allocation of {tracked_size} bytes on {_streams(streams)} was still "
            "live (the upstream hands out memory in use); both allocations are tracked, each "
            "free takes the one of its size"
        )
    raise ValueError(f"unknown hazard kind {kind!r}")


def hazard_from_fields(fields) -> HazardRecord:
    kind, ptr, size, tracked_size, stream, streams, stack, alloc_stack, serial, raised = fields
    return HazardRecord(
        kind=kind,
        pointer=ptr,
        size=size,
        stream=stream,
        streams=tuple(streams),
        message=describe(kind, ptr, size, tracked_size, stream, streams),
        tracked_size=tracked_size,
        stack=stack,
        allocation_stack=alloc_stack,
        serial=serial,
        raised=raised,
    )


def allocation_from_fields(fields) -> AllocationRecord:
    ptr, size, stream, declared, stack = fields
    return AllocationRecord(ptr, size, stream, tuple(declared), stack)


def leak_record(a: AllocationRecord) -> HazardRecord:
    return HazardRecord(
        kind="leak",
        pointer=a.pointer,
        size=a.size,
        stream=a.stream,
        streams=(),
        message=describe("leak", a.pointer, a.size, a.size, a.stream, ()),
        tracked_size=a.size,
        allocation_stack=a.stack,
    )


def format_report(summary: dict, hazards, leaks, format: str) -> str:
    """The text or JSON report of a tracker (see ``HazardTrackingResourceAdaptor.report``)."""
    if format == "json":
        return json.dumps(
            {
                **summary,
                "hazards": [{k: v for k, v in asdict(h).items() if k != "raised"} for h in hazards],
                "leaks": [{k: v for k, v in asdict(h).items() if k != "raised"} for h in leaks],
            },
            indent=2,
        )
    if format != "text":
        raise ValueError(f"format must be 'text' or 'json', got {format!r}")
    counts = {}
    for h in list(hazards) + list(leaks):
        counts[h.kind] = counts.get(h.kind, 0) + 1
    lines = [
        f"HazardTrackingResourceAdaptor over {summary['upstream']}"
        f" (upstream_stream_ordered={summary['upstream_stream_ordered']})",
        f"  allocated: {summary['allocated_bytes']} bytes in {summary['outstanding']} blocks,"
        f" peak {summary['peak_bytes']} bytes",
        "  hazards: " + (", ".join(f"{k} x{n}" for k, n in counts.items()) if counts else "none"),
    ]
    for h in list(hazards) + list(leaks):
        lines.append(f"  - {h.message}")
        for title, stack in (("at", h.stack), ("allocated at", h.allocation_stack)):
            if stack:
                lines.append(f"      {title}:")
                lines.extend("      " + line for line in stack.rstrip("\n").splitlines())
    return "\n".join(lines) + "\n"
