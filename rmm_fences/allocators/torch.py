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
Importing this module does not import torch; :func:`install` does.
"""

from __future__ import annotations

import importlib

__all__ = [
    "TorchAllocator",
    "install",
    "installed",
    "memory_stats",
    "reset_peak_memory_stats",
]

_INSTALLED: TorchAllocator | None = None


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


def _resolve_resource(mr, device):
    """(resource, device) for :func:`install`; TypeError on anything else."""
    import rmm

    from rmm_fences.compose import Spec, compose

    if mr is None:
        if device is not None:
            raise TypeError(
                "device is only for a given mr; with mr=None every device uses rmm's current "
                f"resource of that device (got device={device!r})"
            )
        return None, None
    if not isinstance(mr, (str, Spec, rmm.mr.DeviceMemoryResource)):
        raise TypeError(
            "mr must be None (rmm's current resource of each device), a compose spec string "
            f"or an rmm.mr.DeviceMemoryResource, got {type(mr).__name__}"
        )
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
        PyTorch's CUDA is already initialized, or an allocator is already installed.
    TypeError
        ``mr`` is none of the above (or ``device`` is given with ``mr=None``).
    """
    global _INSTALLED
    try:
        import torch
        import torch.cuda.memory
    except ImportError as e:
        raise ImportError(
            f"rmm_fences.allocators.torch.install() needs PyTorch (import torch failed: {e})"
        ) from e
    if _INSTALLED is not None or _native().is_installed():
        raise RuntimeError(
            f"rmm_fences.allocators.torch.install() already ran in this process ({_INSTALLED!r});"
            " PyTorch's allocator can be swapped only once"
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
