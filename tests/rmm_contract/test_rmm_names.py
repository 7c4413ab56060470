# SPDX-License-Identifier: Apache-2.0
"""Names an RMM user knows mean one thing: ``initial_pool_size`` of
StreamOrderedPoolMemoryResource means what it means in rmm (CPU: a fake upstream;
tests/rmm_contract/test_rmm_names_gpu.py measures None on a GPU), ``install`` is PyTorch's
allocator swap alone, and every public error is importable from ``rmm_fences``."""

import ast
import importlib
import inspect
import pathlib
import pkgutil

import pytest
import rmm

import rmm_fences
from rmm_fences import StreamOrderedPoolMemoryResource
from rmm_fences._cuda import device_count

from helpers.fake_upstream import FakeUpstream

SRC = pathlib.Path(rmm_fences.__file__).parent

needs_no_gpu = pytest.mark.skipif(
    device_count() > 0, reason="shows what happens on a machine without a usable GPU"
)


def test_pool_initial_pool_size_default_is_an_explicit_zero():
    params = inspect.signature(StreamOrderedPoolMemoryResource).parameters
    assert params["initial_pool_size"].default == 0  # not None, which means something else
    assert params["maximum_pool_size"].default is None  # None: no bound, as in rmm
    up = FakeUpstream()
    pool = StreamOrderedPoolMemoryResource(up.mr)
    assert pool.pool_size() == 0 and up.calls == []  # starts empty, grows on demand
    ptr = pool.allocate(1000)
    assert [c[0] for c in up.calls] == ["allocate"] and pool.pool_size() == 2 << 20
    pool.deallocate(ptr, 1000)


def test_the_stub_shows_the_pool_default():
    stub = ast.parse((SRC / "_lib" / "memory_resource.pyi").read_text())
    [cls] = [n for n in stub.body if getattr(n, "name", "") == "StreamOrderedPoolMemoryResource"]
    [init] = [n for n in cls.body if getattr(n, "name", "") == "__init__"]
    names = [a.arg for a in init.args.args]
    defaults = dict(zip(names[len(names) - len(init.args.defaults) :], init.args.defaults))
    assert ast.literal_eval(defaults["initial_pool_size"]) == 0


@needs_no_gpu
def test_pool_initial_pool_size_none_asks_rmm_for_half_the_free_memory():
    """None means what it means in ``rmm.mr.PoolMemoryResource``: half the free device memory,
    computed by rmm. Without a GPU that query fails, in rmm's pool and in this one alike (the
    old pool took None for 0 and asked nothing)."""
    with pytest.raises(RuntimeError) as theirs:
        rmm.mr.PoolMemoryResource(FakeUpstream().mr, initial_pool_size=None)
    up = FakeUpstream()
    with pytest.raises(RuntimeError) as ours:
        StreamOrderedPoolMemoryResource(up.mr, initial_pool_size=None)
    assert str(ours.value) == str(theirs.value)
    assert up.calls == []


def test_one_install_per_meaning():
    """``install`` is PyTorch's allocator swap alone; making a chain the current device
    resource is ``use_resource``."""
    defined = sorted(
        f"{path.relative_to(SRC).as_posix()}:{node.name}"
        for path in SRC.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == "install"
    )
    assert defined == ["allocators/torch.py:install"]
    assert not hasattr(rmm_fences, "install")
    from rmm_fences.specs import use_resource

    assert rmm_fences.use_resource is use_resource
    assert "device" in inspect.signature(use_resource).parameters
    with pytest.raises(TypeError, match="spec_or_resource must be a spec string"):
        use_resource(42, device=0)


def _modules():
    yield rmm_fences
    for info in pkgutil.walk_packages(rmm_fences.__path__, "rmm_fences."):
        if info.name.startswith("rmm_fences._"):
            continue
        try:
            yield importlib.import_module(info.name)
        except ImportError:  # an extra that is not installed (torch, cuda-cccl)
            continue


def test_every_public_error_is_exported_at_the_top():
    errors = {
        name: obj
        for module in _modules()
        for name, obj in vars(module).items()
        if not name.startswith("_")
        and inspect.isclass(obj)
        and issubclass(obj, BaseException)
        and obj.__module__.startswith("rmm_fences")
    }
    assert {"SpecError", "HazardError", "HazardWarning"} <= set(errors)
    for name, cls in errors.items():
        assert name in rmm_fences.__all__, name
        assert getattr(rmm_fences, name) is cls, name
