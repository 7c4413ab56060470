# SPDX-License-Identifier: Apache-2.0
import contextlib
import json
import os
import pathlib
import subprocess
import sys
import threading
import zlib

import pytest

from rmm_fences._cuda import device_count, no_device_reason

#: The host test harness (``rmm_fences_testing``, the policy cores on host memory) is built
#: beside its sources by ``make install`` (CMake option RMM_FENCES_BUILD_TESTS=ON); it is no
#: part of the installed package.
NATIVE_TESTS = pathlib.Path(__file__).resolve().parent / "native"
sys.path.insert(0, str(NATIVE_TESTS))
#: The benchmarks' library (``rmm_fences_bench``: timing loops, log replay and reader, stress),
#: whose native loops ``make install`` builds in place (CMake option
#: RMM_FENCES_BUILD_BENCHMARKS=ON); no part of the installed package either.
BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))


def _built(folder: pathlib.Path, pattern: str, what: str, users: str, option: str) -> str:
    """A line of the report's header: where the in-place module ``pattern`` was built, or how
    to build it."""
    built = sorted(folder.glob(pattern))
    if built:
        return f"{what}: {built[0]}"
    return f"{what}: NOT BUILT ({users}; `make install` builds it with -C cmake.define.{option}=ON)"


def pytest_report_header(config):
    return [
        _built(
            NATIVE_TESTS,
            "rmm_fences_testing*.so",
            "host test harness",
            "the *_core tests cannot import rmm_fences_testing",
            "RMM_FENCES_BUILD_TESTS",
        ),
        _built(
            BENCHMARKS / "rmm_fences_bench",
            "_loops*.so",
            "benchmarks' native loops",
            "the replay, stress and loop tests cannot import rmm_fences_bench",
            "RMM_FENCES_BUILD_BENCHMARKS",
        ),
    ]


#: Set to 1 on a GPU host: a ``gpu`` test that skips (no device found, or a skip at run time)
#: fails instead, so a run cannot pass with GPU tests quietly left out.
REQUIRE_GPU = "RMM_FENCES_REQUIRE_GPU"


#: Optional stacks a GPU host run may lack (comma-separated, e.g. ``cudf``): a gpu test that
#: skips with ``optional_stack_missing``'s reason for one of them stays skipped even with
#: REQUIRE_GPU=1, and says which stack in its reason.
ALLOW_MISSING = "RMM_FENCES_ALLOW_MISSING"


def _gpu_required() -> bool:
    return os.environ.get(REQUIRE_GPU, "") == "1"


def optional_stack_missing(stack: str, why: str) -> str:
    """The skip reason of a gpu test that needs the optional ``stack`` (not installed)."""
    return f"needs the optional stack {stack!r} (not installed: {why})"


def _allowed_skip(reason: str) -> bool:
    allowed = (s.strip() for s in os.environ.get(ALLOW_MISSING, "").split(","))
    return any(s and f"needs the optional stack {s!r} " in reason for s in allowed)


def _is_gpu_test(item) -> bool:
    # the marker, not item.keywords: keywords hold every parent's name (a checkout in a
    # directory named "gpu" would match)
    return item.get_closest_marker("gpu") is not None


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def pytest_collection_modifyitems(config, items):
    if device_count() > 0:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {no_device_reason()}")
    for item in items:
        if _is_gpu_test(item):
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if (
        report.skipped
        and not hasattr(report, "wasxfail")
        and _is_gpu_test(item)
        and _gpu_required()
        and not _allowed_skip(_skip_reason(report))
    ):
        report.outcome = "failed"
        report.longrepr = (
            f"gpu test skipped while {REQUIRE_GPU}=1 (a GPU host run may skip "
            f"no gpu test): {_skip_reason(report)}"
        )


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    # a GPU test module skipped as a whole (pytest.importorskip or pytest.skip at module level)
    if (
        report.skipped
        and isinstance(collector, pytest.Module)
        and collector.path.name.endswith("_gpu.py")
        and _gpu_required()
        and not _allowed_skip(_skip_reason(report))
    ):
        report.outcome = "failed"
        report.longrepr = (
            f"gpu test module {collector.path.name} skipped while "
            f"{REQUIRE_GPU}=1 (a GPU host run may skip no gpu test): "
            f"{_skip_reason(report)}"
        )


@pytest.fixture(scope="session")
def cupy():
    """CuPy, imported only by GPU tests."""
    import cupy

    return cupy


@pytest.fixture(scope="session")
def scenarios(cupy):
    """rmm_fences._scenarios (the free-while-in-flight race trial and its kernels)."""
    from rmm_fences import _scenarios

    return _scenarios


@pytest.fixture(scope="session")
def json_child():
    """``run(code, *args, timeout=300)``: runs Python ``code`` with ``args`` in a child process
    (a crash is the child's exit code, not the test run's) and returns ``(exit code, the last
    line of its stdout that starts with "{" as a dict or None, stdout, stderr)``."""

    def run(code, *args, timeout=300):
        res = subprocess.run(
            [sys.executable, "-P", "-c", code, *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        lines = [line for line in res.stdout.splitlines() if line.startswith("{")]
        return res.returncode, (json.loads(lines[-1]) if lines else None), res.stdout, res.stderr

    return run


def _capture_elsewhere(cupy, scenarios, started, release, result):
    """Another thread: holds a global-mode capture open on its own stream until `release`,
    then launches the graph and checks what it wrote."""
    cs = cupy.cuda.Stream(non_blocking=True)
    scratch = cupy.empty(1 << 16, dtype=cupy.uint32)
    errors = cupy.zeros(1, dtype=cupy.uint64)
    cs.synchronize()
    try:
        cs.begin_capture(mode=cupy.cuda.runtime.streamCaptureModeGlobal)
        try:
            scenarios.fill(scratch.data.ptr, scratch.size, 99, cs)
        finally:
            started.set()
            release.wait(60)
            graph = cs.end_capture()  # raises if anything invalidated the capture
        graph.launch(stream=cs)
        scenarios.check(scratch.data.ptr, scratch.size, 99, errors, cs)
        cs.synchronize()
        result["errors"] = int(errors.get()[0])
    except Exception as exc:  # reported by the test
        result["error"] = exc
        started.set()


@pytest.fixture
def capture_elsewhere(cupy, scenarios):
    """``with capture_elsewhere() as result:``: while the block runs, another thread holds a
    global-mode stream capture open (a fill kernel on that thread's own stream); on leaving
    it, the capture ends, the graph runs and checks what it wrote. After the block ``result``
    holds ``"errors"`` (words the graph wrote wrong) or ``"error"`` (the exception, e.g. the
    capture invalidated by a call made in the block)."""

    @contextlib.contextmanager
    def run():
        started, release, result = threading.Event(), threading.Event(), {}
        capturer = threading.Thread(
            target=_capture_elsewhere, args=(cupy, scenarios, started, release, result)
        )
        capturer.start()
        assert started.wait(60)
        try:
            assert "error" not in result, f"could not begin the capture: {result['error']!r}"
            yield result
        finally:
            release.set()
            capturer.join(60)

    return run


@pytest.fixture
def current_resource():
    """rmm's current device resource, restored after the test (GPU tests that change it)."""
    import rmm

    previous = rmm.mr.get_current_device_resource()
    yield previous
    rmm.mr.set_current_device_resource(previous)


@pytest.fixture
def rng(request):
    """A fresh generator per test, seeded from the test's id so failures reproduce."""
    import numpy as np

    seed = zlib.crc32(request.node.nodeid.encode())  # str hashes change between processes
    return np.random.default_rng(seed)


def dump_stacks(reason: str) -> None:
    """Print every Python thread's stack, and the kernel's view of every native thread of this
    process (name, wait channel, system call), to stderr: called by a test whose thread is
    stuck. (A debugger cannot attach to its own ancestor; tools/gpu_check.py attaches one from
    outside when the test run passes its time limit.)"""
    import faulthandler
    import sys
    from pathlib import Path

    print(f"\n=== {reason}: Python stacks", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(sys.stderr, all_threads=True)
    print("=== native threads: tid, name, wchan, syscall", file=sys.stderr, flush=True)
    for task in sorted(Path(f"/proc/{os.getpid()}/task").iterdir(), key=lambda p: int(p.name)):

        def read(name, task=task):
            try:
                return (task / name).read_text().strip().split("\n")[0][:80]
            except OSError as exc:
                return f"<{exc.strerror}>"

        print(task.name, read("comm"), read("wchan"), read("syscall"), file=sys.stderr)
    sys.stderr.flush()
