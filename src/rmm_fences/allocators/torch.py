# SPDX-License-Identifier: Apache-2.0
"""PyTorch's CUDA allocations through an RMM resource, honouring ``Tensor.record_stream``.

>>> import rmm_fences.allocators.torch as rt
>>> allocator = rt.install("pool(cuda_async)")  # before PyTorch's first CUDA allocation
>>> import torch
>>> x = torch.ones(1 << 20, device="cuda")  # from the pool
>>> rt.memory_stats()["allocated_bytes.all.current"]  # doctest: +SKIP
4194304

``install()`` swaps PyTorch's CUDA allocator for a ``CUDAPluggableAllocator`` over the entry
points of ``rmm_fences._lib._torch``, once per process and for good: PyTorch can swap its
allocator only before its CUDA lazy init, and never back. PyTorch frees each block on the
stream it was allocated on; a stream named by ``Tensor.record_stream`` gets a fence at the free,
which the allocation stream waits on before the stream-ordered free (docs/torch.md).

``torch.cuda.memory_stats()`` raises under any pluggable allocator: use :func:`memory_stats`.

:func:`mem_pool` is the other route (torch >= 2.8): PyTorch's own caching allocator stays the
global one and a ``torch.cuda.MemPool`` takes its segments from the resource; allocations made
in ``with torch.cuda.use_mem_pool(pool):`` (this thread only) come from it, and leaving the
context switches back. A process uses one route or the other, never both.

Importing this module does not import torch; :func:`install` and :func:`mem_pool` do.
"""

from __future__ import annotations

import importlib
import re
import threading

from rmm_fences._optional import require

__all__ = [
    "TorchAllocator",
    "install",
    "installed",
    "mem_pool",
    "mem_pool_stats",
    "memory_stats",
    "reset_mem_pool_peak",
    "reset_peak_memory_stats",
]

_INSTALLED: TorchAllocator | None = None

#: The oldest PyTorch whose MemPool returns its segments through the pool's allocator (earlier
#: versions cudaFree them, or use the allocator only while the pool is active).
MEM_POOL_MIN_TORCH = (2, 8)


class _PoolRoute:
    """What the first :func:`mem_pool` fixed for the process: the resource (``mr`` as given,
    and as built), its device and the one ``CUDAPluggableAllocator`` every MemPool uses (kept
    alive here: a MemPool refers to its allocator without owning it)."""

    __slots__ = ("given", "resource", "device", "pluggable")

    def __init__(self, given, resource, device, pluggable):
        self.given, self.resource, self.device, self.pluggable = given, resource, device, pluggable

    def describe(self) -> str:
        if self.resource is None:
            return "mr=None (rmm's current resource of each device)"
        what = f"{type(self.resource).__name__} on device {self.device}"
        if self.given is self.resource:
            return what
        return f"{str(self.given)!r} ({what})"


_POOL_ROUTE: _PoolRoute | None = None
_ROUTE_LOCK = threading.Lock()  # install() and the first mem_pool() each fix a route once


def _native():
    """The ``_torch`` extension (importing rmm_fences loads librmm first)."""
    import rmm_fences  # noqa: F401

    return importlib.import_module("rmm_fences._lib._torch")


def _pool_of(mr):
    """The ``StreamOrderedPoolMemoryResource`` that ``mr`` is or wraps (through the
    ``upstream_mr`` of adaptors), or None."""
    from rmm_fences import StreamOrderedPoolMemoryResource

    seen = set()
    while mr is not None and id(mr) not in seen:
        if isinstance(mr, StreamOrderedPoolMemoryResource):
            return mr
        seen.add(id(mr))
        mr = getattr(mr, "upstream_mr", None)
    return None


class TorchAllocator:
    """What :func:`install` installed: the resource, its device and PyTorch's allocator.

    Attributes
    ----------
    resource : rmm.mr.DeviceMemoryResource or None
        The resource every allocation comes from, or None: rmm's current resource of the
        allocation's device, looked up on each call (as ``rmm_torch_allocator`` does).
    device : int or None
        The only device ``resource`` serves (PyTorch asking for another device's memory raises),
        or None with ``resource`` None.
    pluggable : torch.cuda.memory.CUDAPluggableAllocator
        The allocator object handed to ``torch.cuda.memory.change_current_allocator``.
    """

    __slots__ = ("resource", "device", "pluggable")

    def __init__(self, resource, device, pluggable):
        self.resource = resource
        self.device = device
        self.pluggable = pluggable

    def memory_stats(self) -> dict:
        """The counters as a flat dict, with PyTorch's key names where they mean the same.

        PyTorch's keys: ``allocated_bytes.all.{current,peak,allocated,freed}``,
        ``allocation.all.{current,peak,allocated,freed}``, ``num_ooms`` and
        ``num_alloc_retries`` (always 0: nothing is retried here); ``reserved_bytes.all.current``
        only when the resource is, or wraps, a ``StreamOrderedPoolMemoryResource`` (its
        ``pool_bytes``).

        rmm_fences' keys: ``record_stream_calls`` (on a live block), ``recorded_frees`` (frees of
        a block another stream used), ``stream_waits`` (allocation-stream waits on such a
        stream's fence), ``stream_syncs`` (host syncs of such a stream when no fence could be
        waited on), ``leaked_blocks`` / ``leaked_bytes`` (blocks kept from the resource because
        neither worked), ``rejected_frees`` and ``unknown_record_streams``.
        """
        s = _native().stats()
        out = {
            "allocated_bytes.all.current": s["current_bytes"],
            "allocated_bytes.all.peak": s["peak_bytes"],
            "allocated_bytes.all.allocated": s["allocated_bytes"],
            "allocated_bytes.all.freed": s["freed_bytes"],
            "allocation.all.current": s["current_allocations"],
            "allocation.all.peak": s["peak_allocations"],
            "allocation.all.allocated": s["allocations"],
            "allocation.all.freed": s["frees"],
            "num_alloc_retries": 0,
            "num_ooms": s["num_ooms"],
        }
        for key in (
            "record_stream_calls",
            "recorded_frees",
            "stream_waits",
            "stream_syncs",
            "leaked_blocks",
            "leaked_bytes",
            "rejected_frees",
            "unknown_record_streams",
        ):
            out[key] = s[key]
        pool = _pool_of(self.resource)
        if pool is not None:
            out["reserved_bytes.all.current"] = pool.stats["pool_bytes"]
        return out

    def reset_peak_memory_stats(self) -> None:
        """Restart ``allocated_bytes.all.peak`` and ``allocation.all.peak`` from the current
        values."""
        _native().reset_peak()

    def __repr__(self):
        name = "None" if self.resource is None else f"{type(self.resource).__name__}()"
        return f"TorchAllocator(resource={name}, device={self.device})"


def _check_mr(mr) -> None:
    """TypeError unless ``mr`` is None, a spec (string or Spec) or an rmm resource."""
    import rmm

    from rmm_fences.specs import Spec

    if mr is not None and not isinstance(mr, (str, Spec, rmm.mr.DeviceMemoryResource)):
        raise TypeError(
            "mr must be None (rmm's current resource of each device), a compose spec string "
            f"or an rmm.mr.DeviceMemoryResource, got {type(mr).__name__}"
        )


def _resolve_resource(mr, device):
    """(resource, device) for :func:`install`; TypeError on anything else."""
    from rmm_fences.specs import Spec, compose

    _check_mr(mr)
    if mr is None:
        if device is not None:
            raise TypeError(
                "device is only for a given mr; with mr=None every device uses rmm's current "
                f"resource of that device (got device={device!r})"
            )
        return None, None
    if device is None:
        from rmm_fences._cuda import current_device

        device = current_device()
    device = int(device)
    if isinstance(mr, (str, Spec)):
        from rmm_fences._cuda import on_device

        with on_device(device):
            mr = compose(mr)
    return mr, device


def install(mr=None, *, device=None) -> TorchAllocator:
    """Route PyTorch's CUDA allocations through ``mr``, for the rest of the process.

    Parameters
    ----------
    mr : rmm.mr.DeviceMemoryResource, str, Spec or None
        The resource, or a spec of :func:`rmm_fences.compose` (built on ``device``). None: rmm's
        current resource of each allocation's device, looked up on every call.
    device : int, optional
        The device ``mr`` serves (default: the current device). Only with a given ``mr``.

    Must run before PyTorch's first CUDA allocation (its CUDA lazy init), and only once:
    PyTorch cannot swap its allocator afterwards, nor back to its own. The resource is kept
    alive for the rest of the process.

    Raises
    ------
    ImportError
        torch cannot be imported.
    RuntimeError
        PyTorch's CUDA is already initialized, an allocator is already installed, or
        :func:`mem_pool` ran in this process.
    TypeError
        ``mr`` is none of the above (or ``device`` is given with ``mr=None``).
    """
    global _INSTALLED
    torch = require("torch", "rmm_fences.allocators.torch.install()")
    importlib.import_module("torch.cuda.memory")
    with _ROUTE_LOCK:
        if _INSTALLED is not None or _native().is_installed():
            raise RuntimeError(
                "rmm_fences.allocators.torch.install() already ran in this process "
                f"({_INSTALLED!r}); PyTorch's allocator can be swapped only once"
            )
        if _POOL_ROUTE is not None or _native().is_pool_installed():
            raise RuntimeError(
                "rmm_fences.allocators.torch.install() cannot run after mem_pool() in the same "
                "process: a MemPool needs PyTorch's own allocator as the global one, and creating "
                "it initialized that allocator, which PyTorch cannot swap afterwards"
            )
        if torch.cuda.is_initialized():
            raise RuntimeError(
                "rmm_fences.allocators.torch.install() must run before PyTorch's first CUDA "
                "allocation: PyTorch's CUDA is already initialized, and PyTorch cannot swap its "
                "allocator afterwards (nor back to its own)"
            )
        resource, device = _resolve_resource(mr, device)
        native = _native()
        pluggable = torch.cuda.memory.CUDAPluggableAllocator(
            native.__file__, native.ALLOC_FN, native.FREE_FN
        )
        pluggable._allocator.set_record_stream_fn(native.entry_points()["record_stream"])
        torch.cuda.memory.change_current_allocator(pluggable)
        native.install_core(resource, -1 if device is None else device)
        _INSTALLED = TorchAllocator(resource, device, pluggable)
        return _INSTALLED


def installed() -> TorchAllocator | None:
    """What :func:`install` installed in this process, or None."""
    return _INSTALLED


def memory_stats() -> dict:
    """:meth:`TorchAllocator.memory_stats` of the installed allocator (RuntimeError when none
    is installed)."""
    return _require().memory_stats()


def reset_peak_memory_stats() -> None:
    """:meth:`TorchAllocator.reset_peak_memory_stats` of the installed allocator."""
    _require().reset_peak_memory_stats()


def _require() -> TorchAllocator:
    if _INSTALLED is None:
        raise RuntimeError(
            "no rmm_fences torch allocator is installed: call "
            "rmm_fences.allocators.torch.install() before PyTorch's first CUDA allocation"
        )
    return _INSTALLED


def _torch_version(torch) -> tuple[int, int]:
    """(major, minor) of ``torch.__version__`` ("2.11.0+cu130" -> (2, 11))."""
    m = re.match(r"(\d+)\.(\d+)", str(getattr(torch, "__version__", "")))
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _same_resource(route: _PoolRoute, mr, device) -> bool:
    """Whether ``mem_pool(mr, device=device)`` asks for what ``route`` already serves."""
    from rmm_fences.specs import Spec

    if device is not None and route.device is not None and int(device) != route.device:
        return False
    if mr is None:
        return True
    if isinstance(mr, (str, Spec)):
        return isinstance(route.given, (str, Spec)) and str(mr) == str(route.given)
    return mr is route.resource


def mem_pool(mr=None, *, device=None):
    """A ``torch.cuda.MemPool`` whose segments come from ``mr``; PyTorch's own caching allocator
    stays the global allocator.

    >>> pool = rt.mem_pool("pool(cuda_async)")  # doctest: +SKIP
    >>> with torch.cuda.use_mem_pool(pool):  # doctest: +SKIP
    ...     x = torch.empty(1 << 20, device="cuda")  # PyTorch's block, in a segment from mr

    PyTorch's allocator serves the pool: it caches the segments, honours ``record_stream``,
    counts them in ``torch.cuda.memory_stats()`` and handles ``torch.cuda.graph(...,
    pool=pool.id)``. Allocations are routed to the pool inside ``torch.cuda.use_mem_pool(pool)``
    on the current thread only (autograd's backward threads are not routed); leaving the
    context switches back to PyTorch's own segments. The resource sees segments (2 MiB, 20 MiB
    or more), allocated when PyTorch grows the pool and freed on ``torch.cuda.empty_cache()``,
    when the pool is destroyed, or when PyTorch frees its cache to retry after out of memory.
    Out of memory from ``mr`` reaches PyTorch as such: it frees its cache, retries, then raises
    ``torch.cuda.OutOfMemoryError``.

    Parameters
    ----------
    mr : rmm.mr.DeviceMemoryResource, str, Spec or None
        As for :func:`install`: the resource, a spec of :func:`rmm_fences.compose` (built on
        ``device``) or None (rmm's current resource of each segment's device, looked up on every
        call). The first call fixes the resource for the process (one pool core): later calls
        get a new MemPool over the same one when ``mr`` is None, the very same resource object
        or an equal spec (the spec is not built again), and raise otherwise.
    device : int, optional
        The device of the pool, and the one a given ``mr`` serves (default: the device the first
        call fixed, else the current one).

    Requires torch >= 2.8, and PyTorch's own allocator as the global one: it cannot follow
    :func:`install` in a process, nor :func:`install` it. The resource is kept alive for the
    rest of the process.

    Raises
    ------
    ImportError
        torch cannot be imported.
    RuntimeError
        torch is older than 2.8, :func:`install` ran in this process, or a different resource
        was fixed by an earlier call.
    TypeError
        ``mr`` is none of the above.
    """
    torch = require("torch", "rmm_fences.allocators.torch.mem_pool()")
    importlib.import_module("torch.cuda.memory")
    if _torch_version(torch) < MEM_POOL_MIN_TORCH:
        raise RuntimeError(
            "rmm_fences.allocators.torch.mem_pool() needs torch >= 2.8 (installed: "
            f"{torch.__version__}); earlier versions free a MemPool's segments with cudaFree or "
            "use its allocator only while the pool is active. install() works on this version"
        )
    native = _native()
    if _INSTALLED is not None or native.is_installed():
        raise RuntimeError(
            "rmm_fences.allocators.torch.mem_pool() cannot run after install() in the same "
            f"process ({_INSTALLED!r}): a MemPool needs PyTorch's own allocator as the global one, "
            "and install() replaced it for good"
        )
    _check_mr(mr)
    with _ROUTE_LOCK:
        return _make_mem_pool(torch, native, mr, device)


def _make_mem_pool(torch, native, mr, device):
    """:func:`mem_pool` past its checks (under ``_ROUTE_LOCK``)."""
    global _POOL_ROUTE
    route = _POOL_ROUTE
    if route is None:
        if mr is None:
            resource, pool_device = None, None if device is None else int(device)
        else:
            resource, pool_device = _resolve_resource(mr, device)
        pluggable = torch.cuda.memory.CUDAPluggableAllocator(
            native.__file__, native.POOL_ALLOC_FN, native.POOL_FREE_FN
        )
    else:
        if not _same_resource(route, mr, device):
            raise RuntimeError(
                "rmm_fences.allocators.torch.mem_pool() serves one resource per process, and an "
                f"earlier call fixed it: {route.describe()}; call mem_pool() with mr=None or that "
                "resource for another MemPool over it"
            )
        resource, pluggable = route.resource, route.pluggable
        pool_device = route.device if device is None else int(device)
    if pool_device is None:
        pool = torch.cuda.MemPool(pluggable._allocator)
    else:
        with torch.cuda.device(pool_device):
            pool = torch.cuda.MemPool(pluggable._allocator)
    if route is None:
        native.install_pool_core(resource, -1 if resource is None else pool_device)
        _POOL_ROUTE = _PoolRoute(mr, resource, None if resource is None else pool_device, pluggable)
    return pool


def mem_pool_stats() -> dict:
    """The counters of :func:`mem_pool`'s resource, as a flat dict: **segments**, what PyTorch's
    allocator took from the resource for every MemPool of this module, not tensors.

    PyTorch's keys, with the meaning they have in ``torch.cuda.memory_stats()`` (which counts
    every pool of the device, PyTorch's own segments included):
    ``reserved_bytes.all.{current,peak,allocated,freed}``,
    ``segment.all.{current,peak,allocated,freed}`` and ``num_ooms`` (segments the resource
    refused for lack of memory; PyTorch's own ``num_ooms`` counts what it raised). rmm_fences'
    key: ``rejected_frees`` (segments handed back that the pool core did not hand out, or with
    another size). RuntimeError before the first :func:`mem_pool`.
    """
    s = _require_pool_core().pool_stats()
    return {
        "reserved_bytes.all.current": s["current_bytes"],
        "reserved_bytes.all.peak": s["peak_bytes"],
        "reserved_bytes.all.allocated": s["allocated_bytes"],
        "reserved_bytes.all.freed": s["freed_bytes"],
        "segment.all.current": s["current_allocations"],
        "segment.all.peak": s["peak_allocations"],
        "segment.all.allocated": s["allocations"],
        "segment.all.freed": s["frees"],
        "num_ooms": s["num_ooms"],
        "rejected_frees": s["rejected_frees"],
    }


def reset_mem_pool_peak() -> None:
    """Restart ``reserved_bytes.all.peak`` and ``segment.all.peak`` of :func:`mem_pool_stats`
    from the current values."""
    _require_pool_core().reset_pool_peak()


def _require_pool_core():
    native = _native()
    if not native.is_pool_installed():
        raise RuntimeError(
            "no rmm_fences torch MemPool resource in this process: "
            "rmm_fences.allocators.torch.mem_pool() sets it up"
        )
    return native
