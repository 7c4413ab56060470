# SPDX-License-Identifier: Apache-2.0
"""tools/gpu_check.py on a machine without a GPU: it says so, writes its report and exits 2;
with --without-gpu its downstream part runs tools/downstream/run.py on a fake suite and the
report counts what that run found."""

import json
import os
import subprocess
import sys

import pytest

from rmm_fences._cuda import device_count

from helpers.fake_suite import write_fake_suite
from helpers.paths import TOOLS

GPU_CHECK = TOOLS / "gpu_check.py"


def gpu_check(*args, env=None):
    return subprocess.run(
        [sys.executable, str(GPU_CHECK), *map(str, args)],
        env=dict(os.environ, **(env or {})),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.skipif(device_count() > 0, reason="checks the machine without a CUDA GPU")
def test_without_a_gpu_it_runs_nothing_reports_why_and_exits_2(tmp_path):
    r = gpu_check("--out", tmp_path / "report")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "this needs a CUDA GPU" in r.stderr
    report = (tmp_path / "report" / "report.md").read_text()
    assert "| GPU | none found |" in report
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert {name: part["status"] for name, part in summary["parts"].items()} == {
        "tests": "not run",
        "bench": "not run",
    }


def test_the_downstream_part_reports_the_regressions_of_the_run(tmp_path):
    """The fake suite under one chain has 4 regressions and a crash (see helpers.fake_suite):
    the part fails and its table row says so."""
    suite = write_fake_suite(tmp_path / "suite")
    r = gpu_check(
        "--out",
        tmp_path / "report",
        "--without-gpu",
        "--parts",
        "downstream",
        "--suite",
        f"fake={suite}",
        "--downstream-args",
        "--jobs 2 --timeout-file 60 --chain pool=pool(cuda_async)",
        env={"RMM_FENCES_DS_FAKE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    assert r.returncode == 1, r.stdout + r.stderr
    report = (tmp_path / "report" / "report.md").read_text()
    assert "| fake | baseline | 10 | 0 | 1 | 0 | 0 | 0 |" in report
    assert "| fake | pool | 6 | 1 | 1 | 4 | 1 | 0 |" in report
    assert (tmp_path / "report" / "downstream" / "summary.md").exists()
