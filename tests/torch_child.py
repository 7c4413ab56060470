# SPDX-License-Identifier: Apache-2.0
"""A fake ``torch`` package for the CPU tests of rmm_fences.allocators.torch, and the
scenarios that install the allocator, each in its own process (installing is once per process,
for good, in rmm_fences as in PyTorch).

    python tests/torch_child.py install-resource   install(CudaMemoryResource(), device=0)
    python tests/torch_child.py install-none       install() (rmm's resource of each device)
    python tests/torch_child.py install-pool       install(SyncOnFree(pool(cuda)), device=0)
    python tests/torch_child.py no-torch-import    import rmm_fences and the module only

The last line printed is a JSON object of what the scenario saw. No GPU is needed: the fake
``CUDAPluggableAllocator`` does what PyTorch 2.11's does (``ctypes.CDLL`` of the path, the
addresses of the two symbols) and records the calls; nothing allocates.
"""

from __future__ import annotations

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


def fake_torch(*, initialized=False):
    """{name: module} of a fake ``torch``, ``torch.cuda`` and ``torch.cuda.memory``;
    ``torch.calls`` lists ``change_current_allocator``'s arguments."""
    torch = types.ModuleType("torch")
    cuda = types.ModuleType("torch.cuda")
    memory = types.ModuleType("torch.cuda.memory")
    torch.cuda, cuda.memory = cuda, memory
    torch.calls = []
    cuda.is_initialized = lambda: initialized

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
        "entry_points_match": _torch.entry_points()
        == {
            "alloc": address[_torch.ALLOC_FN],
            "free": address[_torch.FREE_FN],
            "record_stream": address[_torch.RECORD_STREAM_FN],
        },
        "second_install": second,
        "resource": type(allocator.resource).__name__,
        "device": allocator.device,
        "stats": stats,
        "module_stats_same": rt.memory_stats() == allocator.memory_stats(),
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
