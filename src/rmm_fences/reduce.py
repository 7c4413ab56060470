# SPDX-License-Identifier: Apache-2.0
"""CUB's device-wide reduce through ``cuda.compute``, with its temp storage from any RMM
resource: the CUB temp-storage loop (query the size, allocate, launch, free without a sync).

>>> import cupy
>>> from rmm_fences.reduce import device_sum
>>> x = cupy.arange(10, dtype=cupy.float32)
>>> float(device_sum(x))  # doctest: +SKIP
45.0

A loop of reduces of the same dtype, length, op, resource and stream is cheapest through a
:class:`ReducePlan`, made once and called per array.

Imports without a GPU; ``cuda.compute`` is imported on first use.
"""

from __future__ import annotations

import contextlib
import math
import threading

import numpy as np

from rmm_fences._optional import require
from rmm_fences._streams import StreamHandle, rmm_stream, stream_handle

__all__ = [
    "device_reduce",
    "device_sum",
    "ReducePlan",
    "temp_storage",
    "TempStorage",
    "SUPPORTED_DTYPES",
]

SUPPORTED_DTYPES = tuple(
    np.dtype(t)
    for t in (
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float32",
        "float64",
    )
)
_OP_NAMES = {
    "sum": "PLUS",
    "plus": "PLUS",
    "max": "MAXIMUM",
    "maximum": "MAXIMUM",
    "min": "MINIMUM",
    "minimum": "MINIMUM",
    "prod": "MULTIPLIES",
    "multiplies": "MULTIPLIES",
}


class TempStorage:
    """``nbytes`` of device memory at ``ptr``, as a byte array (``__cuda_array_interface__``),
    usable as ``temp_storage=`` of any ``cuda.compute`` algorithm."""

    __slots__ = ("ptr", "nbytes", "__weakref__")

    def __init__(self, ptr: int, nbytes: int):
        self.ptr = ptr
        self.nbytes = nbytes

    def data_ptr(self) -> int:
        """The address (the accessor cuda.compute tries first)."""
        return self.ptr

    @property
    def __cuda_array_interface__(self):
        return {
            "shape": (self.nbytes,),
            "typestr": "|u1",
            "data": (self.ptr, False),
            "strides": None,
            "version": 3,
        }

    def __repr__(self):
        return f"TempStorage(ptr={self.ptr:#x}, nbytes={self.nbytes})"


def _resource(mr):
    import rmm

    if mr is None:
        return rmm.mr.get_current_device_resource()
    if not isinstance(mr, rmm.mr.DeviceMemoryResource):
        raise TypeError(
            f"mr must be None or an rmm.mr.DeviceMemoryResource, got {type(mr).__name__}"
        )
    return mr


@contextlib.contextmanager
def temp_storage(nbytes, *, mr=None, stream=None):
    """Allocate ``nbytes`` from ``mr`` (default: the current device resource) on ``stream``,
    yield a :class:`TempStorage`, and free it on the same stream on exit, without a sync.

    Work queued on ``stream`` inside the block may still use the memory after the exit; the
    resource must order its reuse (every rmm_fences resource and rmm's stream-ordered ones do).
    """
    if not isinstance(nbytes, (int, np.integer)) or isinstance(nbytes, bool) or nbytes < 0:
        raise ValueError(f"nbytes must be a non-negative int, got {nbytes!r}")
    resource = _resource(mr)
    rs = rmm_stream(stream_handle(stream))
    size = max(int(nbytes), 1)
    ptr = resource.allocate(size, rs)
    try:
        yield TempStorage(ptr, int(nbytes))
    finally:
        resource.deallocate(ptr, size, rs)


_SUPPORTED = frozenset(SUPPORTED_DTYPES)
# [cupy.ndarray, whether its arrays have CuPy's _c_contiguous flag] once CuPy was imported
_CUPY: list = []


def _cupy_ndarray():
    """cupy.ndarray (the fast path's type), or None without CuPy."""
    if not _CUPY:
        try:
            import cupy

            ndarray = cupy.ndarray
        except ImportError:  # pragma: no cover - the reduce extra brings CuPy
            ndarray = None
        # the flag a.flags.c_contiguous reads, without building a Flags object per call (CuPy
        # reads it the same way across its modules); a CuPy without it takes flags
        _CUPY[:] = [ndarray, ndarray is not None and hasattr(ndarray, "_c_contiguous")]
    return _CUPY[0]


def _unsupported(name, dtype):
    return TypeError(
        f"{name} has dtype {dtype}; supported: " + ", ".join(str(d) for d in SUPPORTED_DTYPES)
    )


def _array_info(a, name):
    """(pointer, size, dtype, device id or None) of a device array; TypeError or ValueError
    naming ``name``. CuPy arrays take a fast path through their attributes."""
    if type(a) is _cupy_ndarray():
        dtype = a.dtype
        if dtype not in _SUPPORTED:
            raise _unsupported(name, dtype)
        if not (a._c_contiguous if _CUPY[1] else a.flags.c_contiguous):
            raise ValueError(f"{name} must be C-contiguous (strides {a.strides})")
        memptr = a.data
        return memptr.ptr, a.size, dtype, memptr.device_id
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is None:
        kind = "host memory" if isinstance(a, np.ndarray) or hasattr(a, "__array__") else ""
        raise TypeError(
            f"{name} must be a device array with __cuda_array_interface__ (CuPy, PyTorch, "
            f"Numba); got {type(a).__name__}{' (' + kind + ')' if kind else ''}"
        )
    dtype = np.dtype(cai["typestr"])
    if dtype not in _SUPPORTED:
        raise _unsupported(name, dtype)
    shape = tuple(cai["shape"])
    size = math.prod(shape)
    strides = cai.get("strides")
    if strides is not None and size > 1:
        expected, step = [], dtype.itemsize
        for extent in reversed(shape):
            expected.append(step)
            step *= extent
        if tuple(reversed(expected)) != tuple(strides):
            raise ValueError(f"{name} must be C-contiguous (strides {strides})")
    ptr = cai["data"][0]
    return ptr, size, dtype, None


def _device_of(ptr, device):
    """``device``, or where ``ptr`` lives when it is None (None for a null pointer)."""
    if device is not None or not ptr:
        return device
    cupy = require("cupy", "rmm_fences.reduce")

    return cupy.cuda.runtime.pointerGetAttributes(ptr).device


def _check_devices(in_ptr, in_dev, out_ptr, out_dev):
    """ValueError when the input and the output live on different devices."""
    if not in_ptr or not out_ptr:
        return
    in_dev, out_dev = _device_of(in_ptr, in_dev), _device_of(out_ptr, out_dev)
    if in_dev != out_dev:
        raise ValueError(f"d_in is on device {in_dev} but d_out on device {out_dev}")


_REDUCERS: dict = {}
_LOCK = threading.Lock()
_NAMED_OPS: dict = {}


def _op_and_key(op):
    if isinstance(op, str):
        found = _NAMED_OPS.get(op)
        if found is not None:
            return found
    cc = require("cuda.compute", "rmm_fences.reduce")

    if isinstance(op, str):
        try:
            name = _OP_NAMES[op.lower()]
            found = _NAMED_OPS[op] = (getattr(cc.OpKind, name), ("kind", name))
            return found
        except KeyError:
            raise ValueError(
                f"op {op!r} is not known; use one of {sorted(set(_OP_NAMES))}, a "
                "cuda.compute.OpKind or a callable"
            ) from None
    if isinstance(op, cc.OpKind):
        return op, ("kind", op.name)
    if callable(op):
        return op, ("callable", op)
    raise TypeError(
        f"op must be a name, a cuda.compute.OpKind or a callable, got {type(op).__name__}"
    )


class _Reducer:
    """A cuda.compute reducer, the lock that serializes its calls (a call sets the reducer's
    iterator state before it launches, so two threads must not interleave) and the temp sizes
    it reported, per (device, num_items): CUB's size query depends on nothing else."""

    __slots__ = ("fn", "lock", "sizes")

    def __init__(self, fn):
        self.fn = fn
        self.lock = threading.Lock()
        self.sizes = {}


def _reducer(d_in, d_out, op, h_init, in_dtype, out_dtype):
    """The reducer for these dtypes and op, built once (JIT compilation) and cached."""
    op_obj, op_key = _op_and_key(op)
    key = (in_dtype, out_dtype, op_key, h_init.dtype)
    reducer = _REDUCERS.get(key)
    if reducer is None:
        cc = require("cuda.compute", "rmm_fences.reduce")

        with _LOCK:
            reducer = _REDUCERS.get(key)
            if reducer is None:
                reducer = _Reducer(
                    cc.make_reduce_into(d_in=d_in, d_out=d_out, op=op_obj, h_init=h_init)
                )
                _REDUCERS[key] = reducer
    return reducer, op_obj


def device_reduce(d_in, d_out, op, h_init, *, mr=None, stream=None) -> None:
    """``d_out[0] = reduce(op, d_in, h_init)`` on ``stream``, CUB's two-phase way.

    Query the temp size (once per dtype, op, device and length: the answer is cached),
    ``mr.allocate(nbytes, stream)``, launch, ``mr.deallocate(ptr, nbytes, stream)`` right
    after the launch, with no synchronization: the CUB temp-storage loop. The
    resource must order the reuse of the freed block after the launch (rmm_fences' pool,
    ``SyncOnFreeResourceAdaptor``, rmm's pool and CudaAsync do; an unsafe cache does not).

    Parameters
    ----------
    d_in, d_out : device arrays
        C-contiguous; ``d_out`` holds at least one element. Supported dtypes:
        :data:`SUPPORTED_DTYPES`.
    op : str, cuda.compute.OpKind or callable
        ``"sum"``, ``"max"``, ``"min"``, ``"prod"``, an ``OpKind`` or a binary function.
    h_init : scalar or numpy value
        The initial value; its dtype is the accumulator's (default: ``d_out``'s dtype when a
        Python scalar is given).
    mr : DeviceMemoryResource, optional
        Where the temp storage comes from (default: the current device resource).
    stream : optional
        None (legacy default stream), a CuPy, rmm, cuda.core or ``__cuda_stream__`` stream.
    """
    reducer, op_obj, init, n, handle, resource, in_dev, _ = _reduce_args(
        d_in, d_out, op, h_init, mr, stream
    )
    _launch(reducer, d_in, d_out, n, op_obj, init, handle, resource, in_dev)


def _reduce_args(d_in, d_out, op, h_init, mr, stream):
    """:func:`device_reduce`'s arguments checked (TypeError or ValueError naming the
    argument, before any allocation) and converted: reducer, op for cuda.compute, h_init as
    an array, number of items, stream handle, resource, ``d_in``'s device (None: not known
    without a query), then (input dtype, output dtype, input pointer, output pointer,
    output device)."""
    in_ptr, n, in_dtype, in_dev = _array_info(d_in, "d_in")
    out_ptr, out_size, out_dtype, out_dev = _array_info(d_out, "d_out")
    if out_size < 1:
        raise ValueError("d_out must hold at least one element, got an empty array")
    handle = stream_handle(stream)
    resource = _resource(mr)
    _check_devices(in_ptr, in_dev, out_ptr, out_dev)
    init = _init_array(h_init, out_dtype)
    reducer, op_obj = _reducer(d_in, d_out, op, init, in_dtype, out_dtype)
    more = (in_dtype, out_dtype, in_ptr, out_ptr, out_dev)
    return reducer, op_obj, init, n, handle, resource, in_dev, more


def _init_array(h_init, out_dtype):
    """``h_init`` as the one-element NumPy array cuda.compute takes (a Python scalar takes
    ``out_dtype``); ValueError or TypeError naming ``h_init``."""
    python_scalar = np.isscalar(h_init) and not isinstance(h_init, np.generic)
    try:
        init = np.asarray(h_init, dtype=out_dtype if python_scalar else None)
    except OverflowError as exc:
        raise OverflowError(f"h_init {h_init!r} does not fit d_out's dtype: {exc}") from exc
    except (TypeError, ValueError) as exc:
        raise TypeError(f"h_init must be an integer or a float, got {h_init!r}") from exc
    if init.size != 1:
        raise ValueError(f"h_init must be a single value, got {init.size} (shape {init.shape})")
    if init.dtype.kind not in "iuf":
        raise TypeError(f"h_init must be an integer or a float, got dtype {init.dtype}")
    return init.reshape(1)


def _temp_bytes(reducer, d_in, d_out, n, op, init, cc_stream, device):
    """CUB's temp storage bytes for ``n`` items on ``device`` (at least 1): asked of the
    reducer once per device and length."""
    size = reducer.sizes.get((device, n))
    if size is None:
        size = max(int(_call(reducer, None, d_in, d_out, n, op, init, cc_stream)), 1)
        if len(reducer.sizes) >= 4096:
            reducer.sizes.clear()
        reducer.sizes[(device, n)] = size
    return size


def _current_device():
    cupy = require("cupy", "rmm_fences.reduce")

    return cupy.cuda.runtime.getDevice()


def _launch(reducer, d_in, d_out, n, op, init, handle, resource, device):
    cc_stream = StreamHandle(handle) if handle else None
    if device is None:
        device = _current_device()
    size = _temp_bytes(reducer, d_in, d_out, n, op, init, cc_stream, device)
    rs = rmm_stream(handle)
    ptr = resource.allocate(size, rs)
    try:
        _call(reducer, TempStorage(ptr, size), d_in, d_out, n, op, init, cc_stream)
    finally:
        resource.deallocate(ptr, size, rs)  # no sync: the resource orders the reuse


def _call(reducer, temp_storage, d_in, d_out, n, op, init, cc_stream):
    """The reducer on ``temp_storage``; with None, the temp storage bytes it needs."""
    with reducer.lock:
        return reducer.fn(
            temp_storage=temp_storage,
            d_in=d_in,
            d_out=d_out,
            num_items=n,
            op=op,
            h_init=init,
            stream=cc_stream,
        )


class _NoFastPath:
    """The fast path's array type when CuPy has no ``_c_contiguous``: no array is one."""


class ReducePlan:
    """``d_out[0] = reduce(op, d_in, h_init)`` on ``stream``, made once for the dtypes, the
    length, the op, the initial value, the resource and the stream, then called per array.

    Made from example arrays (as ``cuda.compute.make_reduce_into`` is): everything
    :func:`device_reduce` checks is checked here, once; the cuda.compute reducer is built (or
    taken from the cache) and CUB's temp storage size queried here too. A call
    ``plan(d_in, d_out)`` checks that its arrays match the plan, then allocates the temp
    storage from ``mr`` on ``stream``, reduces and frees it on ``stream`` right after the
    launch, with no synchronization (the CUB temp-storage loop, the resource ordering the
    reuse of the freed block). It returns None; the result is written on ``stream``.

    Parameters are those of :func:`device_reduce`. ``d_in`` stands for every later input:
    a call's ``d_in`` must have its dtype, its number of items (any C-contiguous shape) and
    its device, and ``d_out`` its dtype and device, at least one element and C-contiguity;
    otherwise the call raises (TypeError or ValueError naming the argument) before it
    allocates. ``mr=None`` binds the current device resource when the plan is made. Call the
    plan with its device current (as for the stream).

    CuPy arrays are checked through their attributes (a few attribute reads); other device
    arrays (PyTorch, Numba) through ``__cuda_array_interface__`` and a pointer query per call.
    A plan may be called from several threads: calls of reducers of the same dtypes and op are
    serialized around the launch (as :func:`device_reduce`'s are).
    """

    __slots__ = (
        "_state",
        "_op",
        "_mr",
        "_stream",
        "_h_init",
        "_num_items",
        "_dtype",
        "_out_dtype",
        "_device",
        "_nbytes",
    )

    def __init__(self, d_in, d_out, op, h_init, *, mr=None, stream=None):
        reducer, op_obj, init, n, handle, resource, in_dev, more = _reduce_args(
            d_in, d_out, op, h_init, mr, stream
        )
        in_dtype, out_dtype, in_ptr, out_ptr, out_dev = more
        init = init.copy()  # the plan's value must not follow later writes to the caller's
        device = _device_of(in_ptr, in_dev)
        if device is None:
            device = _device_of(out_ptr, out_dev)
        if device is None:
            device = _current_device()
        cc_stream = StreamHandle(handle) if handle else None
        nbytes = _temp_bytes(reducer, d_in, d_out, n, op_obj, init, cc_stream, device)
        ndarray = _cupy_ndarray()
        if ndarray is None or not _CUPY[1]:
            ndarray = _NoFastPath
        self._op, self._mr, self._stream, self._h_init = op, resource, handle, init
        self._num_items, self._dtype, self._out_dtype = n, in_dtype, out_dtype
        self._device, self._nbytes = device, nbytes
        # what a call reads, in one tuple (one attribute read, then locals)
        self._state = (
            ndarray,
            in_dtype,
            n,
            device,
            out_dtype,
            resource.allocate,
            resource.deallocate,
            nbytes,
            rmm_stream(handle),
            reducer.lock.acquire,
            reducer.lock.release,
            TempStorage(0, nbytes),  # its ptr is set under the lock, right before the launch
            reducer.fn,
            op_obj,
            init,
            cc_stream,
        )

    def __call__(self, d_in, d_out) -> None:
        (
            ndarray,
            dtype,
            n,
            device,
            out_dtype,
            allocate,
            deallocate,
            nbytes,
            rs,
            acquire,
            release,
            tmp,
            fn,
            op,
            init,
            cc_stream,
        ) = self._state
        if (
            type(d_in) is not ndarray
            or type(d_out) is not ndarray
            or d_in.dtype is not dtype
            or d_in.size != n
            or not d_in._c_contiguous
            or d_in.data.device_id != device
            or d_out.dtype is not out_dtype
            or not d_out.size
            or not d_out._c_contiguous
            or d_out.data.device_id != device
        ):
            self._check(d_in, d_out)  # raises, unless they are valid arrays of another kind
        ptr = allocate(nbytes, rs)
        try:
            acquire()  # acquire and release: cheaper than a with block
            try:
                tmp.ptr = ptr
                # _call's launch, inlined: one Python call less per launch
                fn(
                    temp_storage=tmp,
                    d_in=d_in,
                    d_out=d_out,
                    num_items=n,
                    op=op,
                    h_init=init,
                    stream=cc_stream,
                )
            finally:
                release()
        finally:
            deallocate(ptr, nbytes, rs)  # no sync: the resource orders the reuse

    def _check(self, d_in, d_out):
        """TypeError or ValueError naming the argument that does not match the plan."""
        in_ptr, n, in_dtype, in_dev = _array_info(d_in, "d_in")
        out_ptr, out_size, out_dtype, out_dev = _array_info(d_out, "d_out")
        if in_dtype != self._dtype:
            raise TypeError(f"d_in has dtype {in_dtype} but the plan was made for {self._dtype}")
        if n != self._num_items:
            raise ValueError(f"d_in holds {n} items but the plan was made for {self._num_items}")
        if out_dtype != self._out_dtype:
            raise TypeError(
                f"d_out has dtype {out_dtype} but the plan was made for {self._out_dtype}"
            )
        if out_size < 1:
            raise ValueError("d_out must hold at least one element, got an empty array")
        for name, ptr, dev in (("d_in", in_ptr, in_dev), ("d_out", out_ptr, out_dev)):
            dev = _device_of(ptr, dev)
            if dev is not None and dev != self._device:
                raise ValueError(
                    f"{name} is on device {dev} but the plan was made on device {self._device}"
                )

    @property
    def num_items(self) -> int:
        """The number of items of every input."""
        return self._num_items

    @property
    def dtype(self) -> np.dtype:
        """The inputs' dtype."""
        return self._dtype

    @property
    def out_dtype(self) -> np.dtype:
        """The outputs' dtype."""
        return self._out_dtype

    @property
    def h_init(self) -> np.ndarray:
        """The initial value (a copy of the plan's one-element array)."""
        return self._h_init.copy()

    @property
    def op(self):
        """The op, as given."""
        return self._op

    @property
    def mr(self):
        """The resource the temp storage comes from."""
        return self._mr

    @property
    def stream(self) -> int:
        """The stream's handle (0: the legacy default stream)."""
        return self._stream

    @property
    def device(self) -> int:
        """The device of the arrays."""
        return self._device

    @property
    def nbytes(self) -> int:
        """The temp storage bytes allocated per call (CUB's size, at least 1)."""
        return self._nbytes

    def __repr__(self):
        return (
            f"ReducePlan(op={self._op!r}, dtype={self._dtype}, out_dtype={self._out_dtype}, "
            f"num_items={self._num_items}, h_init={self._h_init[0]!r}, device={self._device}, "
            f"stream={self._stream:#x}, nbytes={self._nbytes}, mr={type(self._mr).__name__})"
        )


def _cupy_stream(cupy, handle):
    """A CuPy stream viewing ``handle`` to allocate on (a null context for the default)."""
    if not handle:
        return contextlib.nullcontext()
    from_external = getattr(cupy.cuda.Stream, "from_external", None)  # CuPy 14
    if from_external is not None:
        return from_external(StreamHandle(handle))
    return cupy.cuda.ExternalStream(handle)


_SUM_INIT: dict = {}


def _sum_init(dtype):
    """The zero of NumPy's sum accumulator for ``dtype`` (cached; never written)."""
    init = _SUM_INIT.get(dtype)
    if init is None:
        # writable: cuda.compute takes a writable memoryview of it (and only reads it)
        init = np.zeros(1, dtype=np.add.reduce(np.zeros(1, dtype=dtype)).dtype)
        _SUM_INIT[dtype] = init
    return init


def device_sum(d_in, d_out=None, *, mr=None, stream=None):
    """The sum of ``d_in`` on ``stream`` (temp storage from ``mr``, freed without a sync).

    The accumulator follows NumPy's ``sum``: integers of less than 64 bits add up in int64
    (uint64 for unsigned), floats in their own type. With ``d_out=None`` the result is a new
    0-d CuPy array, written on ``stream``; otherwise ``d_out[0]`` and ``d_out`` is returned.
    """
    in_ptr, n, in_dtype, in_dev = _array_info(d_in, "d_in")
    init = _sum_init(in_dtype)
    acc = init.dtype
    handle = stream_handle(stream)
    if d_out is not None:
        out_ptr, out_size, _, out_dev = _array_info(d_out, "d_out")
        if out_size < 1:
            raise ValueError("d_out must hold at least one element, got an empty array")
    resource = _resource(mr)
    if d_out is None:
        cupy = require("cupy", "rmm_fences.reduce")

        with _cupy_stream(cupy, handle):
            out = cupy.empty(1, dtype=acc)
        result = out.reshape(())
    else:
        out = result = d_out
        _check_devices(in_ptr, in_dev, out_ptr, out_dev)
    reducer, op_obj = _reducer(d_in, out, "sum", init, in_dtype, np.dtype(out.dtype))
    _launch(reducer, d_in, out, n, op_obj, init, handle, resource, in_dev)
    return result
