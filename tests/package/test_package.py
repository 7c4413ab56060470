# SPDX-License-Identifier: Apache-2.0
"""Import, packaging and argument validation: no GPU needed."""

import importlib.metadata
import pathlib
import re
import subprocess
import sys

import pytest
import rmm

import rmm_fences
from rmm_fences import (
    HazardTrackingResourceAdaptor,
    StreamOrderedPoolMemoryResource,
    SyncOnFreeResourceAdaptor,
)
from rmm_fences._sizes import parse_bytes
from rmm_fences.unsafe import NaiveCachingMemoryResource

from helpers.paths import ROOT, VMM_CHILD


def test_public_names():
    assert rmm_fences.__all__ == [
        "AllocationRecord",
        "HazardError",
        "HazardRecord",
        "HazardTrackingResourceAdaptor",
        "HazardWarning",
        "SpecError",
        "StreamOrderedPoolMemoryResource",
        "SyncOnFreeResourceAdaptor",
        "VmmPoolMemoryResource",
        "__version__",
        "compose",
        "get_cmake_dir",
        "get_include",
        "parse_spec",
        "use_resource",
    ]
    from rmm_fences.specs import SpecError

    assert rmm_fences.SpecError is SpecError  # docs/dask.md names it; a ValueError
    assert issubclass(SpecError, ValueError)
    assert issubclass(HazardTrackingResourceAdaptor, rmm.mr.UpstreamResourceAdaptor)
    assert issubclass(StreamOrderedPoolMemoryResource, rmm.mr.UpstreamResourceAdaptor)
    assert issubclass(SyncOnFreeResourceAdaptor, rmm.mr.UpstreamResourceAdaptor)
    assert issubclass(NaiveCachingMemoryResource, rmm.mr.UpstreamResourceAdaptor)
    # no upstream: its memory is the device's pages, as CudaAsyncMemoryResource's pool's
    assert issubclass(rmm_fences.VmmPoolMemoryResource, rmm.mr.DeviceMemoryResource)
    assert not issubclass(rmm_fences.VmmPoolMemoryResource, rmm.mr.UpstreamResourceAdaptor)


def test_typed_stubs_are_installed():
    lib = pathlib.Path(rmm_fences.__file__).parent / "_lib"
    stub = (lib / "memory_resource.pyi").read_text()
    for name in (
        "class SyncOnFreeResourceAdaptor",
        "class NaiveCachingMemoryResource",
        "class StreamOrderedPoolMemoryResource",
        "class HazardTrackingResourceAdaptor",
        "class UnmappingVmmMemoryResource",
    ):
        assert name in stub
    torch_stub = (lib / "_torch.pyi").read_text()
    for name in ("def install_core", "def stats", "def reset_peak", "def entry_points"):
        assert name in torch_stub
    assert (pathlib.Path(rmm_fences.__file__).parent / "py.typed").exists()


ADAPTORS = [
    SyncOnFreeResourceAdaptor,
    NaiveCachingMemoryResource,
    StreamOrderedPoolMemoryResource,
    HazardTrackingResourceAdaptor,
]


@pytest.mark.parametrize("cls", ADAPTORS, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    "bad",
    [None, "cuda", 3, object(), rmm.mr.CudaMemoryResource],  # the last: the class, not one
    ids=["None", "str", "int", "object", "class"],
)
@pytest.mark.parametrize("keyword", [False, True], ids=["positional", "keyword"])
def test_a_bad_upstream_is_refused_as_rmms_adaptors_refuse_it(cls, bad, keyword):
    """Each adaptor is one cdef class over rmm's ``UpstreamResourceAdaptor``, whose
    ``__cinit__`` checks ``upstream_mr`` first: the same exception as rmm's own adaptors, a
    TypeError naming ``upstream_mr`` for anything but None (None: below)."""

    def refusal(make):
        with pytest.raises(Exception) as info:
            make(upstream_mr=bad) if keyword else make(bad)
        return type(info.value), str(info.value)

    ours = refusal(cls)
    assert ours == refusal(rmm.mr.StatisticsResourceAdaptor)
    if bad is not None:
        assert ours[0] is TypeError and "'upstream_mr' has incorrect type" in ours[1]


def test_rmm_refuses_a_none_upstream_with_a_bare_exception():
    """What the adaptors inherit for ``upstream_mr=None``: rmm's ``UpstreamResourceAdaptor``
    runs its ``__cinit__`` before a subclass's and raises a bare ``Exception``. Once this fails
    (rmm raises TypeError for None), the adaptors raise that too, with no change here."""
    with pytest.raises(Exception, match="Argument `upstream_mr` must not be None") as info:
        rmm.mr.StatisticsResourceAdaptor(None)
    assert type(info.value) is Exception
    with pytest.raises(TypeError, match="Argument 'upstream_mr' has incorrect type"):
        rmm.mr.StatisticsResourceAdaptor(3)


@pytest.mark.parametrize("mode", ["Deferred", "async", "", None, 2])
def test_unknown_mode_names_the_valid_ones(mode):
    with pytest.raises(ValueError, match="mode must be one of 'device', 'stream', 'deferred'"):
        SyncOnFreeResourceAdaptor(rmm.mr.CudaMemoryResource(), mode=mode)


@pytest.mark.parametrize("cap", [-1, "-5MiB", "lots", "1 parsec"])
def test_bad_max_pending_bytes(cap):
    with pytest.raises(ValueError, match="max_pending_bytes"):
        SyncOnFreeResourceAdaptor(rmm.mr.CudaMemoryResource(), max_pending_bytes=cap)


def test_max_pending_bytes_type():
    with pytest.raises(TypeError, match="max_pending_bytes must be an int"):
        SyncOnFreeResourceAdaptor(rmm.mr.CudaMemoryResource(), max_pending_bytes=1.5)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"max_batch_frees": 0}, ValueError, "max_batch_frees must be at least 1, got 0"),
        ({"max_batch_frees": -4}, ValueError, "max_batch_frees must be at least 1, got -4"),
        ({"max_batch_frees": 1.5}, TypeError, "max_batch_frees must be an int, got float"),
        ({"max_batch_frees": "16"}, TypeError, "max_batch_frees must be an int, got str"),
        ({"max_batch_frees": True}, TypeError, "max_batch_frees must be an int, got bool"),
        ({"max_batch_frees": None}, TypeError, "max_batch_frees must be an int, got NoneType"),
        ({"max_batch_bytes": 0}, ValueError, "max_batch_bytes must be positive or None"),
        ({"max_batch_bytes": "0MiB"}, ValueError, "max_batch_bytes must be positive or None"),
        ({"max_batch_bytes": -1}, ValueError, "max_batch_bytes must be non-negative"),
        ({"max_batch_bytes": "lots"}, ValueError, "max_batch_bytes must be a size"),
        ({"max_batch_bytes": 1.5}, TypeError, "max_batch_bytes must be an int or a size string"),
    ],
)
def test_bad_batch_limits_name_the_argument(kwargs, error, message):
    with pytest.raises(error, match=message):
        SyncOnFreeResourceAdaptor(rmm.mr.CudaMemoryResource(), **kwargs)


def test_batch_limit_defaults_are_the_cores():
    """The Python defaults are the C++ constants the host harness (the same core) uses, and the
    numbers the stub and the docs give."""
    import inspect

    from rmm_fences_testing import HostSyncOnFree

    params = inspect.signature(SyncOnFreeResourceAdaptor).parameters
    core = HostSyncOnFree()
    assert params["max_batch_frees"].default == core.max_batch_frees == 16
    assert params["max_batch_bytes"].default == core.max_batch_bytes == 64 << 20


@pytest.mark.parametrize(
    "text, nbytes",
    [
        (4096, 4096),
        ("4096", 4096),
        ("1KiB", 1024),
        ("1 MiB", 2**20),
        ("2GB", 2 * 10**9),
        ("1.5GiB", 3 * 2**29),
        ("0", 0),
        ("8b", 8),
    ],
)
def test_parse_bytes(text, nbytes):
    assert parse_bytes(text, "size") == nbytes


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"initial_pool_size": -1}, "initial_pool_size"),
        ({"initial_pool_size": "big"}, "initial_pool_size"),
        ({"maximum_pool_size": "-1GiB"}, "maximum_pool_size"),
        ({"maximum_pool_size": "lots"}, "maximum_pool_size"),
        ({"initial_pool_size": "2GiB", "maximum_pool_size": "1GiB"}, "maximum_pool_size"),
        ({"maximum_growth_size": 0}, "maximum_growth_size"),
        ({"maximum_growth_size": "-2MiB"}, "maximum_growth_size"),
        ({"maximum_growth_size": "some"}, "maximum_growth_size"),
    ],
)
def test_pool_bad_sizes_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), **kwargs)


#: Names of what only the benchmarks and the tests use (timing loops, log replay and its reader,
#: the host test harness, the tests' child processes): no installed file may carry one.
NOT_SHIPPED = re.compile(r"bench|replay|alloc_log|testing|conftest|_child\b|(^|/)test_")
CODE = (".py", ".pyx", ".pxd", ".pyi", ".hpp", ".cpp", ".so")


def _installed_files() -> set[str]:
    """The files of the rmm_fences package, relative to it: those the distribution's RECORD
    lists (what the wheel installed) and those its directory holds now."""
    pkg = pathlib.Path(rmm_fences.__file__).parent
    record = importlib.metadata.distribution("rmm-fences-cu13").files or []
    listed = {
        f.as_posix().removeprefix("rmm_fences/") for f in record if f.parts[0] == "rmm_fences"
    }
    return listed | {p.relative_to(pkg).as_posix() for p in pkg.rglob("*") if p.is_file()}


def _module_names(folder: pathlib.Path) -> set[str]:
    """The module, package and header names of the code under ``folder`` in the checkout (a
    file's name up to its first dot; a package's folder name for its ``__init__``)."""
    code = [p for p in folder.rglob("*") if p.name.endswith(CODE)]
    return {p.parent.name if p.stem == "__init__" else p.name.split(".")[0] for p in code}


def test_the_installed_package_holds_no_test_or_benchmark_source():
    files = _installed_files()
    assert "__init__.py" in files and "_lib/memory_resource.pyi" in files  # the listing works
    assert sorted(f for f in files if NOT_SHIPPED.search(f)) == []
    # nor any module or header of benchmarks/ or tests/, whatever it is named
    theirs = _module_names(ROOT / "benchmarks") | _module_names(ROOT / "tests")
    assert "rmm_fences_bench" in theirs and "rmm_fences_testing" in theirs
    assert sorted(f for f in files if f.rsplit("/", 1)[-1].split(".")[0] in theirs) == []
    headers = sorted(f for f in files if f.endswith(".hpp"))
    assert headers and all(f.startswith("_lib/include/rmm_fences/") for f in headers)


def test_the_wheel_installs_one_package():
    """rmm_fences alone: the benchmarks (benchmarks/) and the host test harness (tests/native)
    are built in place for development, never installed."""
    record = importlib.metadata.distribution("rmm-fences-cu13").files or []
    tops = {f.parts[0] for f in record if f.parts[0] != ".." and ".dist-info" not in f.parts[0]}
    assert tops == {"rmm_fences"}


def test_the_vmm_child_runs_from_the_tests_directory():
    res = subprocess.run(
        [sys.executable, "-P", str(VMM_CHILD)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert "tests/helpers/vmm_child.py crash" in res.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["-c", "import rmm_fences._lib.memory_resource; print(rmm_fences.__file__)"],
        ["-m", "rmm_fences", "--version"],
    ],
    ids=["import", "python -m rmm_fences"],
)
def test_the_source_tree_does_not_shadow_the_installed_package(command):
    """From the repository root (on sys.path, as ``python -c`` and ``-m`` put it) the installed
    package loads, with its compiled extensions: the sources live under src/."""
    res = subprocess.run(
        [sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert not res.stdout.startswith(str(ROOT / "rmm_fences")), res.stdout


def _run_python(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_import_loads_no_optional_dependency():
    res = _run_python(
        "import sys, rmm_fences, rmm_fences.specs\n"
        "print(sorted(m for m in ('cupy', 'cuda.compute', 'torch', 'distributed', "
        "'matplotlib') if m in sys.modules))"
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "module, blocked, extra",
    [
        ("rmm_fences.allocators.cupy", "cupy", "cupy"),
        ("rmm_fences._scenarios", "cupy", "cupy"),
        ("rmm_fences.dask", "distributed", "dask"),
    ],
)
def test_a_missing_optional_dependency_names_its_extra(module, blocked, extra):
    res = _run_python(
        f"import sys; sys.modules[{blocked!r}] = None\n"
        f"try:\n    import {module}\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    assert res.returncode == 0, res.stderr
    assert f"pip install 'rmm-fences-cu13[{extra}]'" in res.stdout, res.stdout


def test_the_reduce_without_cuda_cccl_names_its_extra(monkeypatch):
    from rmm_fences._optional import require

    monkeypatch.setitem(sys.modules, "cuda.compute", None)
    with pytest.raises(ImportError, match=r"needs cuda-cccl .*rmm-fences-cu13\[reduce\]"):
        require("cuda.compute", "rmm_fences.reduce")


def test_the_spec_module_and_the_compose_function_do_not_clash():
    """``rmm_fences.compose`` is the function; the spec language is the module
    ``rmm_fences.specs`` (its table of resources included), whichever is imported first."""
    res = _run_python(
        "import rmm_fences.specs, rmm_fences\n"
        "assert callable(rmm_fences.compose) and rmm_fences.compose is rmm_fences.specs.compose\n"
        "print(sorted(rmm_fences.specs.RESOURCES)[:1], rmm_fences.SpecError is "
        "rmm_fences.specs.SpecError)"
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith("True"), res.stdout
