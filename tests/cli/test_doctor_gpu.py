# SPDX-License-Identifier: Apache-2.0
"""``rmm-fences doctor --quick --json`` on a GPU: the expected outcome in every cell."""

import json
import subprocess
import sys

import pytest

from rmm_fences._cli.doctor import CHAINS, SCENARIOS

pytestmark = pytest.mark.gpu

VMM = "vmm_unmap(reserve_size=16GiB)"


def expected(chain, scenario):
    """(allowed outcomes, hazards that must be reported) of a cell."""
    if chain == VMM:  # unmapped under the kernel: a fault, or a read of remapped memory
        return ({"crashed"} if scenario == "free_in_flight" else {"crashed", "corrupted"}), set()
    if chain.startswith("naive_cache"):
        return ({"corrupted"} if scenario == "cross_stream_reuse" else {"correct"}), set()
    if chain.startswith("tracking(naive_cache"):
        must = {"freed_in_flight"} | (
            {"reuse_before_fence"} if scenario == "cross_stream_reuse" else set()
        )
        return ({"corrupted"} if scenario == "cross_stream_reuse" else {"correct"}), must
    return {"correct"}, set()


def test_doctor_quick_json_matches_the_expected_matrix(tmp_path):
    path = tmp_path / "doctor.json"
    res = subprocess.run(
        [sys.executable, "-P", "-m", "rmm_fences", "doctor", "--quick", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    print("\n" + res.stdout)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(path.read_text())
    assert data["trials"] == 20 and len(data["cells"]) == len(CHAINS) * len(SCENARIOS)
    wrong = []
    for cell in data["cells"]:
        allowed, must = expected(cell["chain"], cell["scenario"])
        if cell["outcome"] not in allowed or not must <= set(cell["hazards"]):
            wrong.append((cell["chain"], cell["scenario"], cell["label"]))
        if cell["outcome"] == "correct":
            assert cell["free_us"] is not None
    assert wrong == []


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_cell_in_process_is_the_race_trial(scenario):
    # run_cell is _scenarios.race per scenario: the unsafe cache corrupts only where another
    # stream reuses the block; the deferred fence keeps every scenario correct
    from rmm_fences._cli.doctor import run_cell

    unsafe = run_cell("naive_cache(cuda)", scenario, 20, random_state=1)
    fenced = run_cell(
        "sync_on_free(naive_cache(cuda), mode=deferred)", scenario, 20, random_state=1
    )
    assert unsafe.crashed is None and fenced.crashed is None
    assert (unsafe.corrupted > 0) == (scenario == "cross_stream_reuse")
    assert fenced.outcome == "correct" and fenced.free_us is not None
