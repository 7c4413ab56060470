# SPDX-License-Identifier: Apache-2.0
"""A fake ``torch`` package for the CPU tests of rmm_fences.allocators.torch, and the
scenarios that install the allocator, each in its own process (installing is once per process,
for good, in rmm_fences as in PyTorch).

    python tests/helpers/torch_child.py SCENARIO [ARGS]

    install-resource            install(CudaMemoryResource(), device=0)
    install-none                install() (rmm's resource of each device)
    install-pool                install(SyncOnFree(pool(cuda)), device=0)
    no-torch-import             import rmm_fences and the module only
    mem-pool-resource VERSION   mem_pool(CudaMemoryResource(), device=0)
                                and what may follow it, under torch VERSION
    mem-pool-none               mem_pool() (rmm's resource of each device)
    mem-pool-spec               mem_pool("cuda", device=0), then other specs
    install-then-mem-pool       install(), then mem_pool()

The last line printed is a JSON object of what the scenario saw. No GPU is needed: the fake
``CUDAPluggableAllocator`` does what PyTorch 2.11's does (``ctypes.CDLL`` of the path, the
addresses of the two symbols) and records the calls; its ``MemPool`` records the allocator
object it was given and the device current at its construction; nothing allocates.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import sys
import types


class FakeRawAllocator:
    """``torch._C._CUDAPluggableAllocator``: the setters record the addresses."""

    def __init__(self, alloc_fn, free_fn):
        self.alloc_fn, self.free_fn = alloc_fn, free_fn
        self.record_stream_fn = None

    def set_record_stream_fn(self, address):
        if not isinstance(address, int):
            raise TypeError("set_record_stream_fn takes an int address")
        self.record_stream_fn = address


def fake_torch(*, initialized=False, version="2.11.0+cu130"):
    """{name: module} of a fake ``torch``, ``torch.cuda`` and ``torch.cuda.memory``;
    ``torch.calls`` lists ``change_current_allocator``'s arguments, ``torch.pools`` the
    ``MemPool`` objects made."""
    torch = types.ModuleType("torch")
    cuda = types.ModuleType("torch.cuda")
    memory = types.ModuleType("torch.cuda.memory")
    torch.cuda, cuda.memory = cuda, memory
    torch.__version__ = version
    torch.calls = []
    torch.pools = []
    cuda.is_initialized = lambda: initialized
    current = {"device": None}  # None: no torch.cuda.device context

    @contextlib.contextmanager
    def device(index):
        before, current["device"] = current["device"], index
        try:
            yield
        finally:
            current["device"] = before

    class MemPool:
        def __init__(self, allocator=None, use_on_oom=False, no_split=False):
            if torch.calls:
                raise RuntimeError("MemPool needs PyTorch's native allocator")
            self.allocator, self.device = allocator, current["device"]
            self.id = (len(torch.pools) + 1, 0)
            torch.pools.append(self)

    cuda.device = device
    cuda.MemPool = memory.MemPool = MemPool

    class CUDAPluggableAllocator:
        def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name):
            lib = ctypes.CDLL(path_to_so_file)
            alloc_fn = ctypes.cast(getattr(lib, alloc_fn_name), ctypes.c_void_p).value
            free_fn = ctypes.cast(getattr(lib, free_fn_name), ctypes.c_void_p).value
            self.args = (path_to_so_file, alloc_fn_name, free_fn_name)
            self._allocator = FakeRawAllocator(alloc_fn, free_fn)

    def change_current_allocator(allocator):
        if torch.calls:
            raise RuntimeError("Can't swap an already initialized allocator")
        torch.calls.append(allocator)

    memory.CUDAPluggableAllocator = CUDAPluggableAllocator
    memory.change_current_allocator = change_current_allocator
    return {"torch": torch, "torch.cuda": cuda, "torch.cuda.memory": memory}


def _install(make_mr, **kwargs) -> dict:
    modules = fake_torch()
    sys.modules.update(modules)
    torch = modules["torch"]
    import rmm

    import rmm_fences.allocators.torch as rt
    from rmm_fences._lib import _torch

    before = {"installed": rt.installed() is not None, "core": _torch.is_installed()}
    allocator = rt.install(make_mr(rmm), **kwargs)
    lib = ctypes.CDLL(_torch.__file__)
    address = {
        name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
        for name in (_torch.ALLOC_FN, _torch.FREE_FN, _torch.RECORD_STREAM_FN)
    }
    raw = allocator.pluggable._allocator
    try:
        rt.install(make_mr(rmm), **kwargs)
        second = None
    except RuntimeError as e:
        second = str(e)
    stats = rt.memory_stats()
    rt.reset_peak_memory_stats()
    return {
        "before": before,
        "after": {"installed": rt.installed() is allocator, "core": _torch.is_installed()},
        "change_calls": len(torch.calls),
        "changed_to_pluggable": torch.calls[0] is allocator.pluggable,
        "pluggable_args": list(allocator.pluggable.args),
        "module_file": _torch.__file__,
        "alloc_ok": raw.alloc_fn == address[_torch.ALLOC_FN],
        "free_ok": raw.free_fn == address[_torch.FREE_FN],
        "record_stream_ok": raw.record_stream_fn == address[_torch.RECORD_STREAM_FN],
        "record_stream_fn": raw.record_stream_fn,
        "entry_points_match": _torch.entry_points() == _addresses(_torch),
        "second_install": second,
        "resource": type(allocator.resource).__name__,
        "device": allocator.device,
        "stats": stats,
        "module_stats_same": rt.memory_stats() == allocator.memory_stats(),
    }


def _addresses(_torch) -> dict:
    """``_torch.entry_points()`` as ``ctypes.CDLL`` of the module finds them."""
    lib = ctypes.CDLL(_torch.__file__)
    names = {
        "alloc": _torch.ALLOC_FN,
        "free": _torch.FREE_FN,
        "record_stream": _torch.RECORD_STREAM_FN,
        "pool_alloc": _torch.POOL_ALLOC_FN,
        "pool_free": _torch.POOL_FREE_FN,
    }
    return {k: ctypes.cast(getattr(lib, v), ctypes.c_void_p).value for k, v in names.items()}


def _error(call) -> str | None:
    """The message of the RuntimeError ``call()`` raises, or None."""
    try:
        call()
    except RuntimeError as e:
        return str(e)
    return None


def _mem_pool(make_mr, version="2.11.0+cu130", **kwargs) -> dict:
    """``mem_pool(make_mr(rmm), **kwargs)``, then the calls that may follow it."""
    modules = fake_torch(version=version)
    sys.modules.update(modules)
    torch = modules["torch"]
    import rmm

    import rmm_fences.allocators.torch as rt
    from rmm_fences._lib import _torch

    before = _torch.is_pool_installed()
    stats_before = _error(rt.mem_pool_stats)
    mr = make_mr(rmm)
    pool = rt.mem_pool(mr, **kwargs)
    route = rt._POOL_ROUTE
    address = _addresses(_torch)
    raw = pool.allocator
    again = rt.mem_pool()  # a new MemPool over the same core
    stats = rt.mem_pool_stats()
    rt.reset_mem_pool_peak()
    return {
        "before": before,
        "stats_before": stats_before,
        "after": _torch.is_pool_installed(),
        "pools": len(torch.pools),
        "change_calls": len(torch.calls),
        "pool_is_mem_pool": isinstance(pool, torch.cuda.MemPool),
        "allocator_is_pluggables": raw is route.pluggable._allocator,
        "again_same_allocator": again.allocator is raw and again is not pool,
        "pluggable_args": list(route.pluggable.args),
        "module_file": _torch.__file__,
        "alloc_ok": raw.alloc_fn == address["pool_alloc"],
        "free_ok": raw.free_fn == address["pool_free"],
        "record_stream_fn": raw.record_stream_fn,
        "entry_points_match": _torch.entry_points() == address,
        "route": [type(route.resource).__name__, route.device],
        "same_object": _error(lambda: rt.mem_pool(mr, **kwargs)),
        "other_resource": _error(lambda: rt.mem_pool(rmm.mr.CudaMemoryResource(), device=0)),
        "other_spec": _error(lambda: rt.mem_pool("pool(cuda)", device=0)),
        "other_device": _error(lambda: rt.mem_pool(device=1)),
        "install": _error(rt.install),
        "install_core": _error(lambda: _torch.install_pool_core(None, -1)),
        "core_installed": _torch.is_installed(),
        "stats": stats,
        "pools_at_end": len(torch.pools),
        "devices": [p.device for p in torch.pools],
    }


def main(argv) -> int:
    scenario = argv[1]
    if scenario == "install-resource":
        out = _install(lambda rmm: rmm.mr.CudaMemoryResource(), device=0)
    elif scenario == "install-none":
        out = _install(lambda rmm: None)
    elif scenario == "install-pool":
        import rmm_fences

        out = _install(
            lambda rmm: rmm_fences.SyncOnFreeResourceAdaptor(
                rmm_fences.StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource())
            ),
            device=0,
        )
    elif scenario == "mem-pool-resource":
        out = _mem_pool(lambda rmm: rmm.mr.CudaMemoryResource(), version=argv[2], device=0)
    elif scenario == "mem-pool-none":
        out = _mem_pool(lambda rmm: None)
    elif scenario == "mem-pool-spec":
        import rmm_fences._cuda

        # no GPU here: build the spec without making device 0 current
        rmm_fences._cuda.on_device = lambda device: contextlib.nullcontext()
        out = _mem_pool(lambda rmm: "cuda", device=0)
    elif scenario == "install-then-mem-pool":
        modules = fake_torch()
        sys.modules.update(modules)
        import rmm_fences.allocators.torch as rt
        from rmm_fences._lib import _torch

        rt.install()
        out = {
            "mem_pool": _error(rt.mem_pool),
            "pools": len(modules["torch"].pools),
            "pool_core": _torch.is_pool_installed(),
        }
    elif scenario == "no-torch-import":
        import rmm_fences
        import rmm_fences.allocators
        import rmm_fences.allocators.torch  # noqa: F401

        out = {"torch_imported": "torch" in sys.modules}
    else:
        print(f"unknown scenario {scenario!r}", file=sys.stderr)
        return 2
    out["scenario"] = scenario
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
