# SPDX-License-Identifier: Apache-2.0
"""Small CUDA queries that work, and say why not, on a machine without a GPU."""

from __future__ import annotations

import functools


@functools.cache
def device_count() -> int:
    """Number of CUDA devices visible to this process (0 without a driver or a GPU)."""
    return _probe()[0]


def no_device_reason() -> str:
    """Why no CUDA device is usable here (empty when one is)."""
    return _probe()[1]


@functools.cache
def _probe() -> tuple[int, str]:
    try:
        from cuda.bindings import runtime
    except ImportError as exc:  # pragma: no cover - cuda-bindings comes with rmm
        return 0, f"cuda-bindings is not importable ({exc})"
    err, count = runtime.cudaGetDeviceCount()
    if err != runtime.cudaError_t.cudaSuccess:
        return 0, f"no CUDA device found (cudaGetDeviceCount: {err.name})"
    if count == 0:
        return 0, "no CUDA device found"
    return count, ""


def current_device() -> int:
    """The current CUDA device's ordinal; RuntimeError saying why where there is none."""
    from cuda.bindings import runtime

    err, device = runtime.cudaGetDevice()
    if err != runtime.cudaError_t.cudaSuccess:
        raise RuntimeError(f"no current CUDA device (cudaGetDevice: {err.name})")
    return device


class on_device:
    """Context manager: ``device`` is current inside, the previous device after."""

    def __init__(self, device: int):
        self.device = device

    def __enter__(self):
        from cuda.bindings import runtime

        self.previous = current_device()
        if self.previous != self.device:
            (err,) = runtime.cudaSetDevice(self.device)
            if err != runtime.cudaError_t.cudaSuccess:
                raise ValueError(f"device {self.device} cannot be made current ({err.name})")
        return self

    def __exit__(self, *exc):
        from cuda.bindings import runtime

        if self.previous != self.device:
            runtime.cudaSetDevice(self.previous)
        return False
