# SPDX-License-Identifier: Apache-2.0
"""rmm_fences.allocators.torch against a fake ``torch`` (tests/helpers/torch_child.py): no GPU, no
PyTorch.

The compiled ``_torch`` module is real. Installing is once per process for good, so every
successful install runs in a child process; the errors are checked here, in a process where
nothing was installed.
"""

import json
import pathlib
import subprocess
import sys

import pytest

from helpers.paths import TORCH_CHILD as CHILD
from helpers.torch_child import fake_torch

TORCH_KEYS = {
    "allocated_bytes.all.current",
    "allocated_bytes.all.peak",
    "allocated_bytes.all.allocated",
    "allocated_bytes.all.freed",
    "allocation.all.current",
    "allocation.all.peak",
    "allocation.all.allocated",
    "allocation.all.freed",
    "num_ooms",
    "num_alloc_retries",
}
RMM_FENCES_KEYS = {
    "record_stream_calls",
    "recorded_frees",
    "stream_waits",
    "stream_syncs",
    "leaked_blocks",
    "leaked_bytes",
    "rejected_frees",
    "unknown_record_streams",
}


def run_child(scenario, tmp_path):
    return run_child_args([scenario], tmp_path)


def run_child_args(args, tmp_path):
    res = subprocess.run(
        [sys.executable, str(CHILD), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # the source tree must not shadow the installed package
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture
def rt(monkeypatch):
    """The module, with nothing installed in this process."""
    import rmm_fences.allocators.torch as rt
    from rmm_fences._lib import _torch

    assert rt.installed() is None and not _torch.is_installed()
    return rt


@pytest.fixture
def torch(monkeypatch):
    modules = fake_torch()
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return modules["torch"]


def test_install_without_torch_raises_import_error(rt, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match=r"install\(\) needs PyTorch"):
        rt.install()


def test_install_after_torch_cuda_init_raises_and_swaps_nothing(rt, monkeypatch):
    modules = fake_torch(initialized=True)
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    with pytest.raises(RuntimeError, match="must run before PyTorch's first CUDA allocation") as e:
        rt.install()
    assert "cannot swap its allocator afterwards (nor back to its own)" in str(e.value)
    assert modules["torch"].calls == []
    assert rt.installed() is None


@pytest.mark.parametrize(
    "mr, kwargs, match",
    [
        (
            42,
            {},
            "mr must be None .* a compose spec string or an rmm.mr.DeviceMemoryResource, got int",
        ),
        (object(), {"device": 0}, "got object"),
        (None, {"device": 0}, "device is only for a given mr"),
    ],
)
def test_install_with_a_bad_mr_raises_type_error_and_swaps_nothing(rt, torch, mr, kwargs, match):
    with pytest.raises(TypeError, match=match):
        rt.install(mr, **kwargs)
    assert torch.calls == []
    assert rt.installed() is None


def test_memory_stats_without_an_install_raise(rt):
    with pytest.raises(RuntimeError, match="no rmm_fences torch allocator is installed"):
        rt.memory_stats()
    with pytest.raises(RuntimeError, match="no rmm_fences torch allocator is installed"):
        rt.reset_peak_memory_stats()
    from rmm_fences._lib import _torch

    with pytest.raises(RuntimeError, match="no rmm_fences torch allocator core is installed"):
        _torch.stats()


def test_importing_rmm_fences_and_the_module_does_not_import_torch(tmp_path):
    assert run_child("no-torch-import", tmp_path) == {
        "torch_imported": False,
        "scenario": "no-torch-import",
    }


@pytest.mark.parametrize("scenario", ["install-resource", "install-none"])
def test_install_swaps_once_to_a_pluggable_allocator_over_the_torch_module(scenario, tmp_path):
    out = run_child(scenario, tmp_path)
    assert out["before"] == {"installed": False, "core": False}
    assert out["after"] == {"installed": True, "core": True}
    assert out["change_calls"] == 1 and out["changed_to_pluggable"]
    module = pathlib.Path(out["module_file"])
    assert module.name.startswith("_torch") and module.parent.name == "_lib"
    assert out["pluggable_args"] == [
        out["module_file"],
        "rmm_fences_torch_alloc",
        "rmm_fences_torch_free",
    ]
    assert out["alloc_ok"] and out["free_ok"] and out["entry_points_match"]
    # the record_stream hook is the address of rmm_fences_torch_record_stream in that .so
    assert out["record_stream_ok"] and out["record_stream_fn"]
    assert "already ran in this process" in out["second_install"]
    if scenario == "install-resource":
        assert (out["resource"], out["device"]) == ("CudaMemoryResource", 0)
    else:
        assert (out["resource"], out["device"]) == ("NoneType", None)
    assert set(out["stats"]) == TORCH_KEYS | RMM_FENCES_KEYS  # no pool: no reserved_bytes
    assert all(v == 0 for v in out["stats"].values())
    assert out["module_stats_same"]


def test_memory_stats_report_the_pool_the_resource_wraps_as_reserved_bytes(tmp_path):
    out = run_child("install-pool", tmp_path)
    assert out["resource"] == "SyncOnFreeResourceAdaptor"
    assert set(out["stats"]) == TORCH_KEYS | RMM_FENCES_KEYS | {"reserved_bytes.all.current"}
    assert out["stats"]["reserved_bytes.all.current"] == 0  # pool_bytes of an empty pool


# The MemPool route: mem_pool().

MEM_POOL_KEYS = {
    "reserved_bytes.all.current",
    "reserved_bytes.all.peak",
    "reserved_bytes.all.allocated",
    "reserved_bytes.all.freed",
    "segment.all.current",
    "segment.all.peak",
    "segment.all.allocated",
    "segment.all.freed",
    "num_ooms",
    "rejected_frees",
}


def test_mem_pool_without_torch_raises_import_error(rt, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match=r"mem_pool\(\) needs PyTorch"):
        rt.mem_pool()


@pytest.mark.parametrize("version", ["2.7.1", "2.5.1+cu124", "1.13.0"])
def test_mem_pool_before_torch_2_8_raises_naming_the_version(rt, monkeypatch, version):
    modules = fake_torch(version=version)
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    with pytest.raises(RuntimeError, match=r"needs torch >= 2\.8 \(installed: ") as e:
        rt.mem_pool()
    assert version in str(e.value)
    assert modules["torch"].pools == []
    from rmm_fences._lib import _torch

    assert not _torch.is_pool_installed()


@pytest.mark.parametrize("mr, match", [(42, "got int"), (object(), "got object")])
def test_mem_pool_with_a_bad_mr_raises_type_error_and_makes_no_pool(rt, torch, mr, match):
    with pytest.raises(TypeError, match=match):
        rt.mem_pool(mr, device=0)
    assert torch.pools == []


def test_mem_pool_stats_before_a_mem_pool_raise(rt):
    for call in (rt.mem_pool_stats, rt.reset_mem_pool_peak):
        with pytest.raises(RuntimeError, match=r"mem_pool\(\) sets it up"):
            call()
    from rmm_fences._lib import _torch

    with pytest.raises(RuntimeError, match="no rmm_fences torch pool core is installed"):
        _torch.pool_stats()


def _check_mem_pool(out):
    """What every successful mem_pool() scenario must show."""
    assert (out["before"], out["after"]) == (False, True)
    assert "mem_pool() sets it up" in out["stats_before"]
    assert out["change_calls"] == 0  # PyTorch's own allocator stays the global one
    assert out["pool_is_mem_pool"] and out["allocator_is_pluggables"]
    assert out["pluggable_args"] == [
        out["module_file"],
        "rmm_fences_torch_pool_alloc",
        "rmm_fences_torch_pool_free",
    ]
    assert out["alloc_ok"] and out["free_ok"] and out["entry_points_match"]
    assert out["record_stream_fn"] is None  # PyTorch's allocator handles record_stream
    assert out["again_same_allocator"]
    assert out["same_object"] is None  # the same resource again: another MemPool
    for key in ("other_resource", "other_spec"):
        assert "serves one resource per process, and an earlier call fixed it" in out[key]
    assert "cannot run after mem_pool() in the same process" in out["install"]
    assert "a pool core is already installed" in out["install_core"]
    assert not out["core_installed"]
    assert set(out["stats"]) == MEM_POOL_KEYS
    assert all(v == 0 for v in out["stats"].values())


@pytest.mark.parametrize("version", ["2.8.0", "2.11.0+cu130"])
def test_mem_pool_makes_a_mem_pool_over_the_pool_entry_points_of_the_torch_module(
    version, tmp_path
):
    out = run_child_args(["mem-pool-resource", version], tmp_path)
    _check_mem_pool(out)
    module = pathlib.Path(out["module_file"])
    assert module.name.startswith("_torch") and module.parent.name == "_lib"
    assert out["route"] == ["CudaMemoryResource", 0]
    assert "CudaMemoryResource on device 0" in out["other_resource"]
    assert "CudaMemoryResource on device 0" in out["other_device"]
    # first pool, mem_pool(), mem_pool(mr): each on the resource's device
    assert out["pools"] == 2 and out["devices"] == [0, 0, 0]


def test_mem_pool_over_rmms_resource_of_each_device(tmp_path):
    out = run_child_args(["mem-pool-none"], tmp_path)
    _check_mem_pool(out)
    assert out["route"] == ["NoneType", None]
    assert "mr=None (rmm's current resource of each device)" in out["other_resource"]
    assert out["other_device"] is None  # mr=None serves every device: a pool on device 1
    assert out["devices"] == [None, None, None, 1]  # None: torch's current device


def test_mem_pool_with_an_equal_spec_reuses_the_resource_built_first(tmp_path):
    out = run_child_args(["mem-pool-spec"], tmp_path)
    _check_mem_pool(out)
    assert out["route"][1] == 0
    assert "'cuda' (" in out["other_spec"] and "on device 0)" in out["other_spec"]
    assert out["pools_at_end"] == 3


def test_mem_pool_after_install_raises_and_makes_no_pool(tmp_path):
    out = run_child_args(["install-then-mem-pool"], tmp_path)
    assert "mem_pool() cannot run after install() in the same process" in out["mem_pool"]
    assert out["pools"] == 0 and not out["pool_core"]
