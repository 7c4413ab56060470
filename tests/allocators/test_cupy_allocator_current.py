# SPDX-License-Identifier: Apache-2.0
"""``CupyAllocator()`` follows rmm's current device resource on every call, as
``rmm_cupy_allocator`` does, and frees each block through the resource that allocated it.
CPU: CuPy's device and stream faked, fake upstreams; on a GPU:
tests/allocators/test_cupy_allocator_current_gpu.py."""

import importlib

import pytest
import rmm

from helpers.fake_upstream import FakeUpstream


class _CupyStream:
    """CuPy's legacy default stream, as far as the allocator looks at it."""

    ptr = 0


@pytest.fixture
def cupy_alloc(monkeypatch):
    pytest.importorskip("cupy")
    mod = importlib.import_module("rmm_fences.allocators.cupy")
    monkeypatch.setattr(mod.cupy.cuda.runtime, "getDevice", lambda: 0)
    stream = _CupyStream()
    monkeypatch.setattr(mod.cupy.cuda, "get_current_stream", lambda: stream)
    monkeypatch.setattr(mod, "_STREAMS", {})
    previous = rmm.mr.get_per_device_resource(0)
    yield mod
    rmm.mr.set_per_device_resource(0, previous)


def test_cupy_allocator_follows_the_current_device_resource(cupy_alloc):
    a, b = FakeUpstream(), FakeUpstream()
    alloc = cupy_alloc.CupyAllocator()
    assert repr(alloc) == "CupyAllocator(mr=None)"
    rmm.mr.set_per_device_resource(0, a.mr)
    x = alloc(1000)
    rmm.mr.set_per_device_resource(0, b.mr)  # the next allocation comes from b, as with
    y = alloc(3000)  # rmm_cupy_allocator
    assert [c[:1] + c[2:] for c in a.calls] == [("allocate", 1000)]
    assert [c[:1] + c[2:] for c in b.calls] == [("allocate", 3000)]
    assert (x.device_id, y.device_id) == (0, 0)
    rmm.mr.set_per_device_resource(0, rmm.mr.CudaMemoryResource())
    x_ptr, y_ptr = x.ptr, y.ptr
    del x  # freed by the resource that allocated it, not the current one
    assert a.calls[-1] == ("deallocate", x_ptr, 1000) and len(b.calls) == 1
    del y
    assert b.calls[-1] == ("deallocate", y_ptr, 3000) and len(a.calls) == 2


def test_cupy_allocator_keeps_the_allocating_resource_alive(cupy_alloc):
    a = FakeUpstream()
    rmm.mr.set_per_device_resource(0, a.mr)
    x = cupy_alloc.CupyAllocator()(512)
    rmm.mr.set_per_device_resource(0, rmm.mr.CudaMemoryResource())
    a_mr, a.mr = a.mr, None
    del a_mr  # only the block refers to the resource now
    ptr = x.ptr
    del x
    assert a.calls[-1] == ("deallocate", ptr, 512)


def test_cupy_allocator_with_a_resource_keeps_to_it(cupy_alloc):
    a, b = FakeUpstream(), FakeUpstream()
    rmm.mr.set_per_device_resource(0, b.mr)
    alloc = cupy_alloc.CupyAllocator(a.mr)
    x = alloc(256)
    assert len(a.calls) == 1 and b.calls == []
    del x
    assert [c[0] for c in a.calls] == ["allocate", "deallocate"]


def test_cupy_allocator_arguments(cupy_alloc):
    with pytest.raises(TypeError, match="device is only for a given mr"):
        cupy_alloc.CupyAllocator(device=0)
    with pytest.raises(TypeError, match=r"mr must be None \(rmm's current device resource"):
        cupy_alloc.CupyAllocator("pool(cuda)")
    assert cupy_alloc.CupyAllocator(rmm.mr.CudaMemoryResource(), device=0).device == 0
    zero = cupy_alloc.CupyAllocator()(0)  # no resource is asked for 0 bytes
    assert (zero.ptr, zero.device_id) == (0, 0)
