# SPDX-License-Identifier: Apache-2.0
"""rmm_fences.reduce and the CuPy allocator without a GPU: imports, validation, streams."""

import numpy as np
import pytest

from rmm_fences._streams import StreamHandle, stream_handle
from rmm_fences.reduce import SUPPORTED_DTYPES, TempStorage, device_reduce, device_sum


class ProtocolStream:
    def __init__(self, handle, version=0):
        self.handle, self.version = handle, version

    def __cuda_stream__(self):
        return (self.version, self.handle)


class PtrStream:
    ptr = 0x1234


def test_imports_without_a_gpu():
    import rmm_fences.allocators.cupy  # noqa: F401
    import rmm_fences.reduce  # noqa: F401


@pytest.mark.parametrize(
    "stream, handle",
    [
        (None, 0),
        (ProtocolStream(0x5000), 0x5000),
        (StreamHandle(0x77), 0x77),
        (PtrStream(), 0x1234),
    ],
)
def test_stream_protocols(stream, handle):
    assert stream_handle(stream) == handle


def test_rmm_streams_speak_the_protocol():
    import rmm

    s = rmm.pylibrmm.stream.Stream(ProtocolStream(0xABC0))
    assert stream_handle(s) == 0xABC0


@pytest.mark.parametrize("bad", [5, "default", 1.5, object(), ProtocolStream(7, version=1)])
def test_bad_streams_name_the_argument(bad):
    with pytest.raises(TypeError, match="stream"):
        stream_handle(bad)


def test_host_arrays_are_refused_naming_the_argument():
    host = np.arange(10, dtype=np.float32)
    with pytest.raises(TypeError, match=r"d_in must be a device array .*host memory"):
        device_sum(host)
    with pytest.raises(TypeError, match="d_in must be a device array"):
        device_reduce([1, 2], None, "sum", 0)


class FakeDeviceArray:
    """Looks like a device array to the validation (no CUDA call is made before it passes)."""

    def __init__(self, shape, typestr, ptr=0, strides=None):
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (ptr, False),
            "strides": strides,
            "version": 3,
        }


@pytest.mark.parametrize("typestr", ["<c8", "|b1", "<f2", "|V8"])
def test_unsupported_dtypes(typestr):
    with pytest.raises(TypeError, match=r"d_in has dtype .*supported: int8"):
        device_sum(FakeDeviceArray((4,), typestr))


def test_outputs_too_small_and_strided_inputs():
    with pytest.raises(ValueError, match="d_out must hold at least one element"):
        device_sum(FakeDeviceArray((4,), "<f4"), FakeDeviceArray((0,), "<f4"))
    with pytest.raises(ValueError, match="d_in must be C-contiguous"):
        device_sum(FakeDeviceArray((4,), "<f4", strides=(8,)))


def test_bad_resource_is_refused():
    with pytest.raises(TypeError, match="mr must be None or an rmm.mr.DeviceMemoryResource"):
        device_sum(FakeDeviceArray((0,), "<f4"), FakeDeviceArray((1,), "<f4"), mr="pool")


def test_supported_dtypes_and_temp_storage_interface():
    assert np.dtype("float32") in SUPPORTED_DTYPES and np.dtype("int64") in SUPPORTED_DTYPES
    t = TempStorage(0x1000, 64)
    cai = t.__cuda_array_interface__
    assert cai["shape"] == (64,) and cai["data"] == (0x1000, False) and t.nbytes == 64
