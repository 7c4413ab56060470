# SPDX-License-Identifier: Apache-2.0
"""tools/torch_report.py without a GPU: the 95% interval of the per-round step-time ratios, and
the rounds it takes before every interval is narrow enough."""

import json
import math

import pytest

from helpers.paths import ROOT
from helpers.scripts import load_script

report = load_script(ROOT / "tools" / "torch_report.py")


def rows_of(ratios, model="resnet50", allocator="fences_pool"):
    """Rounds of PyTorch's allocator at 1.0 s a step and `allocator` at each ratio."""
    out = []
    for k, ratio in enumerate(ratios):
        out.append({"model": model, "allocator": "torch", "round": k, "step_s": 1.0})
        out.append({"model": model, "allocator": allocator, "round": k, "step_s": ratio})
    return out


def test_the_interval_of_two_rounds_is_student_t_on_the_logarithms():
    low, high = report.ratio_interval([0.9, 1.1])
    logs = [math.log(0.9), math.log(1.1)]
    half = 12.706 * abs(logs[0] - logs[1]) / math.sqrt(2) / math.sqrt(2)
    mid = sum(logs) / 2
    assert low == pytest.approx(math.exp(mid - half)) and high == pytest.approx(
        math.exp(mid + half)
    )
    assert report.ratio_interval([1.0]) is None
    assert report.ratio_interval([1.01] * 5) == pytest.approx((1.01, 1.01))


def test_more_rounds_of_the_same_spread_narrow_the_interval():
    def width(ratios):
        low, high = report.ratio_interval(ratios)
        return high / low - 1

    spread = [0.98, 1.02]
    widths = [width(spread * n) for n in (2, 4, 8, 16)]
    assert widths == sorted(widths, reverse=True)
    assert widths[0] > 0.02 > widths[-1]


def test_narrow_enough_needs_every_allocator_and_model():
    steady = rows_of([1.0, 1.001, 0.999])
    assert report.narrow_enough(steady, 0.02)
    noisy = steady + rows_of([0.9, 1.1, 1.0], allocator="rmm_async")
    assert not report.narrow_enough(noisy, 0.02)
    assert report.per_round_ratios(noisy, "resnet50", "rmm_async") == [0.9, 1.1, 1.0]


def test_the_table_shows_the_interval():
    table = report.train_table(
        [{**r, "peak_used_bytes": 1 << 30} for r in rows_of([1.0, 1.001, 0.999])]
    )
    lines = table.splitlines()
    assert "95% interval" in lines[0]
    assert lines[2].startswith("| resnet50 | torch | 3 |") and "| - |" in lines[2]
    assert "| 0.998-1.002 |" in lines[3], lines[3]


def test_a_file_keeps_its_environment_and_older_bare_lists_still_load(tmp_path):
    rows = rows_of([1.0, 1.01, 0.99])
    env = {"commit": "abc", "gpu": "NVIDIA H100 80GB HBM3"}
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    new.write_text(json.dumps({"environment": env, "rows": rows}))
    old.write_text(json.dumps(rows))
    assert report.load(new) == (env, rows)
    assert report.load(old) == (None, rows)


def test_train_goes_on_from_the_rounds_of_an_earlier_call(monkeypatch):
    """Rounds already run are kept and counted: two more rounds after two make four, each
    allocator once per model and round, in rounds 2 and 3."""
    calls = []

    def fake_run(command, allocator):
        calls.append((command[2], allocator))
        return {"step_s": 1.0, "peak_used_bytes": 1 << 30}

    monkeypatch.setattr(report, "_run", fake_run)
    monkeypatch.setattr(report.workloads, "MODELS", ("resnet50",))
    earlier = [{**r, "peak_used_bytes": 1 << 30} for r in rows_of([1.0, 1.01])]
    rows, _ = report.train(1, repeat=4, allocators=["torch", "fences_pool"], rows=earlier)
    assert rows[: len(earlier)] == earlier
    assert [(r["round"], r["allocator"]) for r in rows[len(earlier) :]] == [
        (2, "torch"),
        (2, "fences_pool"),
        (3, "torch"),
        (3, "fences_pool"),
    ]
    assert len(calls) == 4


def test_resume_refuses_a_file_of_another_commit(tmp_path, monkeypatch, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"environment": {"commit": "old"}, "rows": rows_of([1.0])}))
    monkeypatch.setattr(report, "environment", lambda: {"commit": "new"})
    monkeypatch.setattr("sys.argv", ["torch_report.py", "train", "--json", str(path), "--resume"])
    with pytest.raises(SystemExit):
        report.main()
    assert "holds a run of commit old" in capsys.readouterr().err
