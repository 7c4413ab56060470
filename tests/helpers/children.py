# SPDX-License-Identifier: Apache-2.0
"""Child processes of the tests: the environment that lets a child import what the tests import,
and a child that reports a JSON line."""

import json
import os
import subprocess
import sys
import tomllib

from .paths import ROOT


def pythonpath_roots() -> list[str]:
    """The folders that pyproject.toml's ``[tool.pytest.ini_options] pythonpath`` puts on the
    tests' ``sys.path`` (tests/, the host test harness, the benchmarks' library, the asv suite's
    parent), as absolute paths: the one list, read where it is written."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        ini = tomllib.load(f)["tool"]["pytest"]["ini_options"]
    return [str(ROOT / p) for p in ini["pythonpath"]]


def child_env(**extra: str) -> dict[str, str]:
    """``os.environ`` for a child Python process that imports what the tests import (the host
    test harness ``rmm_fences_testing``, the benchmarks' ``rmm_fences_bench``, ``helpers``):
    the tests' ``pythonpath`` roots first on its ``PYTHONPATH``, then any the run had; ``extra``
    variables on top."""
    path = os.pathsep.join([*pythonpath_roots(), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, **extra}


def run_json(code, *args, timeout=300, env=None):
    """Runs Python ``code`` with ``args`` in a child process (a crash is the child's exit code,
    not the test run's) and returns ``(exit code, the last line of its stdout that starts with
    "{" as a dict or None, stdout, stderr)``. ``env``: the child's environment (``child_env()``
    for a child that imports the tests' helpers or the benchmarks' library; default: this
    process's)."""
    res = subprocess.run(
        [sys.executable, "-P", "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    lines = [line for line in res.stdout.splitlines() if line.startswith("{")]
    return res.returncode, (json.loads(lines[-1]) if lines else None), res.stdout, res.stderr
