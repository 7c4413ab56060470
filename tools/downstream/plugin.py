# SPDX-License-Identifier: Apache-2.0
"""pytest plugin that runs another project's test suite with an rmm_fences chain installed.

Loaded with ``-p plugin`` (``tools/downstream`` on PYTHONPATH) by ``tools/downstream/run.py``.
Environment:

``RMM_FENCES_DS_CHAIN``
    A spec of ``rmm_fences.compose``; empty: the suite runs as shipped (the baseline).
``RMM_FENCES_DS_CUPY``
    How CuPy gets its memory: ``rmm`` (rmm's ``rmm_cupy_allocator`` over the chain installed as
    the current device resource), ``rmm_fences`` (``CupyAllocator`` over the chain), or empty
    (CuPy's own pool; rmm's current device resource is still the chain).
``RMM_FENCES_DS_STATE``
    A file this plugin appends JSON lines to: the test about to run (so the driver can name the
    test a crashed process died in), exceptions raised in ``__del__`` and the like (pytest's
    unraisable-exception warnings), each test's outcome (so a process that crashed still
    reports the tests it finished), and at the end the tracker's hazards.
``RMM_FENCES_DS_RAPIDS``
    ``1`` for cuDF's and cudf-polars' suites: before the suite's ``conftest.py`` is imported
    (which imports cuDF), numpy gets back ``row_stack`` where it lacks it (numba-cuda <= 0.30.4
    registers it, so ``import cudf`` fails on numpy 2.5 without it) and the modules that warn
    when imported on numpy 2.5 (``WARN_AT_IMPORT``: numba-cuda's, cuDF's test helpers) are
    imported once with the warning ignored (cuDF's suite makes warnings errors, so its conftest
    and the files that import the helpers would fail to import). Under a chain, cudf-polars' own
    memory resources are the chain: its in-memory engine builds the resource that
    ``CUDF_POLARS__MEMORY_RESOURCE_CONFIG__QUALNAME`` names (``plugin.chain_resource``) around
    every query, and its streaming engine the one of ``MemoryResourceConfig.default()`` (patched
    to name the same). A test that passes its own ``memory_resource`` keeps it. A process such a
    test spawns inherits the variable and builds its own chain from ``RMM_FENCES_DS_CHAIN``
    (its tracker's hazards are not reported).
``RMM_FENCES_DS_SHARD``
    ``I/N``: run only the I-th of N shards of the collected tests (every N-th test from the
    I-th, after every other hook's selection): the harness splits a long file into processes
    that a deadline stops one at a time.
``RMM_FENCES_DS_SAMPLE``
    ``K/N``: run only the first K of every N collected tests (before the shard's selection):
    the harness's ``--sample``, the same tests under every chain.
``RMM_FENCES_DS_FAKE``
    ``1``: build and install nothing (no chain, no CuPy allocator, no rmm or cupy import), only
    log as above; the harness's CPU tests (``tests/downstream/test_downstream_harness.py``) run
    a fake suite this way, which may read ``RMM_FENCES_DS_CHAIN`` itself to act differently
    under a chain.

The chain is built once per process and installed before every test, because rmm's own tests
reset the current device resource in their fixtures.
"""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

_chain = None
_state = None


def _emit(record):
    if _state is not None:
        _state.write(json.dumps(record) + "\n")
        _state.flush()
        os.fsync(_state.fileno())


def _install():
    import rmm

    rmm.mr.set_current_device_resource(_chain)


def pytest_configure(config):
    global _chain, _state
    path = os.environ.get("RMM_FENCES_DS_STATE")
    if path:
        _state = open(path, "a", encoding="utf-8")
    spec = os.environ.get("RMM_FENCES_DS_CHAIN", "")
    how = os.environ.get("RMM_FENCES_DS_CUPY", "")
    fake = os.environ.get("RMM_FENCES_DS_FAKE", "") == "1"
    _emit({"event": "configure", "chain": spec, "cupy": how, "fake": fake, "pid": os.getpid()})
    if fake:
        return
    rapids = os.environ.get("RMM_FENCES_DS_RAPIDS", "") == "1"
    if spec:
        _chain = _build(spec)
        _install()
        if rapids:
            _route_cudf_polars()
    if how:
        import cupy

        if how == "rmm":
            from rmm.allocators.cupy import rmm_cupy_allocator

            cupy.cuda.set_allocator(rmm_cupy_allocator)
        elif how == "rmm_fences":
            from rmm_fences.allocators.cupy import CupyAllocator

            cupy.cuda.set_allocator(CupyAllocator(_chain))
        else:
            raise pytest.UsageError(
                f"RMM_FENCES_DS_CUPY must be rmm, rmm_fences or empty, got {how!r}"
            )


def _build(spec):
    from rmm_fences.specs import compose

    return compose(spec)


def chain_resource():
    """The chain, for cudf-polars' ``MemoryResourceConfig(qualname="plugin.chain_resource")``.

    In a process a test spawned (the variable naming this function is inherited, this plugin's
    configure never ran there) the chain is built from ``RMM_FENCES_DS_CHAIN`` on first use;
    returning None there handed cudf-polars no resource and killed the process."""
    global _chain
    if _chain is None:
        spec = os.environ.get("RMM_FENCES_DS_CHAIN", "")
        if not spec:
            raise RuntimeError(
                "plugin.chain_resource: RMM_FENCES_DS_CHAIN is empty, so there is no chain "
                "to hand to cudf-polars"
            )
        _chain = _build(spec)
    return _chain


def pytest_load_initial_conftests(early_config, parser, args):
    """Before the suite's conftest.py is imported (cuDF's imports cuDF): see
    RMM_FENCES_DS_RAPIDS. It runs under RMM_FENCES_DS_FAKE too: it imports rmm and cupy only
    where cuDF is installed, through cuDF's test helpers, as the suite's own conftest would."""
    if os.environ.get("RMM_FENCES_DS_RAPIDS", "") == "1":
        _numpy_row_stack()


#: Modules that warn when imported on numpy 2.5 (a datetime64 or timedelta64 of the 'generic'
#: unit), which cuDF's suite (filterwarnings = error) turns into an error in every file that
#: imports them: numba-cuda's (<= 0.30.4; cuDF's conftest imports it through cuDF) and cuDF's
#: test helpers (26.10; imported by 21 of the 51 files of the default selection).
WARN_AT_IMPORT = ("numba.cuda.np.npdatetime_helpers", "cudf.testing._utils")


def _numpy_row_stack():
    import importlib
    import warnings

    import numpy

    if not hasattr(numpy, "row_stack"):
        numpy.row_stack = numpy.vstack
    # Each module of WARN_AT_IMPORT imported once here, with the warning ignored, baseline and
    # chains alike; later imports find it imported and warn no more.
    for name in WARN_AT_IMPORT:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            try:
                importlib.import_module(name)
            except Exception:  # not installed (cudf-polars alone) or no CUDA: nothing to do
                pass


def _route_cudf_polars():
    """Makes cudf-polars' default memory resources the chain (see RMM_FENCES_DS_RAPIDS)."""
    os.environ["CUDF_POLARS__MEMORY_RESOURCE_CONFIG__QUALNAME"] = "plugin.chain_resource"
    try:
        from cudf_polars.utils.config import MemoryResourceConfig
    except ImportError:  # cuDF's suite without cudf-polars installed
        return
    MemoryResourceConfig.default = classmethod(
        lambda cls: cls(qualname="plugin.chain_resource", options=None)
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    kept = _select(items, "RMM_FENCES_DS_SAMPLE", lambda k, i, n: k % n < i)
    kept = _select(kept, "RMM_FENCES_DS_SHARD", lambda k, i, n: k % n == i - 1)
    if len(kept) < len(items):
        chosen = set(map(id, kept))
        config.hook.pytest_deselected(items=[item for item in items if id(item) not in chosen])
        items[:] = kept


def _select(items, variable, keep):
    """The items whose position ``k`` passes ``keep(k, I, N)`` for ``variable``'s I/N; all of
    them where it is unset."""
    value = os.environ.get(variable, "")
    if not value:
        return list(items)
    m = re.fullmatch(r"(\d+)/(\d+)", value)
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise pytest.UsageError(f"{variable} must be I/N with 1 <= I <= N, got {value!r}")
    index, count = int(m[1]), int(m[2])
    return [item for k, item in enumerate(items) if keep(k, index, count)]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid, location):
    _emit({"event": "start", "test": nodeid})


def pytest_runtest_logreport(report):
    outcome = _outcome(report)
    if outcome is None:
        return
    record = {"event": "result", "test": report.nodeid, "when": report.when, "outcome": outcome}
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        record["message"] = (crash.message if crash is not None else str(report.longrepr))[:500]
    if _state is not None:  # flushed, not synced: losing it only loses detail, never the test
        _state.write(json.dumps(record) + "\n")
        _state.flush()


def _outcome(report):
    """The phase's outcome as the harness counts it (an error in setup or teardown is an error),
    or None for a setup or teardown that passed."""
    xfail = hasattr(report, "wasxfail")
    if report.when == "call":
        if report.skipped:
            return "xfailed" if xfail else "skipped"
        return "failed" if report.failed else ("xpassed" if xfail else "passed")
    if report.failed:
        return "error"
    if report.skipped:
        return "xfailed" if xfail else "skipped"
    return None


@pytest.fixture(autouse=True)
def _rmm_fences_chain():
    if _chain is not None:
        _install()
    yield


def pytest_warning_recorded(warning_message, when, nodeid, location):
    cat = warning_message.category.__name__
    if "Unraisable" in cat or "Thread" in cat:
        _emit(
            {
                "event": "unraisable",
                "test": nodeid,
                "when": when,
                "message": str(warning_message.message)[:2000],
            }
        )


def pytest_sessionfinish(session, exitstatus):
    if _chain is None:
        return
    hazards = _hazards(_chain)
    if hazards is not None:
        _emit({"event": "hazards", **hazards})


def _hazards(mr):
    """The tracker's report when the chain holds one (outermost first), else None."""
    from rmm_fences import HazardTrackingResourceAdaptor

    while mr is not None:
        if isinstance(mr, HazardTrackingResourceAdaptor):
            try:
                mr.check()  # settle the pending checks
            except Exception as exc:  # on_hazard=raise: the hazards are listed below
                _emit(
                    {
                        "event": "unraisable",
                        "test": "<sessionfinish>",
                        "when": "check",
                        "message": repr(exc)[:2000],
                    }
                )
            return {"stats": dict(mr.stats), "hazards": [str(h) for h in mr.hazards][:50]}
        mr = getattr(mr, "upstream_mr", None)
    return None


if __name__ == "__main__":
    sys.exit("load with pytest -p plugin")
