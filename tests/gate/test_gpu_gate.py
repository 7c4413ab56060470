# SPDX-License-Identifier: Apache-2.0
"""The GPU gate (tests/helpers/gate.py, registered by tests/conftest.py): under
RMM_FENCES_REQUIRE_GPU=1 a ``gpu`` test that skips fails.

Runs the gate as the conftest of small generated test files (pytester, each run in a
subprocess: an in-process run drops the modules it imported from ``sys.modules`` afterwards,
which breaks later imports such as ``dask.array``), with the device probe set by
``GATE_DEVICES`` where the case needs it, so it runs the same on a machine with or without a
GPU.
"""

import pytest

from helpers.paths import HELPERS

pytest_plugins = ["pytester"]

# The device probe the gate imports, set from GATE_DEVICES before it does.
PROBE = """
import os
import rmm_fences._cuda as _cuda
if "GATE_DEVICES" in os.environ:
    _cuda.device_count = lambda: int(os.environ["GATE_DEVICES"])
    _cuda.no_device_reason = lambda: "no CUDA device found"
"""
CONFTEST = PROBE + (HELPERS / "gate.py").read_text()
INI = """
[pytest]
markers =
    gpu: needs a CUDA device
"""

GPU_TESTS = """
import pytest

@pytest.mark.gpu
def test_on_the_gpu():
    pass

@pytest.mark.gpu
def test_skips_at_run_time():
    pytest.skip("compute-sanitizer is not installed")

def test_on_the_cpu():
    pass

def test_cpu_skip():
    pytest.skip("a cpu test may skip")

@pytest.mark.gpu
@pytest.mark.xfail(reason="expected", strict=True)
def test_gpu_xfail():
    assert False
"""


@pytest.fixture
def gate(pytester, monkeypatch, request):
    # the gate under test is the one this run has (tests/conftest.py registers it)
    assert request.config.pluginmanager.has_plugin("helpers.gate")
    pytester.makeconftest(CONFTEST)
    pytester.makeini(INI)
    monkeypatch.delenv("RMM_FENCES_REQUIRE_GPU", raising=False)
    return pytester


@pytest.fixture
def no_device(monkeypatch):
    monkeypatch.setenv("GATE_DEVICES", "0")


def test_without_the_variable_gpu_tests_skip_where_no_device_is_found(gate, no_device):
    gate.makepyfile(test_sample_gpu=GPU_TESTS)
    result = gate.runpytest_subprocess("-rs")
    result.assert_outcomes(passed=1, skipped=4)  # the xfail test is skipped before it runs
    result.stdout.fnmatch_lines(["*needs a CUDA GPU: no CUDA device found*"])


def test_under_the_variable_a_gpu_test_without_a_device_fails(gate, no_device, monkeypatch):
    monkeypatch.setenv("RMM_FENCES_REQUIRE_GPU", "1")
    gate.makepyfile(test_sample_gpu=GPU_TESTS)
    result = gate.runpytest_subprocess("-rA")
    # every gpu test fails in setup (an error); cpu tests pass or skip as before
    result.assert_outcomes(passed=1, skipped=1, errors=3)
    result.stdout.fnmatch_lines(
        ["*gpu test skipped while RMM_FENCES_REQUIRE_GPU=1*needs a CUDA GPU: no CUDA device*"]
    )
    assert result.ret != 0


def test_under_the_variable_a_run_time_skip_of_a_gpu_test_fails(gate, monkeypatch):
    monkeypatch.setenv("GATE_DEVICES", "1")  # as on the GPU host
    monkeypatch.setenv("RMM_FENCES_REQUIRE_GPU", "1")
    gate.makepyfile(test_sample_gpu=GPU_TESTS)
    result = gate.runpytest_subprocess("-rA")
    result.assert_outcomes(passed=2, failed=1, skipped=1, xfailed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_skips_at_run_time*",
            "*gpu test skipped while RMM_FENCES_REQUIRE_GPU=1*compute-sanitizer is not installed*",
        ]
    )
    assert result.ret != 0


def test_run_time_skip_of_a_gpu_test_is_a_skip_without_the_variable(gate, monkeypatch):
    monkeypatch.setenv("GATE_DEVICES", "1")
    gate.makepyfile(test_sample_gpu=GPU_TESTS)
    result = gate.runpytest_subprocess()
    result.assert_outcomes(passed=2, skipped=2, xfailed=1)
    assert result.ret == 0


def test_under_the_variable_a_skipped_gpu_module_fails(gate, monkeypatch):
    monkeypatch.setenv("GATE_DEVICES", "1")
    monkeypatch.setenv("RMM_FENCES_REQUIRE_GPU", "1")
    gate.makepyfile(
        test_other_gpu="""
        import pytest
        pytest.importorskip("a_module_that_is_not_installed")
        pytestmark = pytest.mark.gpu

        def test_never_collected():
            pass
    """,
        # a GPU module by its marker alone, whatever its name
        test_subject="""
        import pytest
        pytest.skip("cuDF is not installed", allow_module_level=True)

        @pytest.mark.gpu
        def test_never_collected():
            pass
    """,
        # a CPU module skipped as a whole stays a skip (a string naming the marker is no mark)
        test_cpu_skipped="""
        import pytest
        pytest.importorskip("another_module_that_is_not_installed")
        MARK = "pytest.mark.gpu"

        def test_never_collected():
            pass
    """,
        test_cpu="def test_cpu():\n    pass\n",
    )
    result = gate.runpytest_subprocess()
    result.stdout.fnmatch_lines(
        [
            "*test_other_gpu.py skipped while RMM_FENCES_REQUIRE_GPU=1"
            "*a_module_that_is_not_installed*"
        ]
    )
    result.stdout.fnmatch_lines(
        ["*test_subject.py skipped while RMM_FENCES_REQUIRE_GPU=1*cuDF is not installed*"]
    )
    result.stdout.no_fnmatch_line("*test_cpu_skipped.py skipped while*")
    result.assert_outcomes(skipped=1, errors=2)  # collection errors: no test ran
    assert result.ret != 0
    monkeypatch.delenv("RMM_FENCES_REQUIRE_GPU")
    result = gate.runpytest_subprocess()
    result.assert_outcomes(passed=1, skipped=3)
    assert result.ret == 0


OPTIONAL_STACK_TESTS = """
import pytest
from conftest import optional_stack_missing

@pytest.mark.gpu
def test_needs_cudf():
    pytest.skip(optional_stack_missing("cudf", "No module named 'cudf'"))

@pytest.mark.gpu
def test_needs_polars():
    pytest.skip(optional_stack_missing("polars", "No module named 'polars'"))
"""


def test_a_skip_for_an_optional_stack_the_host_may_lack_stays_a_skip(gate, monkeypatch):
    monkeypatch.setenv("GATE_DEVICES", "1")
    monkeypatch.setenv("RMM_FENCES_REQUIRE_GPU", "1")
    monkeypatch.setenv("RMM_FENCES_ALLOW_MISSING", "cudf")
    gate.makepyfile(test_sample_gpu=OPTIONAL_STACK_TESTS)
    result = gate.runpytest_subprocess("-rA")
    # cudf may be missing; polars was not named: its skip fails the run
    result.assert_outcomes(skipped=1, failed=1)
    result.stdout.fnmatch_lines(["*needs the optional stack 'cudf' (not installed*"])
    result.stdout.fnmatch_lines(["*RMM_FENCES_REQUIRE_GPU=1*needs the optional stack 'polars'*"])
