# SPDX-License-Identifier: Apache-2.0
"""The signatures of the resources, without a GPU: what ``inspect.signature`` shows (the text
signature that opens each cdef class's docstring: memory_resource.pyx) has the defaults the
class's ``__cinit__`` applies, and the stub's ``__init__`` is that signature."""

import ast
import inspect
import pathlib

import pytest
import rmm

from rmm_fences import (
    HazardTrackingResourceAdaptor,
    StreamOrderedPoolMemoryResource,
    SyncOnFreeResourceAdaptor,
    VmmPoolMemoryResource,
)
from rmm_fences._lib import memory_resource
from rmm_fences.unsafe import NaiveCachingMemoryResource, UnmappingVmmMemoryResource

ADAPTORS = [
    SyncOnFreeResourceAdaptor,
    NaiveCachingMemoryResource,
    StreamOrderedPoolMemoryResource,
    HazardTrackingResourceAdaptor,
]

#: What a resource built without an argument shows of it, by argument name.
SHOWN = {
    "mode": lambda mr: mr.mode,
    "max_pending_bytes": lambda mr: mr.max_pending_bytes,
    "max_batch_frees": lambda mr: mr.max_batch_frees,
    "max_batch_bytes": lambda mr: mr.max_batch_bytes,
    "reuse_on_stream": lambda mr: mr.reuse_on_stream,
    "initial_pool_size": lambda mr: mr.pool_size(),  # 0: nothing taken at construction
    "maximum_pool_size": lambda mr: mr.maximum_pool_size,
    "maximum_growth_size": lambda mr: mr.maximum_growth_size,
    "capture_stacks": lambda mr: mr.capture_stacks,
    "on_hazard": lambda mr: mr.on_hazard,
    "nvtx": lambda mr: mr.nvtx,
    "report_at_exit": lambda mr: mr.report_at_exit,
}


def _defaults(cls):
    params = list(inspect.signature(cls).parameters.values())
    assert params[0].name == "upstream_mr" and params[0].default is inspect.Parameter.empty
    return {p.name: p.default for p in params[1:]}


@pytest.mark.parametrize("cls", ADAPTORS, ids=lambda c: c.__name__)
def test_the_cinit_applies_the_signature_defaults(cls):
    upstream = rmm.mr.CudaMemoryResource()
    mr = cls(upstream)
    for name, default in _defaults(cls).items():
        if name == "upstream_stream_ordered":  # None: inferred from the upstream
            assert default is None
            assert mr.upstream_stream_ordered == memory_resource._infer_stream_ordered(upstream)
            continue
        assert SHOWN[name](mr) == default, name


def _stub_init(name):
    stub = ast.parse(
        (pathlib.Path(memory_resource.__file__).parent / "memory_resource.pyi").read_text()
    )
    [cls] = [n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == name]
    [init] = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    return init.args


@pytest.mark.parametrize(
    "cls",
    [*ADAPTORS, VmmPoolMemoryResource, UnmappingVmmMemoryResource],
    ids=lambda c: c.__name__,
)
def test_the_stub_init_is_the_runtime_signature(cls):
    args = _stub_init(cls.__name__)
    positional = [a.arg for a in args.args][1:]  # without self
    defaults = [ast.literal_eval(d) for d in args.defaults]
    stub = dict(zip(positional[len(positional) - len(defaults) :], defaults))
    stub.update(
        {a.arg: ast.literal_eval(d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d}
    )
    runtime = inspect.signature(cls).parameters
    assert positional + [a.arg for a in args.kwonlyargs] == list(runtime)
    assert [a.arg for a in args.kwonlyargs] == [
        p.name for p in runtime.values() if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    assert stub == {p.name: p.default for p in runtime.values() if p.default is not p.empty}
