# SPDX-License-Identifier: Apache-2.0
from typing import TypedDict

from rmm.pylibrmm.memory_resource import DeviceMemoryResource

ALLOC_FN: str
FREE_FN: str
RECORD_STREAM_FN: str
POOL_ALLOC_FN: str
POOL_FREE_FN: str

class TorchAllocatorStats(TypedDict):
    allocations: int
    frees: int
    current_allocations: int
    peak_allocations: int
    allocated_bytes: int
    freed_bytes: int
    current_bytes: int
    peak_bytes: int
    num_ooms: int
    record_stream_calls: int
    recorded_frees: int
    stream_waits: int
    stream_syncs: int
    leaked_blocks: int
    leaked_bytes: int
    rejected_frees: int
    unknown_record_streams: int

class EntryPoints(TypedDict):
    alloc: int
    free: int
    record_stream: int
    pool_alloc: int
    pool_free: int

def install_core(mr: DeviceMemoryResource | None, device: int) -> None: ...
def is_installed() -> bool: ...
def stats() -> TorchAllocatorStats: ...
def reset_peak() -> None: ...
def install_pool_core(mr: DeviceMemoryResource | None, device: int) -> None: ...
def is_pool_installed() -> bool: ...
def pool_stats() -> TorchAllocatorStats: ...
def reset_pool_peak() -> None: ...
def entry_points() -> EntryPoints: ...
