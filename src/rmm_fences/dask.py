# SPDX-License-Identifier: Apache-2.0
"""rmm_fences chains on every Dask worker (optional extra: ``pip install rmm_fences[dask]``).

>>> from dask_cuda import LocalCUDACluster                       # doctest: +SKIP
>>> from distributed import Client                               # doctest: +SKIP
>>> from rmm_fences.dask import FencesPlugin, gather_stats       # doctest: +SKIP
>>> client = Client(LocalCUDACluster())                          # doctest: +SKIP
>>> client.register_plugin(FencesPlugin("tracking(pool(cuda_async))", cupy_allocator=True))
>>> gather_stats(client)                                         # doctest: +SKIP

The plugin composes the chain on each worker's GPU (dask-cuda gives each worker one device,
which is then current), installs it as the current device resource (and as CuPy's allocator
when asked), and restores what was there on teardown.
"""

from __future__ import annotations

from rmm_fences._optional import require
from rmm_fences.specs import parse_spec

WorkerPlugin = require("distributed", "rmm_fences.dask").WorkerPlugin

__all__ = ["FencesPlugin", "gather_stats"]


class FencesPlugin(WorkerPlugin):
    """Install the chain of ``spec`` on every worker.

    Parameters
    ----------
    spec : str
        A resource spec (see :func:`rmm_fences.parse_spec`), checked here, before any worker
        is touched: a bad one raises :class:`rmm_fences.SpecError`.
    cupy_allocator : bool
        Also route CuPy's allocations on the worker through the chain
        (:class:`rmm_fences.allocators.cupy.CupyAllocator`).
    """

    name = "rmm-fences"

    def __init__(self, spec: str, *, cupy_allocator: bool = False):
        parse_spec(spec)
        if not isinstance(cupy_allocator, bool):
            raise TypeError(f"cupy_allocator must be a bool, got {type(cupy_allocator).__name__}")
        self.spec = spec
        self.cupy_allocator = cupy_allocator
        self.resource = None
        self._installed = None
        self._previous_cupy = None

    def __getstate__(self):  # what travels to the workers: the spec, not a resource
        return {"spec": self.spec, "cupy_allocator": self.cupy_allocator}

    def __setstate__(self, state):
        self.__init__(state["spec"], cupy_allocator=state["cupy_allocator"])

    def __eq__(self, other):
        return (
            isinstance(other, FencesPlugin)
            and other.spec == self.spec
            and other.cupy_allocator == self.cupy_allocator
        )

    def __hash__(self):
        return hash((self.spec, self.cupy_allocator))

    def __repr__(self):
        return f"FencesPlugin({self.spec!r}, cupy_allocator={self.cupy_allocator})"

    def setup(self, worker=None):
        from rmm_fences.specs import use_resource

        self._installed = use_resource(self.spec)
        self.resource = self._installed.resource
        if self.cupy_allocator:
            import cupy

            from rmm_fences.allocators.cupy import CupyAllocator

            self._previous_cupy = cupy.cuda.get_allocator()
            cupy.cuda.set_allocator(CupyAllocator(self.resource))

    def teardown(self, worker=None):
        if self._previous_cupy is not None:
            import cupy

            cupy.cuda.set_allocator(self._previous_cupy)
            self._previous_cupy = None
        if self._installed is not None:
            self._installed.__exit__(None, None, None)
            self._installed = None


def chain_stats(resource) -> list[dict]:
    """One dict per resource of the chain, outermost first: its type and whatever counters
    it keeps (``stats``, rmm's ``allocation_counts``, the tracker's bytes and hazards)."""
    out = []
    while resource is not None:
        entry = {"resource": type(resource).__name__}
        stats = getattr(resource, "stats", None)
        if isinstance(stats, dict):
            entry["stats"] = dict(stats)
        counts = getattr(resource, "allocation_counts", None)
        if counts is not None:
            entry["allocation_counts"] = {
                k: getattr(counts, k)
                for k in (
                    "current_bytes",
                    "current_count",
                    "peak_bytes",
                    "peak_count",
                    "total_bytes",
                    "total_count",
                )
                if hasattr(counts, k)
            }
        if hasattr(resource, "hazards") and hasattr(resource, "peak_bytes"):
            entry["allocated_bytes"] = resource.allocated_bytes
            entry["peak_bytes"] = resource.peak_bytes
            entry["hazards"] = [
                {"kind": h.kind, "pointer": h.pointer, "size": h.size, "message": h.message}
                for h in resource.hazards
            ]
        out.append(entry)
        get_upstream = getattr(resource, "get_upstream", None)
        resource = get_upstream() if get_upstream is not None else None
    return out


def _worker_stats(dask_worker):
    plugin = dask_worker.plugins.get(FencesPlugin.name)
    if plugin is None or plugin.resource is None:
        return {"spec": None, "chain": []}
    return {"spec": plugin.spec, "chain": chain_stats(plugin.resource)}


def gather_stats(client) -> dict:
    """Per worker address: the installed spec and :func:`chain_stats` of its chain."""
    return client.run(_worker_stats)
