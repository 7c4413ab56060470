# SPDX-License-Identifier: Apache-2.0
from typing import Any, Literal, TypedDict

from rmm.pylibrmm.memory_resource import DeviceMemoryResource, UpstreamResourceAdaptor

SyncMode = Literal["device", "stream", "deferred"]

class SyncOnFreeStats(TypedDict):
    syncs: int
    deferred: int
    released: int
    oom_retries: int
    parked: int
    peak_pending_bytes: int

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
