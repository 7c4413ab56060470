# SPDX-License-Identifier: Apache-2.0
"""The shared fixtures, a pytest plugin (tests/conftest.py registers it)."""

import contextlib
import threading
import zlib

import pytest

from .children import run_json


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


@pytest.fixture(scope="module")
def reduce_mod(cupy):
    """rmm_fences.reduce (the CUB temp-storage loop), imported only by GPU tests."""
    from rmm_fences import reduce

    return reduce


@pytest.fixture(scope="session")
def json_child():
    """``run(code, *args, timeout=300, env=None)``: runs Python ``code`` with ``args`` in a
    child process (a crash is the child's exit code, not the test run's) and returns ``(exit
    code, the last line of its stdout that starts with "{" as a dict or None, stdout, stderr)``
    (helpers.children.run_json)."""
    return run_json


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


def seed_of(nodeid: str) -> int:
    """The ``rng`` seed of the test ``nodeid``: a hash of the id the test has in the flat
    ``tests/`` folder (its file's name and its name, not its subject folder), so that a test
    keeps its data when its file moves. CRC-32: str hashes change between processes."""
    path, _, name = nodeid.partition("::")
    return zlib.crc32(f"tests/{path.rsplit('/', 1)[-1]}::{name}".encode())


@pytest.fixture
def rng(request):
    """A fresh generator per test, seeded from the test's id so failures reproduce."""
    import numpy as np

    return np.random.default_rng(seed_of(request.node.nodeid))
