# SPDX-License-Identifier: Apache-2.0
"""The test suite's root conftest: the GPU gate and the shared fixtures come from the helpers
package (tests/helpers), registered here as plugins; the report's header says where the
in-place native modules were built. What the tests import from the checkout (helpers, the host
test harness, the benchmarks' library) pytest puts on sys.path: pyproject.toml's
``[tool.pytest.ini_options] pythonpath``."""

import pytest

# The helpers' asserts (reference checks) report their operands as a test's asserts do.
pytest.register_assert_rewrite("helpers")

from helpers.paths import BENCHMARKS, NATIVE_TESTS  # noqa: E402

pytest_plugins = ("helpers.gate", "helpers.fixtures")


def _built(folder, pattern: str, what: str, users: str, option: str) -> str:
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
