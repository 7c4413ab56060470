# SPDX-License-Identifier: Apache-2.0
"""Stream arguments: None, CuPy, rmm, cuda.core, Numba or any ``__cuda_stream__`` object.

Pure Python; needs no GPU.
"""

from __future__ import annotations


class StreamHandle:
    """A raw ``cudaStream_t`` that speaks the CUDA stream protocol (version 0)."""

    __slots__ = ("handle",)

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)

    def __repr__(self):
        return f"StreamHandle({self.handle:#x})"


def stream_handle(stream, name: str = "stream") -> int:
    """The ``cudaStream_t`` of ``stream`` as an int (0: the legacy default stream).

    Raises TypeError naming ``name`` for anything that is not a stream.
    """
    if stream is None:
        return 0
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        try:
            version, handle = protocol()[:2]
        except Exception as exc:
            raise TypeError(
                f"{name}: __cuda_stream__() of {type(stream).__name__} failed: {exc}"
            ) from exc
        if version != 0 or not isinstance(handle, int):
            raise TypeError(f"{name}: unsupported __cuda_stream__ result {(version, handle)!r}")
        return handle
    ptr = getattr(stream, "ptr", None)  # CuPy streams of versions without the protocol
    if isinstance(ptr, int) and not isinstance(stream, int):
        return ptr
    handle = getattr(stream, "handle", None)  # Numba streams
    if handle is not None and hasattr(handle, "value"):
        return int(handle.value or 0)
    raise TypeError(
        f"{name} must be None, a CuPy, rmm, cuda.core or Numba stream, or an object with "
        f"__cuda_stream__; got {type(stream).__name__}"
    )


_RMM_STREAMS: dict[int, object] = {}


def rmm_stream(handle: int):
    """An rmm ``Stream`` viewing ``handle`` (cached: building one costs microseconds)."""
    s = _RMM_STREAMS.get(handle)
    if s is None:
        from rmm.pylibrmm.stream import DEFAULT_STREAM, Stream

        s = DEFAULT_STREAM if handle == 0 else Stream(StreamHandle(handle))
        if len(_RMM_STREAMS) >= 256:
            _RMM_STREAMS.clear()
        _RMM_STREAMS[handle] = s
    return s
