# SPDX-License-Identifier: Apache-2.0
# HazardTrackingResourceAdaptor: included by memory_resource.pyx (one extension module).

import atexit
import sys
import warnings
import weakref

from libcpp cimport bool as cbool
from libcpp.string cimport string
from libcpp.utility cimport pair

from rmm_fences._hazards import (
    HazardError,
    HazardWarning,
    allocation_from_fields,
    format_report,
    hazard_from_fields,
    leak_record,
)

from rmm_fences._lib._tracking cimport (
    allocation_fields,
    allocation_record,
    hazard_fields,
    hazard_record,
    hazard_tracker_stats,
    tracker_stats_dict,
)

ctypedef void (*hazard_hook_fn)(const hazard_record&, void*) noexcept
ctypedef cbool (*python_stack_fn)(string&) noexcept


cdef extern from "rmm_fences/hazard_tracking_resource_adaptor.hpp" \
        namespace "rmm_fences::mr" nogil:
    cdef cppclass tracker_core \
            "rmm_fences::mr::detail::hazard_tracking_resource_adaptor_impl::core_type":
        void* allocate(stream_ref, size_t, size_t, hazard_record*) except +
        cbool deallocate(stream_ref, void*, size_t, size_t, hazard_record*) except +
        cbool record_stream(void*, stream_ref) except +
        void poll() except +
        vector[allocation_record] outstanding() except +
        vector[hazard_record] hazards() except +
        void reset() except +
        hazard_tracker_stats stats() except +
        vector[pair[uintptr_t, size_t]] stream_bytes() except +
        size_t pending_checks() except +
        void set_hazard_hook(hazard_hook_fn, void*)
        void set_capture_stacks(cbool, python_stack_fn)

    cdef cppclass hazard_tracking_resource_adaptor_impl \
            "rmm_fences::mr::detail::hazard_tracking_resource_adaptor_impl":
        tracker_core& core()
        cbool nvtx_active()

    cdef cppclass hazard_tracking_resource_adaptor:
        hazard_tracking_resource_adaptor(
            any_resource[device_accessible] upstream,
            cbool upstream_stream_ordered,
            cbool nvtx,
        ) except +
        hazard_tracking_resource_adaptor_impl& get()


cdef extern from *:
    optional[device_async_resource_ref] make_device_async_resource_ref(
        hazard_tracking_resource_adaptor&) except +


cdef cbool _python_stack(string& out) noexcept with gil:
    """The calling thread's Python frames (innermost last), if it has any."""
    try:
        frame = sys._getframe(0)
    except ValueError:
        return False
    lines = []
    while frame is not None and len(lines) < 32:  # no source lookup: cheap on every call
        code = frame.f_code
        lines.append(f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}')
        frame = frame.f_back
    out = "\n".join(reversed(lines)).encode()
    return True


cdef void _warn_hazard(const hazard_record& h, void* context) noexcept with gil:
    record = hazard_from_fields(hazard_fields(h))
    warnings.warn(HazardWarning(record.message), stacklevel=2)


# Trackers alive at interpreter exit: hooks off (no callback into a finalizing interpreter),
# and leaks reported where asked.
_live_trackers = weakref.WeakSet()


@atexit.register
def _trackers_at_exit():
    for tracker in list(_live_trackers):
        tracker._at_exit()


def _pointer_of(buffer_or_ptr) -> int:
    if isinstance(buffer_or_ptr, int):
        return buffer_or_ptr
    cai = getattr(buffer_or_ptr, "__cuda_array_interface__", None)
    if cai is not None:
        return cai["data"][0]
    ptr = getattr(buffer_or_ptr, "ptr", None)
    if isinstance(ptr, int):
        return ptr
    raise TypeError(
        "buffer_or_ptr must be an int pointer, an object with __cuda_array_interface__ "
        f"(CuPy, Numba, PyTorch) or a .ptr attribute (rmm DeviceBuffer); got "
        f"{type(buffer_or_ptr).__name__}"
    )


cdef class _HazardTrackingResourceAdaptor(UpstreamResourceAdaptor):
    cdef unique_ptr[hazard_tracking_resource_adaptor] c_obj
    cdef tracker_core* core
    cdef readonly str on_hazard
    cdef readonly cbool upstream_stream_ordered
    cdef readonly cbool capture_stacks
    cdef readonly cbool nvtx
    cdef readonly cbool report_at_exit
    cdef cbool _strict
    cdef uint64_t _checked_serial
    cdef list _exit_leaks
    cdef object __weakref__

    def __cinit__(self, DeviceMemoryResource upstream_mr, cbool upstream_stream_ordered,
                  cbool capture_stacks, str on_hazard, cbool nvtx, cbool report_at_exit):
        self.on_hazard = on_hazard
        self.upstream_stream_ordered = upstream_stream_ordered
        self.capture_stacks = capture_stacks
        self.nvtx = nvtx
        self.report_at_exit = report_at_exit
        self._strict = on_hazard == "raise"
        self._exit_leaks = []
        self.c_obj.reset(new hazard_tracking_resource_adaptor(
            any_resource[device_accessible](upstream_mr.get_mr()),
            upstream_stream_ordered,
            nvtx,
        ))
        self.c_ref = make_device_async_resource_ref(deref(self.c_obj))
        self.core = &deref(self.c_obj).get().core()
        if on_hazard == "warn":
            self.core.set_hazard_hook(_warn_hazard, <void*>self)
        if capture_stacks:
            self.core.set_capture_stacks(True, _python_stack)
        _live_trackers.add(self)

    def __dealloc__(self):
        if self.core != NULL:
            self.core.set_hazard_hook(NULL, NULL)
            self.core.set_capture_stacks(False, NULL)

    def _at_exit(self):
        self.core.set_hazard_hook(NULL, NULL)
        self.core.set_capture_stacks(False, NULL)
        if self.report_at_exit:
            self._exit_leaks = [leak_record(a) for a in self.outstanding()]
            if self._exit_leaks or self.hazards:
                sys.stderr.write(self.report())

    def allocate(self, size_t nbytes, stream=DEFAULT_STREAM) -> int:
        """Allocate ``nbytes`` on ``stream`` from the upstream and track the block.

        With ``on_hazard="raise"``, a block that the upstream hands out before the fence of
        its previous free completed (``reuse_before_fence``) goes back to the upstream and
        :class:`HazardError` is raised.
        """
        cdef Stream s = _resource_stream(stream)
        cdef stream_ref c_stream = s.view()
        cdef hazard_record stopped
        cdef hazard_record* out = &stopped if self._strict else NULL
        cdef void* ptr
        with nogil:
            ptr = self.core.allocate(c_stream, nbytes, 256, out)
        if ptr == NULL and nbytes != 0 and self._strict:
            raise HazardError([hazard_from_fields(hazard_fields(stopped))])
        return <uintptr_t>ptr

    def deallocate(self, uintptr_t ptr, size_t nbytes, stream=DEFAULT_STREAM) -> None:
        """Free ``ptr`` on ``stream``.

        A double, foreign or wrong-size free never reaches the upstream. With
        ``on_hazard="raise"``, it raises :class:`HazardError`, and so does a free while a
        stream that used the block still has work queued over an upstream that is not
        stream-ordered (``freed_in_flight``); the block then stays allocated.
        """
        cdef Stream s = _resource_stream(stream)
        cdef stream_ref c_stream = s.view()
        cdef hazard_record stopped
        cdef hazard_record* out = &stopped if self._strict else NULL
        cdef cbool halted
        with nogil:
            halted = self.core.deallocate(c_stream, <void*>ptr, nbytes, 256, out)
        if halted:
            raise HazardError([hazard_from_fields(hazard_fields(stopped))])

    def record_stream(self, buffer_or_ptr, stream) -> None:
        """Declare that ``stream`` uses the allocation ``buffer_or_ptr``.

        Its free is then ordered after the work queued on ``stream`` up to the free (the
        freeing stream waits on the device, the host never blocks), as
        ``torch.Tensor.record_stream`` promises. ``buffer_or_ptr``: the pointer an
        allocation returned, an rmm ``DeviceBuffer``, or an array with
        ``__cuda_array_interface__`` that starts at its allocation.
        """
        cdef uintptr_t ptr = _pointer_of(buffer_or_ptr)
        cdef Stream s = _as_stream(stream)
        cdef stream_ref c_stream = s.view()
        if not self.core.record_stream(<void*>ptr, c_stream):
            raise ValueError(
                f"buffer_or_ptr ({ptr:#x}) is not the start of a live allocation of this "
                "tracker; record_stream takes the pointer an allocation returned"
            )

    @property
    def nvtx_active(self) -> bool:
        """Whether a tool (compute-sanitizer, Nsight Systems) took the NVTX memory
        annotations; known after the first allocation."""
        return deref(self.c_obj).get().nvtx_active()

    def outstanding(self) -> list:
        """The live allocations, oldest first, as :class:`AllocationRecord` objects."""
        return [allocation_from_fields(allocation_fields(a)) for a in self.core.outstanding()]

    @property
    def allocated_bytes(self) -> int:
        """Bytes allocated and not freed."""
        return self.core.stats().allocated_bytes

    @property
    def peak_bytes(self) -> int:
        """The most bytes allocated at once since construction or :meth:`reset`."""
        return self.core.stats().peak_bytes

    @property
    def stream_bytes(self) -> dict:
        """Bytes allocated and not freed, per allocation stream key (the handle; 0: legacy
        default; a per-thread default stream: ``(thread << 3) | 2``)."""
        return {int(k): int(v) for k, v in self.core.stream_bytes()}

    @property
    def hazards(self) -> list:
        """Every hazard seen since construction or :meth:`reset`, as :class:`HazardRecord`
        objects, oldest first (the deferred checks that can be settled now are settled
        first)."""
        self.core.poll()
        return [hazard_from_fields(hazard_fields(h)) for h in self.core.hazards()] + list(
            self._exit_leaks)

    @property
    def stats(self) -> dict:
        """Counters: ``allocations``, ``deallocations``, ``rejected_frees``, ``fences``,
        ``stream_waits``, ``unchecked`` (checks that could not be made: stream capture, a
        failed event record, query or stream wait, another thread's per-thread default
        stream), ``hazards``, ``allocated_bytes``, ``peak_bytes``, ``pending_checks``."""
        out = tracker_stats_dict(self.core.stats())
        out["pending_checks"] = self.core.pending_checks()
        return out

    def check(self) -> None:
        """Raise :class:`HazardError` for the hazards seen since the last ``check()`` (or
        :meth:`reset`) that were not raised already."""
        hazards = self.hazards
        found = [h for h in hazards if h.serial > self._checked_serial and not h.raised]
        self._checked_serial = max([self._checked_serial] + [h.serial for h in hazards])
        if found:
            raise HazardError(found)

    def reset(self) -> None:
        """Forget the recorded hazards; the peak restarts from the bytes allocated now."""
        self.core.reset()
        self._checked_serial = 0
        self._exit_leaks = []

    def report(self, format="text") -> str:
        """The hazards seen and the allocations still live (reported as ``leak``).

        ``format``: ``"text"`` (one line per record, with stacks when captured) or
        ``"json"``.
        """
        if format not in ("text", "json"):
            raise ValueError(f"format must be 'text' or 'json', got {format!r}")
        hazards = [h for h in self.hazards if h.kind != "leak"]
        leaks = [leak_record(a) for a in self.outstanding()] or list(self._exit_leaks)
        s = self.core.stats()
        summary = {
            "upstream": type(self.get_upstream()).__name__,
            "upstream_stream_ordered": bool(self.upstream_stream_ordered),
            "allocated_bytes": s.allocated_bytes,
            "peak_bytes": s.peak_bytes,
            "outstanding": len(leaks),
            "stream_bytes": {hex(k): v for k, v in self.stream_bytes.items()},
        }
        return format_report(summary, hazards, leaks, format)


_ORDERED_TYPES = None
_PASS_THROUGH_TYPES = None


def _infer_stream_ordered(mr) -> bool:
    """Whether ``mr`` orders reuse by stream or frees synchronously (see the tracker)."""
    global _ORDERED_TYPES, _PASS_THROUGH_TYPES
    import rmm.mr as m
    if _ORDERED_TYPES is None:
        _ORDERED_TYPES = tuple(
            getattr(m, name) for name in (
                "CudaMemoryResource", "ManagedMemoryResource", "CudaAsyncMemoryResource",
                "CudaAsyncViewMemoryResource", "PoolMemoryResource", "ArenaMemoryResource",
                "FixedSizeMemoryResource", "BinningMemoryResource",
            ) if hasattr(m, name)
        ) + (_StreamOrderedPoolMemoryResource, _SyncOnFreeResourceAdaptor)
        _PASS_THROUGH_TYPES = tuple(
            getattr(m, name) for name in (
                "StatisticsResourceAdaptor", "LimitingResourceAdaptor",
                "LoggingResourceAdaptor", "TrackingResourceAdaptor",
                "FailureCallbackResourceAdaptor",
            ) if hasattr(m, name)
        ) + (_HazardTrackingResourceAdaptor,)
    while isinstance(mr, _PASS_THROUGH_TYPES):
        mr = mr.get_upstream()
    return isinstance(mr, _ORDERED_TYPES)


class HazardTrackingResourceAdaptor(_HazardTrackingResourceAdaptor):
    """Track every live allocation and report the hazards of freeing while work may use it.

    Parameters
    ----------
    upstream_mr : DeviceMemoryResource
        Serves the allocations.
    upstream_stream_ordered : bool, optional
        Whether the upstream orders reuse by stream, or frees synchronously. ``None``
        (default): inferred -- ``CudaAsyncMemoryResource``, ``PoolMemoryResource``,
        ``ArenaMemoryResource``, ``BinningMemoryResource``, ``FixedSizeMemoryResource``,
        :class:`rmm_fences.StreamOrderedPoolMemoryResource` and
        :class:`rmm_fences.SyncOnFreeResourceAdaptor` are stream-ordered,
        ``CudaMemoryResource`` and ``ManagedMemoryResource`` free synchronously; statistics,
        limiting, logging and tracking adaptors take their upstream's answer; anything else
        (``rmm_fences.unsafe``, callback resources) is treated as not stream-ordered.
    capture_stacks : bool
        Record where each allocation and hazard came from: Python frames when the call came
        through Python, native frames otherwise. Off by default (it costs microseconds).
    on_hazard : {"warn", "raise", "record"}
        ``"warn"`` (default): a :class:`HazardWarning` when a hazard is seen, and a record.
        ``"raise"``: calls made from Python through :meth:`allocate` and :meth:`deallocate`
        raise :class:`HazardError` before anything reaches the upstream; hazards seen in
        calls from C++ (``DeviceBuffer``, CuPy, cuda.compute) are recorded and raised by the
        next :meth:`check`. ``"record"``: only record.
    nvtx : bool
        Register each allocation as an NVTX memory region of its device allocation (a pool
        chunk), so that ``compute-sanitizer --tool memcheck`` flags accesses outside the
        sub-allocation. Free without a tool attached. Default ``True``.
    report_at_exit : bool
        At interpreter exit, record the allocations still live as ``leak`` hazards and print
        :meth:`report` to stderr if there is any hazard. Default ``False``.

    Notes
    -----
    Hazards (the names of docs/design.md#hazards):

    - ``double_free``, ``foreign_free``, ``size_mismatch``: never reach the upstream.
    - ``freed_in_flight``: over an upstream that is not stream-ordered, a stream that used the
      block (the freeing stream, the allocation stream, declared streams) still had work
      queued at the free (an event recorded at the free is queried).
    - ``reuse_before_fence``: over such an upstream, a block handed out on a stream while the
      fence of its previous free on another stream had not completed.
    - ``cross_stream_free``: freed on a stream other than its allocation stream without being
      ordered after the work queued there: the fence recorded at the free completed while
      that work still ran. Declaring the use with :meth:`record_stream` orders the free. A
      free that cannot be ordered after another thread's per-thread default stream (its
      allocation stream or a declared one) is reported at once, and counted as unchecked.
    - ``allocated_while_live``: the upstream handed out an address that is still live; both
      allocations are tracked (each free takes the one of its size).
    - ``leak``: live at :meth:`report` or, with ``report_at_exit``, at exit.

    The tracker sees streams only through allocations, frees and :meth:`record_stream`: a
    block used on a stream it was never told about is invisible to it. Over a stream-ordered
    upstream a free on the allocation stream makes no CUDA call. A check that cannot be made
    is counted in ``stats["unchecked"]``, never passed nor reported falsely: while the stream
    involved is being captured, when an event record, query or stream wait fails, for
    another thread's per-thread default stream. Streams are identified by their handle, the
    per-thread default stream by handle and thread.

    Examples
    --------
    >>> import rmm
    >>> from rmm_fences import HazardTrackingResourceAdaptor
    >>> mr = HazardTrackingResourceAdaptor(rmm.mr.CudaAsyncMemoryResource())
    >>> rmm.mr.set_current_device_resource(mr)
    >>> print(mr.report())  # doctest: +SKIP
    """

    def __new__(cls, upstream_mr, *, upstream_stream_ordered=None, capture_stacks=False,
                on_hazard="warn", nvtx=True, report_at_exit=False):
        _check_upstream(upstream_mr)
        if on_hazard not in ("warn", "raise", "record"):
            raise ValueError(
                f"on_hazard must be one of 'warn', 'raise', 'record'; got {on_hazard!r}")
        for name, value in (("capture_stacks", capture_stacks), ("nvtx", nvtx),
                            ("report_at_exit", report_at_exit)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
        if upstream_stream_ordered is None:
            upstream_stream_ordered = _infer_stream_ordered(upstream_mr)
        elif not isinstance(upstream_stream_ordered, bool):
            raise TypeError(
                "upstream_stream_ordered must be None (infer) or a bool, got "
                f"{type(upstream_stream_ordered).__name__}")
        return super().__new__(cls, upstream_mr, upstream_stream_ordered, capture_stacks,
                               on_hazard, nvtx, report_at_exit)

    def __init__(self, upstream_mr, *, upstream_stream_ordered=None, capture_stacks=False,
                 on_hazard="warn", nvtx=True, report_at_exit=False):
        pass

    def __repr__(self):
        return (
            f"{type(self).__name__}({type(self.get_upstream()).__name__}(), "
            f"upstream_stream_ordered={bool(self.upstream_stream_ordered)}, "
            f"on_hazard={self.on_hazard!r})"
        )
