# SPDX-License-Identifier: Apache-2.0
from typing import Any, Literal, TypedDict

from rmm.pylibrmm.memory_resource import DeviceMemoryResource, UpstreamResourceAdaptor

from rmm_fences._hazards import AllocationRecord, HazardRecord

SyncMode = Literal["device", "stream", "deferred"]

class SyncOnFreeStats(TypedDict):
    syncs: int
    deferred: int
    released: int
    oom_retries: int
    parked: int
    peak_pending_bytes: int
    failed_syncs: int
    rejected_frees: int

class SyncOnFreeResourceAdaptor(UpstreamResourceAdaptor):
    def __init__(
        self,
        upstream_mr: DeviceMemoryResource,
        mode: SyncMode = "deferred",
        max_pending_bytes: int | str | None = None,
    ) -> None: ...
    @property
    def mode(self) -> SyncMode: ...
    @property
    def max_pending_bytes(self) -> int | None: ...
    @property
    def pending_bytes(self) -> int: ...
    @property
    def pending_count(self) -> int: ...
    @property
    def stats(self) -> SyncOnFreeStats: ...
    def allocate(self, nbytes: int, stream: Any = ...) -> int: ...
    def deallocate(self, ptr: int, nbytes: int, stream: Any = ...) -> None: ...
    def flush(self) -> None: ...

class NaiveCachingMemoryResource(UpstreamResourceAdaptor):
    def __init__(self, upstream_mr: DeviceMemoryResource) -> None: ...
    def release(self) -> None: ...
    @property
    def cached_bytes(self) -> int: ...
    @property
    def hits(self) -> int: ...
    @property
    def misses(self) -> int: ...

def alloc_free_ns(
    mr: DeviceMemoryResource,
    nbytes: int | str,
    iterations: int = 10000,
    stream: Any = None,
    *,
    warmup: int = 100,
) -> float: ...

def fence_call_ns(iterations: int = 100000, stream: Any = None) -> dict[str, float]: ...

def random_allocations(
    mr: DeviceMemoryResource,
    operations: int = 100000,
    *,
    max_live: int = 10000,
    min_size: int | str = 256,
    max_size: int | str = "4MiB",
    max_live_bytes: int | str = "16GiB",
    seed: int = 0,
    stream: Any = None,
) -> float: ...
def threaded_alloc_free(
    mr: DeviceMemoryResource, nbytes: int | str, iterations: int, streams: list[Any]
) -> float: ...

class StressStats(TypedDict):
    iterations: int
    allocations: int
    bytes: int
    cross_stream_frees: int
    out_of_memory: int
    checks: int
    seconds: float

def stress(
    mr: DeviceMemoryResource,
    streams: list[Any],
    seconds: float,
    *,
    fill_kernel: int,
    check_kernel: int,
    errors: int,
    max_bytes: int | str = "4MiB",
    max_live: int = 32,
    seed: int = 0,
    check_delay_ns: int = 20000,
) -> StressStats: ...

class StreamOrderedPoolStats(TypedDict):
    current_bytes: int
    peak_bytes: int
    pool_bytes: int
    same_stream_reuse: int
    cross_stream_reuse: int
    upstream_growths: int
    fences: int
    stream_waits: int
    reclaim_syncs: int
    retired_streams: int
    rejected_frees: int

class StreamOrderedPoolMemoryResource(UpstreamResourceAdaptor):
    def __init__(
        self,
        upstream_mr: DeviceMemoryResource,
        initial_pool_size: int | str | None = None,
        maximum_pool_size: int | str | None = None,
    ) -> None: ...
    def allocate(self, nbytes: int, stream: Any = ...) -> int: ...
    def deallocate(self, ptr: int, nbytes: int, stream: Any = ...) -> None: ...
    def pool_size(self) -> int: ...
    @property
    def maximum_pool_size(self) -> int | None: ...
    def release(self) -> int: ...
    def retire_stream(self, stream: Any) -> None: ...
    @property
    def stats(self) -> StreamOrderedPoolStats: ...
def threaded_stream_queries(query: str, iterations: int, streams: list[Any]) -> float: ...

OnHazard = Literal["warn", "raise", "record"]

class HazardTrackerStats(TypedDict):
    allocations: int
    deallocations: int
    rejected_frees: int
    fences: int
    stream_waits: int
    unchecked: int
    hazards: int
    allocated_bytes: int
    peak_bytes: int
    pending_checks: int

class HazardTrackingResourceAdaptor(UpstreamResourceAdaptor):
    def __init__(
        self,
        upstream_mr: DeviceMemoryResource,
        *,
        upstream_stream_ordered: bool | None = None,
        capture_stacks: bool = False,
        on_hazard: OnHazard = "warn",
        nvtx: bool = True,
        report_at_exit: bool = False,
    ) -> None: ...
    @property
    def on_hazard(self) -> OnHazard: ...
    @property
    def upstream_stream_ordered(self) -> bool: ...
    @property
    def capture_stacks(self) -> bool: ...
    @property
    def nvtx(self) -> bool: ...
    @property
    def report_at_exit(self) -> bool: ...
    @property
    def nvtx_active(self) -> bool: ...
    def allocate(self, nbytes: int, stream: Any = ...) -> int: ...
    def deallocate(self, ptr: int, nbytes: int, stream: Any = ...) -> None: ...
    def record_stream(self, buffer_or_ptr: Any, stream: Any) -> None: ...
    def outstanding(self) -> list[AllocationRecord]: ...
    @property
    def allocated_bytes(self) -> int: ...
    @property
    def peak_bytes(self) -> int: ...
    @property
    def stream_bytes(self) -> dict[int, int]: ...
    @property
    def hazards(self) -> list[HazardRecord]: ...
    @property
    def stats(self) -> HazardTrackerStats: ...
    def check(self) -> None: ...
    def reset(self) -> None: ...
    def report(self, format: Literal["text", "json"] = "text") -> str: ...

class UnmappingVmmMemoryResource(DeviceMemoryResource):
    def __init__(self, reserve_size: int | str = "64GiB", device: int | None = None) -> None: ...
    @property
    def device(self) -> int: ...
    @property
    def granularity(self) -> int: ...
    @property
    def reserve_size(self) -> int: ...
    @property
    def mapped_bytes(self) -> int: ...
