# SPDX-License-Identifier: Apache-2.0
"""Timing helpers for any rmm ``DeviceMemoryResource``."""

import rmm  # noqa: F401

from rmm_fences._lib.memory_resource import (
    alloc_free_ns,
    fence_call_ns,
    random_allocations,
    threaded_alloc_free,
    threaded_stream_queries,
)

__all__ = [
    "alloc_free_ns",
    "fence_call_ns",
    "random_allocations",
    "threaded_alloc_free",
    "threaded_stream_queries",
]
