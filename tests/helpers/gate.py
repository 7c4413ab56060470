# SPDX-License-Identifier: Apache-2.0
"""The GPU gate, a pytest plugin (tests/conftest.py registers it): a test marked ``gpu`` skips,
with the reason, where no CUDA device is found; under RMM_FENCES_REQUIRE_GPU=1 (the GPU host's
run) a ``gpu`` test that skips, or a module holding ``gpu`` tests that is skipped as a whole,
fails instead. A test is a GPU test by its marker alone, whatever its file is named.

Self-contained on purpose (pytest, the standard library and ``rmm_fences._cuda`` only):
tests/gate/test_gpu_gate.py runs this file's text as the conftest of generated test files.
"""

import ast
import os

import pytest

from rmm_fences._cuda import device_count, no_device_reason

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


def _declares_gpu_tests(path) -> bool:
    """Whether the module's code applies the ``gpu`` marker (``pytestmark = pytest.mark.gpu``,
    ``@pytest.mark.gpu``, ...): how a module skipped as a whole, before pytest read its marks,
    is known to hold GPU tests. Read from its syntax tree: a docstring or a string that only
    mentions the marker does not count."""
    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return False
    return any(
        isinstance(node, ast.Attribute)
        and node.attr == "gpu"
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
        for node in ast.walk(tree)
    )


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


def _forbidden_skip(report) -> bool:
    """A skip that RMM_FENCES_REQUIRE_GPU=1 makes a failure, once the caller knows it is a GPU
    test's or a GPU module's: any skip but one for an optional stack the host may lack."""
    return report.skipped and _gpu_required() and not _allowed_skip(_skip_reason(report))


def _fail(report, what: str) -> None:
    reason = _skip_reason(report)
    report.outcome = "failed"
    report.longrepr = (
        f"{what} skipped while {REQUIRE_GPU}=1 (a GPU host run may skip no gpu test): {reason}"
    )


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if _forbidden_skip(report) and not hasattr(report, "wasxfail") and _is_gpu_test(item):
        _fail(report, "gpu test")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    # a GPU test module skipped as a whole (pytest.importorskip or pytest.skip at module level)
    if (
        _forbidden_skip(report)
        and isinstance(collector, pytest.Module)
        and _declares_gpu_tests(collector.path)
    ):
        _fail(report, f"gpu test module {collector.path.name}")
