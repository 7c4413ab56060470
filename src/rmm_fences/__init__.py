# SPDX-License-Identifier: Apache-2.0
"""RMM memory resources that make freeing GPU memory safe while kernels may still use it.

>>> import rmm, rmm_fences
>>> mr = rmm_fences.SyncOnFreeResourceAdaptor(rmm.mr.CudaAsyncMemoryResource())
>>> rmm.mr.set_current_device_resource(mr)
"""

import rmm  # noqa: F401  (loads librmm.so, which the extension links)

from rmm_fences._cxx import get_cmake_dir, get_include
from rmm_fences._hazards import AllocationRecord, HazardError, HazardRecord, HazardWarning
from rmm_fences._lib.memory_resource import (
    HazardTrackingResourceAdaptor,
    StreamOrderedPoolMemoryResource,
    SyncOnFreeResourceAdaptor,
    VmmPoolMemoryResource,
)
from rmm_fences._version import __version__
from rmm_fences.specs import SpecError, compose, parse_spec, use_resource

__all__ = [
    "AllocationRecord",
    "HazardError",
    "HazardRecord",
    "HazardTrackingResourceAdaptor",
    "HazardWarning",
    "SpecError",
    "StreamOrderedPoolMemoryResource",
    "SyncOnFreeResourceAdaptor",
    "VmmPoolMemoryResource",
    "__version__",
    "compose",
    "get_cmake_dir",
    "get_include",
    "parse_spec",
    "use_resource",
]
