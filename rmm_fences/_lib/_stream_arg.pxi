# SPDX-License-Identifier: Apache-2.0
# The stream argument of the native calls, shared by the resources (memory_resource.pyx) and
# the benchmark loops (_bench.pyx): None is the default stream.
# Needs Stream (cimported) and DEFAULT_STREAM in the including module.


cdef Stream _as_stream(object stream):
    if stream is None:
        return DEFAULT_STREAM
    if isinstance(stream, Stream):
        return stream
    try:
        return Stream(stream)
    except Exception as exc:
        raise TypeError(
            "stream must be None, an rmm Stream, or a CuPy, Numba, cuda.core or other "
            f"__cuda_stream__ stream; got {type(stream).__name__}"
        ) from exc
