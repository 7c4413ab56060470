# SPDX-License-Identifier: Apache-2.0
"""Small CUDA queries that work, and say why not, on a machine without a GPU."""

from __future__ import annotations

import functools
import importlib.metadata
import platform


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


#: The distributions whose versions :func:`environment` records, where installed.
RECORDED_DISTRIBUTIONS = (
    "rmm-fences-cu13",
    "rmm-cu13",
    "cupy-cuda13x",
    "cuda-cccl",
    "torch",
    "dask-cuda",
    "asv",
)


def environment(device: int = 0) -> dict:
    """What a measurement ran on, for its data file: the GPU's name, the driver's version
    (NVML's string, e.g. ``"580.159.04"``, else the CUDA driver API version, e.g. ``13000``),
    and the Python and package versions installed. A field that cannot be read is None (no
    GPU, no driver); a package not installed is left out."""
    env = {"gpu": None, "driver": None, "cuda_driver_api": None}
    try:
        from cuda.bindings import runtime

        err, version = runtime.cudaDriverGetVersion()
        if err == runtime.cudaError_t.cudaSuccess and version:  # 0: no driver
            env["cuda_driver_api"] = version
        err, props = runtime.cudaGetDeviceProperties(device)
        if err == runtime.cudaError_t.cudaSuccess:
            name = props.name
            env["gpu"] = (name.decode() if isinstance(name, bytes) else str(name)).rstrip("\0")
    except Exception:  # noqa: BLE001 - no driver, no GPU: the fields stay None
        pass
    try:
        from cuda.bindings import nvml

        nvml.init_v2()
        try:
            env["driver"] = nvml.system_get_driver_version()
        finally:
            nvml.shutdown()
    except Exception:  # noqa: BLE001 - no NVML: the API version above stands in
        pass
    versions = {"python": platform.python_version()}
    for dist in RECORDED_DISTRIBUTIONS:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    env["versions"] = versions
    return env
