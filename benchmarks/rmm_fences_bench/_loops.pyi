# SPDX-License-Identifier: Apache-2.0
from typing import Any, Literal, TypedDict

from rmm.pylibrmm.memory_resource import DeviceMemoryResource

from rmm_fences_bench.alloc_log import Trace

class FootprintMeter:
    source: str
    def __init__(self, mr: DeviceMemoryResource) -> None: ...
    def start(self) -> None: ...
    def peak(self) -> int | None: ...

def alloc_free_ns(
    mr: DeviceMemoryResource,
    nbytes: int | str,
    iterations: int = 10000,
    stream: Any = None,
    *,
    warmup: int = 100,
    free_stream: Any = None,
) -> float: ...
def fence_call_ns(iterations: int = 100000, stream: Any = None) -> dict[str, float]: ...
def core_pair_ns(
    core: Literal["pool", "sync_on_free", "tracking_pool"],
    nbytes: int | str,
    iterations: int = 1000000,
) -> dict[str, float]: ...
def page_call_ns(pages: int = 64, rounds: int = 10, device: int = -1) -> dict[str, float]: ...
def random_allocations(
    mr: DeviceMemoryResource,
    operations: int = 100000,
    *,
    max_live: int = 10000,
    min_size: int | str = 256,
    max_size: int | str = "4MiB",
    max_live_bytes: int | str = "16GiB",
    random_state: int = 0,
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
    random_state: int = 0,
    check_delay_ns: int = 20000,
) -> StressStats: ...
def threaded_stream_queries(query: str, iterations: int, streams: list[Any]) -> float: ...

class ReplayStats(TypedDict):
    seconds: float
    allocations_per_s: float
    allocations: int
    frees: int
    errors: int
    skipped_frees: int
    leftovers: int
    peak_live_bytes: int
    trace_peak_live_bytes: int
    footprint_bytes: int | None
    fragmentation: float | None
    footprint_source: Literal["cuda_async_pool", "vmm_pool", "statistics", "none"]

def footprint_layer(
    mr: DeviceMemoryResource,
) -> tuple[
    Literal["cuda_async_pool", "vmm_pool", "statistics", "none"], DeviceMemoryResource | None
]: ...
def replay(
    mr: DeviceMemoryResource,
    trace: Trace,
    *,
    streams: list[Any] | None = None,
    repeat: int = 1,
    ordered: bool = False,
) -> ReplayStats: ...
