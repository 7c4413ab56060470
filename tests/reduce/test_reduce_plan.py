# SPDX-License-Identifier: Apache-2.0
"""rmm_fences.reduce.ReducePlan without a GPU: what a call allocates, launches and frees, and
the checks of its arguments. Real CuPy arrays over memory that is never touched (CuPy makes
them without a CUDA call), a real rmm resource whose allocations are Python callbacks, and a
stand-in for cuda.compute that records its calls (the real one needs NVRTC and a GPU)."""

import enum
import sys
import threading

import numpy as np
import pytest
import rmm

from rmm_fences import reduce as rf
from rmm_fences._streams import StreamHandle, stream_handle

from helpers.threads import run_threads

cupy = pytest.importorskip("cupy")

STREAM = 0x5000
TEMP_BYTES = 3000  # what the stand-in reducer asks for


def device_array(n, dtype="float32", *, ptr=0x100000, device=0):
    """A CuPy array of ``n`` items at ``ptr`` on ``device`` (nothing reads or writes it)."""
    dtype = np.dtype(dtype)
    mem = cupy.cuda.UnownedMemory(ptr, max(n, 1) * dtype.itemsize, None, device_id=device)
    return cupy.ndarray((n,), dtype=dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))


class CaiArray:
    """A device array of another library: only ``__cuda_array_interface__``."""

    def __init__(self, n, typestr="<f4", ptr=0x200000, strides=None):
        self.__cuda_array_interface__ = {
            "shape": (n,),
            "typestr": typestr,
            "data": (ptr, False),
            "strides": strides,
            "version": 3,
        }


class OpKind(enum.Enum):
    PLUS = 1
    MAXIMUM = 2
    MINIMUM = 3
    MULTIPLIES = 4


class FakeCompute:
    """cuda.compute's make_reduce_into, recording builds and calls; a call with a temp storage
    checks that no other call is inside the reducer and reads the temp storage's address."""

    OpKind = OpKind

    def __init__(self, log):
        self.log, self.builds, self.fail_launch = log, [], None

    def make_reduce_into(self, *, d_in, d_out, op, h_init):
        self.builds.append((op, h_init.dtype))
        compute, inside = self, []

        def reducer(*, temp_storage, d_in, d_out, num_items, op, h_init, stream):
            assert not inside, "two calls inside one reducer at once"
            inside.append(1)
            try:
                handle = stream_handle(stream)
                if temp_storage is None:
                    compute.log.append(("size", num_items, handle))
                    return TEMP_BYTES
                compute.log.append(
                    (
                        "reduce",
                        temp_storage.data_ptr(),
                        temp_storage.nbytes,
                        d_in,
                        d_out,
                        num_items,
                        op,
                        h_init.copy(),
                        handle,
                    )
                )
                if compute.fail_launch:
                    raise compute.fail_launch
                return None
            finally:
                inside.pop()

        return reducer


class CountingResource:
    """An rmm CallbackMemoryResource logging (kind, pointer, bytes, stream handle)."""

    def __init__(self, log):
        self.log, self.next_ptr, self.live, self.fail = log, 0x7000000, set(), None
        self.lock = threading.Lock()
        self.mr = rmm.mr.CallbackMemoryResource(self.allocate, self.deallocate)

    def allocate(self, nbytes, stream):
        if self.fail:
            raise self.fail
        with self.lock:
            ptr = self.next_ptr
            self.next_ptr += 1 << 16
            self.live.add(ptr)
            self.log.append(("allocate", ptr, nbytes, stream_handle(stream)))
        return ptr

    def deallocate(self, ptr, nbytes, stream):
        with self.lock:
            self.live.remove(ptr)
            self.log.append(("deallocate", ptr, nbytes, stream_handle(stream)))


@pytest.fixture
def log():
    return []


@pytest.fixture
def compute(monkeypatch, log):
    """The stand-in for cuda.compute, with the module's reducer caches emptied for the test
    (a stand-in reducer must never serve a later test)."""
    import cuda

    fake = FakeCompute(log)
    monkeypatch.setitem(sys.modules, "cuda.compute", fake)
    monkeypatch.setattr(cuda, "compute", fake, raising=False)
    monkeypatch.setattr(rf, "_REDUCERS", {})
    monkeypatch.setattr(rf, "_NAMED_OPS", {})
    return fake


@pytest.fixture
def resource(log):
    return CountingResource(log)


def make_plan(resource, n=1024, dtype="float32", op="sum", h_init=0.0, **kwargs):
    x, out = device_array(n, dtype), device_array(1, dtype, ptr=0x900000)
    kwargs.setdefault("mr", resource.mr)
    kwargs.setdefault("stream", StreamHandle(STREAM))
    return rf.ReducePlan(x, out, op, h_init, **kwargs), x, out


def test_a_call_allocates_reduces_and_frees_on_the_plan_stream(compute, resource, log):
    plan, _, out = make_plan(resource, n=1024, op="max", h_init=-5.0)
    # made: the reducer built, CUB's size asked once, nothing allocated
    assert compute.builds == [(OpKind.MAXIMUM, np.dtype("float32"))]
    assert log == [("size", 1024, STREAM)]
    assert (plan.num_items, plan.dtype, plan.out_dtype) == (1024, np.float32, np.float32)
    assert (plan.nbytes, plan.stream, plan.device, plan.mr) == (TEMP_BYTES, STREAM, 0, resource.mr)
    assert plan.op == "max" and plan.h_init.tolist() == [-5.0] and "ReducePlan(" in repr(plan)
    log.clear()
    inputs = [device_array(1024, ptr=0x100000 * (i + 2)) for i in range(3)]
    for x in inputs:
        assert plan(x, out) is None
    assert len(log) == 9
    for i, x in enumerate(inputs):
        alloc, launch, free = log[3 * i : 3 * i + 3]
        assert alloc == ("allocate", alloc[1], TEMP_BYTES, STREAM)
        assert launch[:3] == ("reduce", alloc[1], TEMP_BYTES)
        assert launch[3] is x and launch[4] is out and launch[5:7] == (1024, OpKind.MAXIMUM)
        assert launch[7].tolist() == [-5.0] and launch[8] == STREAM
        assert free == ("deallocate", alloc[1], TEMP_BYTES, STREAM)
    assert resource.live == set()


def test_any_c_contiguous_shape_of_the_length_is_accepted(compute, resource, log):
    plan, _, out = make_plan(resource, n=24)
    log.clear()
    plan(device_array(24).reshape(4, 6), out)
    plan(device_array(24), device_array(8, ptr=0x900000))  # d_out: its first element
    assert [e[0] for e in log] == ["allocate", "reduce", "deallocate"] * 2


def test_plans_share_the_reducer_and_the_size(compute, resource, log):
    make_plan(resource, n=4096)
    make_plan(resource, n=4096, h_init=1.5)
    make_plan(resource, n=10)
    assert len(compute.builds) == 1
    assert log == [("size", 4096, STREAM), ("size", 10, STREAM)]


def test_a_python_scalar_init_takes_the_output_dtype_and_is_copied(compute, resource, log):
    plan, x, out = make_plan(resource, dtype="int32", h_init=7)
    assert plan.h_init.dtype == np.int32
    init = np.array([3], dtype=np.int64)
    plan = rf.ReducePlan(x, device_array(1, "int64"), "sum", init, mr=resource.mr)
    init[0] = 99  # the plan keeps its own copy
    log.clear()
    plan(x, device_array(1, "int64"))
    assert log[1][7].tolist() == [3] and log[1][7].dtype == np.int64


def arrays_that_do_not_match():
    out = device_array(1, ptr=0x900000)
    x = device_array(1024)
    return [
        (device_array(1024, "float64"), out, TypeError, "d_in has dtype float64 but the plan"),
        (
            device_array(1000),
            out,
            ValueError,
            "d_in holds 1000 items but the plan was made for 1024",
        ),
        (device_array(2048)[::2], out, ValueError, "d_in must be C-contiguous"),
        (
            device_array(1024, device=1),
            out,
            ValueError,
            "d_in is on device 1 but the plan was made on device 0",
        ),
        (np.zeros(1024, np.float32), out, TypeError, r"d_in must be a device array .*host memory"),
        (x, device_array(1, "float64"), TypeError, "d_out has dtype float64 but the plan"),
        (x, device_array(0), ValueError, "d_out must hold at least one element"),
        (x, device_array(4)[::2], ValueError, "d_out must be C-contiguous"),
        (
            x,
            device_array(1, device=2),
            ValueError,
            "d_out is on device 2 but the plan was made on device 0",
        ),
        (x, None, TypeError, "d_out must be a device array"),
        (CaiArray(1024, "<f8"), out, TypeError, "d_in has dtype float64 but the plan"),
        (CaiArray(1024, "<c8"), out, TypeError, "d_in has dtype complex64; supported"),
        (CaiArray(1024, strides=(8,)), out, ValueError, "d_in must be C-contiguous"),
        (x, CaiArray(1, "<i4"), TypeError, "d_out has dtype int32 but the plan"),
    ]


@pytest.mark.parametrize("d_in, d_out, error, message", arrays_that_do_not_match())
def test_arrays_that_do_not_match_are_refused_before_any_allocation(
    compute, resource, log, d_in, d_out, error, message
):
    plan, _, _ = make_plan(resource, n=1024)
    log.clear()
    with pytest.raises(error, match=message):
        plan(d_in, d_out)
    assert log == []
    plan(device_array(1024), device_array(1))  # the plan still works
    assert [e[0] for e in log] == ["allocate", "reduce", "deallocate"]


def test_arrays_of_other_libraries_are_checked_then_reduced(compute, resource, log, monkeypatch):
    devices = {0x200000: 0, 0x300000: 0, 0x400000: 3}

    class Attributes:
        def __init__(self, ptr):
            self.device = devices[ptr]

    monkeypatch.setattr(cupy.cuda.runtime, "pointerGetAttributes", Attributes)
    plan, _, _ = make_plan(resource, n=1024)
    log.clear()
    x, out = CaiArray(1024), CaiArray(1, ptr=0x300000)
    plan(x, out)
    assert [e[0] for e in log] == ["allocate", "reduce", "deallocate"] and log[1][3] is x
    log.clear()
    with pytest.raises(ValueError, match="d_in is on device 3 but the plan was made on device 0"):
        plan(CaiArray(1024, ptr=0x400000), out)
    assert log == []


def test_bad_plan_arguments_name_themselves_and_allocate_nothing(compute, resource, log):
    x, out = device_array(16), device_array(1, ptr=0x900000)
    cases = [
        (dict(op="median"), ValueError, "op 'median' is not known"),
        (dict(op=3), TypeError, "op must be a name"),
        (dict(mr="pool"), TypeError, "mr must be None or an rmm.mr.DeviceMemoryResource"),
        (dict(stream=5), TypeError, "stream must be None"),
        (dict(h_init=[1.0, 2.0]), ValueError, r"h_init must be a single value, got 2"),
        (dict(h_init="zero"), TypeError, "h_init must be an integer or a float, got 'zero'"),
        (
            dict(h_init=np.array(["a"])),
            TypeError,
            "h_init must be an integer or a float, got dtype",
        ),
        (dict(h_init=1e300, d_out=device_array(1, "int8")), OverflowError, "h_init 1e"),
        (dict(d_out=device_array(0)), ValueError, "d_out must hold at least one element"),
        (
            dict(d_out=device_array(1, device=1)),
            ValueError,
            "d_in is on device 0 but d_out on device 1",
        ),
        (dict(d_in=np.zeros(16)), TypeError, "d_in must be a device array"),
        (dict(d_in=device_array(16, "float16")), TypeError, "d_in has dtype float16; supported"),
    ]
    for change, error, message in cases:
        args = dict(d_in=x, d_out=out, op="sum", h_init=0.0, mr=resource.mr, stream=None)
        args.update(change)
        with pytest.raises(error, match=message):
            rf.ReducePlan(**args)
    assert log == [] and resource.live == set()


def test_a_failed_launch_frees_the_temp_storage(compute, resource, log):
    plan, x, out = make_plan(resource)
    compute.fail_launch = RuntimeError("launch failed")
    log.clear()
    with pytest.raises(RuntimeError, match="launch failed"):
        plan(x, out)
    assert [e[0] for e in log] == ["allocate", "reduce", "deallocate"]
    assert log[0][1] == log[2][1] and resource.live == set()
    compute.fail_launch = None
    plan(x, out)  # the reducer's lock was released
    assert resource.live == set()


def test_a_failed_allocation_launches_nothing(compute, resource, log):
    plan, x, out = make_plan(resource)
    resource.fail = MemoryError("out of memory")
    log.clear()
    with pytest.raises(MemoryError):
        plan(x, out)
    assert log == []
    resource.fail = None
    plan(x, out)
    assert [e[0] for e in log] == ["allocate", "reduce", "deallocate"]


def test_threads_sharing_a_plan_launch_one_at_a_time(compute, resource, log):
    plan, _, out = make_plan(resource, n=256)
    calls, threads = 300, 4

    def work(i):
        x = device_array(256, ptr=0x1000000 * (i + 1))
        for _ in range(calls):
            plan(x, out)

    errors = run_threads(threads, work)
    assert errors == []
    launches = [e for e in log if e[0] == "reduce"]
    assert len(launches) == calls * threads
    # each launch read the temp storage of a block allocated and not yet freed before it
    live = set()
    for entry in log[1:]:
        if entry[0] == "allocate":
            live.add(entry[1])
        elif entry[0] == "deallocate":
            live.remove(entry[1])
        else:
            assert entry[1] in live and entry[2] == TEMP_BYTES
    assert live == set() and resource.live == set()


def test_device_reduce_refuses_an_init_of_several_values(compute, resource):
    x, out = device_array(16), device_array(1, ptr=0x900000)
    with pytest.raises(ValueError, match=r"h_init must be a single value, got 3 \(shape \(3,\)\)"):
        rf.device_reduce(x, out, "sum", [1.0, 2.0, 3.0], mr=resource.mr)


def test_device_functions_take_cupy_arrays_through_the_fast_checks(compute, resource, log):
    out = device_array(1, ptr=0x900000)
    with pytest.raises(ValueError, match=r"d_in must be C-contiguous \(strides \(8,\)\)"):
        rf.device_sum(device_array(32)[::2], out, mr=resource.mr)
    with pytest.raises(ValueError, match="d_in is on device 1 but d_out on device 0"):
        rf.device_sum(device_array(32, device=1), out, mr=resource.mr)
    assert log == []
    rf.device_reduce(device_array(32).reshape(4, 8), out, "min", 1.0, mr=resource.mr, stream=None)
    assert [e[0] for e in log] == ["size", "allocate", "reduce", "deallocate"]
    assert log[2][5:7] == (32, OpKind.MINIMUM) and resource.live == set()


def test_the_reduce_loop_through_a_plan_needs_a_resource():
    from rmm_fences._cli.reduce import cub_temp_loop

    x, out = device_array(16), device_array(1, ptr=0x900000)
    with pytest.raises(ValueError, match="plan=True needs mr"):
        cub_temp_loop(x, out, None, StreamHandle(STREAM), plan=True)
