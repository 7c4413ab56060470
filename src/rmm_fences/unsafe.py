# SPDX-License-Identifier: Apache-2.0
"""Allocators that are UNSAFE ON PURPOSE, to reproduce the hazards rmm_fences fixes.

Never use them for real work. Each one frees in a way that races with kernels still using the
block; wrap it in :class:`rmm_fences.SyncOnFreeResourceAdaptor` to make it safe.
"""

import rmm  # noqa: F401

from rmm_fences._lib.memory_resource import (
    NaiveCachingMemoryResource,
    UnmappingVmmMemoryResource,
)

__all__ = ["NaiveCachingMemoryResource", "UnmappingVmmMemoryResource"]
