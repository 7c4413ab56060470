# SPDX-License-Identifier: Apache-2.0
"""pytest plugin for the GPU host: print each failure as it happens (a run that hangs or
crashes later keeps them). Loaded by tools/gpu_host.sh with ``-p instafail``."""


def pytest_runtest_logreport(report):
    if report.failed:
        print(
            f"\n=== FAILED NOW {report.nodeid} ({report.when})\n{report.longreprtext[-3000:]}\n",
            flush=True,
        )
