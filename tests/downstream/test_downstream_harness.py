# SPDX-License-Identifier: Apache-2.0
"""tools/downstream/run.py on a fake suite, on the CPU: no GPU, rmm or cupy needed.

The plugin runs with RMM_FENCES_DS_FAKE=1 (it installs nothing); the fake tests read
RMM_FENCES_DS_CHAIN themselves to fail or crash only under a chain.
"""

import json
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

import pytest

from helpers.fake_suite import write_fake_suite
from helpers.paths import TOOLS
from helpers.scripts import load_script

RUN = TOOLS / "downstream" / "run.py"

HANG = """
    import os
    import time

    def test_hang():
        if os.environ.get("RMM_FENCES_DS_CHAIN"):
            time.sleep(120)
    """


@pytest.fixture
def suite(tmp_path):
    return write_fake_suite(tmp_path / "suite")


def harness(*args):
    env = dict(
        os.environ, RMM_FENCES_DS_FAKE="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1"
    )  # hypothesis & co.: a second per process
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run(
        [sys.executable, str(RUN), *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_fake(suite, out, *args):
    """The harness on the fake suite, its output in ``out``."""
    return harness("--suite", f"fake={suite}", "--out", out, *args)


def test_regression_crash_and_not_run(suite, tmp_path):
    out = tmp_path / "out"
    r = run_fake(
        suite,
        out,
        "--jobs",
        4,
        "--timeout-file",
        60,
        "--chain",
        "pool=pool(cuda_async)",
    )
    assert r.returncode == 1, r.stdout + r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["fake"] is True and summary["exit_code"] == 1
    base, pool = summary["results"]["fake"]["baseline"], summary["results"]["fake"]["pool"]
    assert base["counts"]["passed"] == 10 and base["counts"]["skipped"] == 1
    assert base["counts"]["xfailed"] == 1 and not base["regressions"] and not base["crashes"]

    regressions = {r["test"]: r for r in pool["regressions"]}
    assert set(regressions) == {
        "test_chain_fail.py::test_fails_with_chain",
        "test_segv.py::test_segv",
        "test_segv.py::test_after_1",
        "test_segv.py::test_after_2",
    }
    failed = regressions["test_chain_fail.py::test_fails_with_chain"]
    assert (failed["baseline"], failed["outcome"]) == ("passed", "failed")
    assert "chain is set" in failed["message"]
    assert regressions["test_segv.py::test_segv"]["outcome"] == "crashed"
    assert regressions["test_segv.py::test_after_1"]["outcome"] == "not run"
    [crash] = pool["crashes"]
    assert crash["test"] == "test_segv.py::test_segv" and "SIGSEGV" in crash["reason"]
    assert pool["counts"]["crashed"] == 1 and pool["counts"]["not run"] == 2
    # the crashed process's finished tests keep their outcome (from the plugin's log)
    assert pool["counts"]["passed"] == 6 and pool["counts"]["failed"] == 1

    for entry in (base, pool):
        [unraisable] = entry["unraisable"]
        assert unraisable["test"] == "test_unraisable.py::test_del"
        assert "boom in __del__" in unraisable["message"]

    assert (
        "fake  pool: 6 passed, 1 failed, 1 skipped, 1 xfailed, 1 crashed, 2 not run; "
        "4 regressions, 1 crashes, 1 unraisable, 0 hazards"
    ) in r.stdout
    assert "test_chain_fail.py::test_fails_with_chain: passed -> failed" in r.stdout
    assert "CRASH in test_segv.py::test_segv" in r.stdout
    md = (out / "summary.md").read_text()
    assert "| fake | pool | 6 | 1 | 0 | 2 | 4 | - | 1 | 1 | 0 | 4 of 4 |" in md
    for ext in ("xml", "log", "state", "meta.json"):
        assert (out / "fake" / "pool" / f"test_chain_fail.{ext}").is_file()

    (out / "summary.json").unlink()
    again = harness("--report-only", out)
    assert again.returncode == 1
    rebuilt = json.loads((out / "summary.json").read_text())["results"]["fake"]["pool"]
    assert rebuilt["regressions"] == pool["regressions"]


def test_baseline_only_exits_zero(suite, tmp_path):
    out = tmp_path / "out"
    r = run_fake(
        suite,
        out,
        "--only-baseline",
        "--chain",
        "pool=pool(cuda_async)",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert list(json.loads((out / "summary.json").read_text())["results"]["fake"]) == ["baseline"]
    assert "fake  baseline: 10 passed, 0 failed, 1 skipped, 1 xfailed; 0 regressions" in r.stdout
    assert (out / "summary.md").is_file()


def test_timeout_kills_and_names_the_test(suite, tmp_path):
    (suite / "test_hang.py").write_text(textwrap.dedent(HANG))
    out = tmp_path / "out"
    r = run_fake(
        suite,
        out,
        "--files",
        "test_hang.py",
        "--timeout-file",
        4,
        "--chain",
        "pool=pool(cuda_async)",
    )
    assert r.returncode == 1, r.stdout + r.stderr
    [crash] = json.loads((out / "summary.json").read_text())["results"]["fake"]["pool"]["crashes"]
    assert crash["test"] == "test_hang.py::test_hang" and crash["reason"].startswith("timeout")


SLOW = """
    import time

    def test_slow():
        time.sleep(10)
    """


def test_deadline_leaves_files_for_resume(suite, tmp_path):
    (suite / "test_slow.py").write_text(textwrap.dedent(SLOW))
    out = tmp_path / "out"
    files = ("--files", "test_pass.py", "test_slow.py")
    r = run_fake(
        suite,
        out,
        *files,
        "--only-baseline",
        "--jobs",
        2,
        "--deadline",
        6,
        "--cupy-cache",
        tmp_path / "kernels",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    entry = json.loads((out / "summary.json").read_text())["results"]["fake"]["baseline"]
    assert entry["files_pending"] == ["test_slow.py"] and entry["counts"]["passed"] == 3
    assert (
        "| fake | baseline | 3 | 0 | 0 | 2 | 0 | - | 0 | 0 | 0 | 1 of 2 |"
        in (out / "summary.md").read_text()
    )
    assert not (out / "fake" / "baseline" / "test_slow.log").exists()
    assert "1 file(s) not finished" in r.stdout

    again = harness("--suite", f"fake={suite}", "--out", out, *files, "--only-baseline", "--resume")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "--resume: 1 file(s) already done, 1 to run" in again.stderr
    entry = json.loads((out / "summary.json").read_text())["results"]["fake"]["baseline"]
    assert entry["files_pending"] == [] and entry["counts"]["passed"] == 4


VANISH = """
    import pathlib
    import shutil

    def test_takes_its_suite_away():
        shutil.rmtree(pathlib.Path(__file__).parent)
    """


def test_a_file_that_cannot_start_is_left_unfinished_and_the_rest_reported(suite, tmp_path):
    """A file whose pytest cannot start (its suite's folder gone under the run) is one file
    not finished; the run goes on and writes its summary, where it used to die on the
    FileNotFoundError with every finished file's result unreported."""
    # the largest file starts first: padded, it runs before test_pass.py
    (suite / "test_0_vanish.py").write_text(textwrap.dedent(VANISH) + "#" * 4096 + "\n")
    out = tmp_path / "out"
    files = ("--files", "test_0_vanish.py", "test_pass.py")
    r = run_fake(suite, out, *files, "--only-baseline", "--jobs", 1)
    assert "Traceback" not in r.stderr, r.stderr
    assert "test_pass: could not start pytest" in r.stderr
    # the vanishing file itself is reported (its pytest, in a deleted folder, ends without a
    # complete report: a crash), and test_pass.py is the one file not finished
    entry = json.loads((out / "summary.json").read_text())["results"]["fake"]["baseline"]
    assert entry["files_pending"] == ["test_pass.py"] and entry["files_done"] == 1
    assert "1 file(s) not finished" in r.stdout


def _load_run():
    return load_script(RUN, "downstream_run")


def test_default_plan(tmp_path):
    run = _load_run()
    cupy = tmp_path / "cupy"
    for f in (
        "cupy_tests/core_tests/test_scan.py",
        "cupy_tests/math_tests/test_sumprod.py",
        "cupy_tests/sorting_tests/test_sort.py",
        "cupy_tests/sorting_tests/__init__.py",
    ):
        (cupy / f).parent.mkdir(parents=True, exist_ok=True)
        (cupy / f).write_text("")
    rmm = tmp_path / "rmm"
    rmm.mkdir()
    (rmm / "test_rmm.py").write_text("")
    (rmm / "conftest.py").write_text("")
    args = run.parse_args(["--suite", f"rmm={rmm}", "--suite", f"cupy={cupy}", "--out", "x"])
    suites, jobs = run.plan(args)
    assert suites["rmm"]["files"] == ["test_rmm.py"]
    assert suites["cupy"]["files"] == [
        "cupy_tests/math_tests/test_sumprod.py",
        "cupy_tests/core_tests/test_scan.py",
        "cupy_tests/sorting_tests/test_sort.py",
    ]
    assert "cupy_tests/cuda_tests/test_graph.py" in suites["cupy"]["missing"]
    chains = {(j["suite"], j["chain"]) for j in jobs if not j.get("if_regressed")}
    assert len(chains) == 5 + 9
    assert ("cupy", "tracker+CupyAllocator") in chains and ("rmm", "tracker") in chains
    assert ("cupy", "pool") not in chains
    # rmm's own resources run where a chain they are the reference of regressed
    due = {(j["suite"], j["chain"]): j["if_regressed"] for j in jobs if j.get("if_regressed")}
    assert due == {
        ("rmm", "ref_cuda_async"): ["pool", "tracker"],
        ("rmm", "ref_rmm_pool"): ["sof_deferred", "sof_stream"],
        ("cupy", "ref_cuda_async+CupyAllocator"): ["pool+CupyAllocator", "tracker+CupyAllocator"],
        ("cupy", "ref_cuda_async+rmm_cupy_allocator"): [
            "pool+rmm_cupy_allocator",
            "tracker+rmm_cupy_allocator",
        ],
        ("cupy", "ref_rmm_pool+CupyAllocator"): [
            "sof_deferred+CupyAllocator",
            "sof_stream+CupyAllocator",
        ],
        ("cupy", "ref_rmm_pool+rmm_cupy_allocator"): [
            "sof_deferred+rmm_cupy_allocator",
            "sof_stream+rmm_cupy_allocator",
        ],
    }
    every = run.plan(
        run.parse_args(["--suite", f"rmm={rmm}", "--out", "x", "--references", "every-file"])
    )[1]
    assert {j["chain"] for j in every if not j.get("if_regressed")} >= {
        "ref_cuda_async",
        "ref_rmm_pool",
    }
    none = run.plan(
        run.parse_args(["--suite", f"rmm={rmm}", "--out", "x", "--references", "none"])
    )[1]
    assert not any(j["chain"].startswith("ref_") for j in none)
    assert [j["chain"] for j in jobs[:4]] == ["baseline"] * 4  # every baseline first
    pool = next(j for j in jobs if j["chain"] == "pool+rmm_cupy_allocator")
    assert pool["env"] == {"RMM_FENCES_DS_CHAIN": "pool(cuda_async)", "RMM_FENCES_DS_CUPY": "rmm"}
    _, only = run.plan(
        run.parse_args(["--suite", f"cupy={cupy}", "--out", "x", "--chains", "sof_stream"])
    )
    assert {j["chain"] for j in only if not j.get("if_regressed")} == {
        "baseline",
        "sof_stream+rmm_cupy_allocator",
        "sof_stream+CupyAllocator",
    }


MARKED = """
    import os
    import pytest

    def test_small():
        pass

    @pytest.mark.slow
    def test_huge():
        assert not os.environ.get("RMM_FENCES_DS_CHAIN"), "huge fails under the chain"
    """


def test_marked_tests_run_apart_after_the_rest(suite, tmp_path):
    (suite / "test_marked.py").write_text(textwrap.dedent(MARKED))
    out = tmp_path / "out"
    r = run_fake(
        suite,
        out,
        "--files",
        "test_marked.py",
        "test_pass.py",
        "--chain",
        "pool=pool(cuda_async)",
    )
    assert r.returncode == 1, r.stdout + r.stderr
    # the marked file runs twice per chain: without its slow tests, then only those, apart
    for chain in ("baseline", "pool"):
        for base in ("test_marked", "test_marked@slow"):
            assert (out / "fake" / chain / f"{base}.meta.json").is_file()
        assert not (out / "fake" / chain / "test_pass@slow.meta.json").exists()
    meta = json.loads((out / "fake" / "pool" / "test_marked@slow.meta.json").read_text())
    assert meta["cmd"][-3:] == ["-m", "slow", "test_marked.py"]
    order = [line for line in r.stderr.splitlines() if line.startswith("[")]
    assert all("-m 'slow'" in line for line in order[-2:]), order  # the serial phase is last
    results = json.loads((out / "summary.json").read_text())["results"]["fake"]
    assert (
        results["baseline"]["counts"]["passed"] == 2 + 3 and not results["baseline"]["regressions"]
    )
    [regression] = results["pool"]["regressions"]
    assert regression["test"] == "test_marked.py::test_huge"
    assert (regression["baseline"], regression["outcome"]) == ("passed", "failed")
    assert results["pool"]["counts"]["passed"] == 1 + 3


def test_a_long_file_runs_in_shards_that_cover_each_test_once(suite, tmp_path):
    """--shard-kib: a file larger than the bound runs as several processes (its parts
    "FILE [shard i/n]"), each with every n-th test; together they run each test once, a file
    under the bound runs whole, and a chain's regression is found in its shard."""
    out = tmp_path / "out"
    size = (suite / "test_pass.py").stat().st_size
    r = run_fake(
        suite,
        out,
        "--files",
        "test_pass.py",
        "test_chain_fail.py",
        "--shard-kib",
        (size - 1) / 2 / 1024,  # test_pass.py: 3 shards; test_chain_fail.py (smaller): 1
        "--chain",
        "pool=pool(cuda_async)",
    )
    assert r.returncode == 1, r.stdout + r.stderr
    results = json.loads((out / "summary.json").read_text())["results"]["fake"]
    shards = [f"test_pass.py [shard {i}/3]" for i in (1, 2, 3)]
    assert results["baseline"]["parts_done"] == sorted([*shards, "test_chain_fail.py"])
    ran = []
    for i in (1, 2, 3):
        meta = json.loads((out / "fake" / "pool" / f"test_pass@shard{i}of3.meta.json").read_text())
        assert meta["shard"] == f"{i}/3"
        tree = ET.parse(out / "fake" / "pool" / f"test_pass@shard{i}of3.xml")
        ran += [c.get("name") for c in tree.iter("testcase")]
    assert sorted(ran) == ["test_a", "test_p[1]", "test_p[2]", "test_skipped", "test_xfail"]
    assert results["pool"]["counts"]["passed"] == 4 and results["pool"]["counts"]["skipped"] == 1
    [regression] = results["pool"]["regressions"]
    assert regression["test"] == "test_chain_fail.py::test_fails_with_chain"

    # --resume with whole files: they replace the shards in the report (each test counted once)
    again = run_fake(suite, out, "--files", "test_pass.py", "--resume", "--chain", "pool=x")
    assert again.returncode == 1, again.stdout + again.stderr
    assert "--resume: 0 file(s) already done, 2 to run" in again.stderr
    results = json.loads((out / "summary.json").read_text())["results"]["fake"]
    for chain, passed in (("baseline", 3 + 2), ("pool", 3 + 1)):
        assert results[chain]["parts_done"] == ["test_chain_fail.py", "test_pass.py"]
        assert results[chain]["counts"]["passed"] == passed and not results[chain]["files_pending"]


def test_a_file_named_in_shards_runs_as_that_many(tmp_path):
    """--shards FILE=N splits a file however small its source (a suite's own file first),
    and a bad value is a usage error naming the option and the form it takes."""
    run = _load_run()
    for name in ("a", "b"):
        root = tmp_path / name
        root.mkdir()
        (root / "test_x.py").write_text("def test_x(): pass\n")
        (root / "test_y.py").write_text("def test_y(): pass\n")
    argv = ["--suite", f"a={tmp_path / 'a'}", "--suite", f"b={tmp_path / 'b'}", "--out", "x"]
    argv += ["--only-baseline", "--shards", "test_x.py=2", "--shards", "b:test_x.py=3"]
    _, jobs = run.plan(run.parse_args(argv))
    parts = sorted((j["suite"], j["part"]) for j in jobs)
    assert parts == [
        ("a", "test_x.py [shard 1/2]"),
        ("a", "test_x.py [shard 2/2]"),
        ("a", "test_y.py"),
        ("b", "test_x.py [shard 1/3]"),
        ("b", "test_x.py [shard 2/3]"),
        ("b", "test_x.py [shard 3/3]"),
        ("b", "test_y.py"),
    ]
    for bad in ("test_x.py", "test_x.py=0", "=2", "test_x.py=two"):
        r = harness("--suite", f"a={tmp_path / 'a'}", "--out", tmp_path / "o", "--shards", bad)
        assert r.returncode == 2
        assert f"--shards {bad!r}: expected [SUITE:]FILE=N with N >= 1" in r.stderr


def test_a_sample_runs_the_same_tests_under_every_chain(suite, tmp_path):
    """--sample K/N: each file runs the first K of every N of its collected tests, the same
    ones as the baseline under the chain (with shards, the sample is split), so that a test
    left out is neither a regression nor counted; a bad value is a usage error."""
    out = tmp_path / "out"
    files = ("--files", "test_pass.py", "test_chain_fail.py")
    split = ("--sample", "fake:2/3", "--shards", "test_pass.py=2")
    r = run_fake(suite, out, *files, *split, "--chain", "pool=x")
    assert r.returncode == 1, r.stdout + r.stderr  # test_fails_with_chain: second of 2, kept
    results = json.loads((out / "summary.json").read_text())["results"]["fake"]
    parts = [f"test_pass.py [sample 2/3] [shard {i}/2]" for i in (1, 2)]
    assert results["pool"]["parts_done"] == sorted([*parts, "test_chain_fail.py [sample 2/3]"])
    ran = {}
    for chain in ("baseline", "pool"):
        for i in (1, 2):
            xml = out / "fake" / chain / f"test_pass@sample2of3@shard{i}of2.xml"
            ran.setdefault(chain, []).extend(c.get("name") for c in ET.parse(xml).iter("testcase"))
    # collected: test_a, test_skipped, test_xfail, test_p[1], test_p[2]; kept: 0, 1, 3, 4
    kept = ["test_a", "test_p[1]", "test_p[2]", "test_skipped"]
    assert sorted(ran["baseline"]) == sorted(ran["pool"]) == kept
    [regression] = results["pool"]["regressions"]
    assert regression["test"] == "test_chain_fail.py::test_fails_with_chain"
    for bad in ("0/2", "3/2", "fake:x", "1/0"):
        r = run_fake(suite, tmp_path / "o", "--sample", bad)
        assert r.returncode == 2
        assert f"--sample {bad!r}: expected [SUITE:]K/N with 1 <= K <= N" in r.stderr


def test_deadline_starts_no_file_an_earlier_run_says_cannot_finish(suite, tmp_path):
    """With --deadline, a file whose earlier run in OUT (the baseline's) took longer than the
    time left is not started, where it used to start and be stopped at the deadline; a short
    file still runs in that time."""
    (suite / "test_slow.py").write_text(textwrap.dedent(SLOW))  # 10 s
    # 4 s, and the largest source, so that it runs first (the longest files first)
    wait = "import time\n\ndef test_wait():\n    time.sleep(4)\n" + "#" * 4000 + "\n"
    (suite / "test_wait.py").write_text(wait)
    out = tmp_path / "out"
    files = ("--files", "test_pass.py", "test_slow.py", "test_wait.py")
    first = run_fake(suite, out, *files, "--only-baseline", "--jobs", 3)
    assert first.returncode == 0, first.stdout + first.stderr
    # one at a time: test_slow (about 15 s expected, at most 17.1 s counted) comes after
    # test_wait has taken some 5 s of the 19
    again = run_fake(
        suite, out, *files, "--chain", "pool=x", "--resume", "--jobs", 1, "--deadline", 19
    )
    assert "not started: fake pool test_slow.py would take about" in again.stderr
    assert "not started: fake pool test_pass.py" not in again.stderr
    entry = json.loads((out / "summary.json").read_text())["results"]["fake"]["pool"]
    assert entry["files_pending"] == ["test_slow.py"] and entry["counts"]["passed"] == 4


@pytest.mark.parametrize(
    ("expected", "left", "starts"),
    [
        (None, 10, True),  # never ran: no estimate
        (50, None, True),  # no deadline
        (50, 60, True),
        (50, 40, False),  # would be stopped
        (200, 95, True),  # longer than any part of a 100 s run: at its start, tried
        (200, 80, False),  # but not later in it
    ],
)
def test_a_file_starts_when_it_fits_or_could_never_fit(expected, left, starts):
    assert _load_run().fits(expected, left, 100) is starts


@pytest.mark.parametrize("shard", ["3/2", "0/2", "x"])
def test_a_bad_shard_stops_pytest_with_a_usage_error(suite, shard):
    env = dict(
        os.environ,
        RMM_FENCES_DS_FAKE="1",
        RMM_FENCES_DS_SHARD=shard,
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
        PYTHONPATH=str(TOOLS / "downstream"),
    )
    env.pop("PYTEST_ADDOPTS", None)
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "plugin", "-q", "test_pass.py"],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 4, r.stdout + r.stderr  # pytest's usage error
    assert f"RMM_FENCES_DS_SHARD must be I/N with 1 <= I <= N, got {shard!r}" in r.stderr


def test_plan_splits_only_files_that_name_the_mark(tmp_path):
    run = _load_run()
    root = tmp_path / "s"
    root.mkdir()
    (root / "test_a.py").write_text("import pytest\n@pytest.mark.slow\ndef test_x(): pass\n")
    (root / "test_b.py").write_text("def test_slowly(): pass\n")
    _, jobs = run.plan(run.parse_args(["--suite", f"s={root}", "--out", "x", "--only-baseline"]))
    assert sorted((j["part"], j.get("mark"), bool(j.get("serial"))) for j in jobs) == [
        ("test_a.py", "not slow", False),
        ("test_a.py [slow]", "slow", True),
        ("test_b.py", None, False),
    ]
    args = run.parse_args(
        ["--suite", f"s={root}", "--out", "x", "--only-baseline", "--serial-mark", ""]
    )
    assert [j.get("mark") for j in run.plan(args)[1]] == [None, None]


ONLY_OWN = """
    import os

    def test_fails_only_under_the_pool():
        assert "pool(" not in os.environ.get("RMM_FENCES_DS_CHAIN", ""), "the pool's own"

    def test_fails_under_cuda_async_too():
        assert not os.environ.get("RMM_FENCES_DS_CHAIN"), "rmm's too"
    """


def test_references_run_only_where_a_chain_regressed(suite, tmp_path):
    (suite / "test_only_own.py").write_text(textwrap.dedent(ONLY_OWN))
    out = tmp_path / "out"
    chains = ("--chain", "pool=pool(cuda_async)", "--chain", "ref_cuda_async=cuda_async")
    files = ("--files", "test_only_own.py", "test_pass.py")
    r = run_fake(suite, out, *files, *chains)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 file(s) under rmm's own resources, where a chain regressed" in r.stderr
    ran = sorted(p.name for p in (out / "fake" / "ref_cuda_async").glob("*.meta.json"))
    assert ran == ["test_only_own.meta.json"]  # not test_pass.py: the pool passed it
    results = json.loads((out / "summary.json").read_text())["results"]["fake"]
    pool = results["pool"]
    assert pool["own_regressions"] == 1 and results["ref_cuda_async"]["files_pending"] == []
    shared = {r["test"].split("::")[-1]: r.get("shared_with") for r in pool["regressions"]}
    assert shared == {
        "test_fails_only_under_the_pool": None,
        "test_fails_under_cuda_async_too": "ref_cuda_async",
    }
    assert "(1 not under its rmm reference)" in r.stdout

    # a resumed run finds nothing left; with no regression a chain has 0 of its own
    again = run_fake(suite, out, *files, *chains, "--resume")
    assert "0 to run" in again.stderr and "under rmm's own resources" not in again.stderr
    clean = tmp_path / "clean"
    r = run_fake(suite, clean, "--files", "test_pass.py", *chains)
    assert r.returncode == 0, r.stdout + r.stderr
    results = json.loads((clean / "summary.json").read_text())["results"]["fake"]
    assert set(results) == {"baseline", "pool"} and results["pool"]["own_regressions"] == 0


def test_regressions_shared_with_the_rmm_reference_are_marked():
    run = _load_run()

    def entry(*tests):
        return {"regressions": [{"test": t} for t in tests], "files_done": 1}

    chains = {
        "sof_stream+CupyAllocator": entry("a", "b"),
        "ref_rmm_pool+CupyAllocator": entry("b", "c"),
        "pool+CupyAllocator": entry("a"),  # its reference (ref_cuda_async) did not run
    }
    for name, e in chains.items():
        run.mark_shared(name, e, chains)
    sof = chains["sof_stream+CupyAllocator"]
    assert sof["own_regressions"] == 1
    assert [r.get("shared_with") for r in sof["regressions"]] == [
        None,
        "ref_rmm_pool+CupyAllocator",
    ]
    assert chains["pool+CupyAllocator"]["own_regressions"] is None
    # a reference that did not run on the part where a regression is cannot clear it
    ran_elsewhere = {
        "sof_deferred": {"regressions": [{"test": "a", "part": "f.py"}], "files_done": 1},
        "ref_rmm_pool": {"regressions": [], "files_done": 1, "parts_done": ["g.py"]},
    }
    run.mark_shared("sof_deferred", ran_elsewhere["sof_deferred"], ran_elsewhere)
    assert ran_elsewhere["sof_deferred"]["own_regressions"] is None
    assert "(1 not under its rmm reference)" in run.line(
        "sof_stream+CupyAllocator",
        {
            **sof,
            "counts": dict.fromkeys(run.OUTCOMES, 0),
            "crashes": [],
            "unraisable": [],
            "hazard_count": 0,
        },
    )


OOM_ONCE = """
    import os
    from pathlib import Path

    def test_short_of_memory_once():
        # under a chain, the first process runs short of memory (another held it); alone, not
        flag = Path(os.environ["FLAG_DIR"]) / "ran"
        if os.environ.get("RMM_FENCES_DS_CHAIN") and not flag.exists():
            flag.write_text("")
            try:  # as CuPy's helpers report it: the memory error only in the traceback
                raise MemoryError("cudaErrorMemoryAllocation: out of memory")
            except MemoryError as e:
                raise AssertionError("Only cupy raises error") from e

    def test_other():
        pass
    """

OOM_ALWAYS = """
    import os

    def test_short_of_memory_always():
        if os.environ.get("RMM_FENCES_DS_CHAIN"):
            raise MemoryError("std::bad_alloc: out_of_memory: pool cannot allocate")
    """


def test_files_short_of_memory_run_again_alone(suite, tmp_path, monkeypatch):
    (suite / "test_oom_once.py").write_text(textwrap.dedent(OOM_ONCE))
    (suite / "test_oom_always.py").write_text(textwrap.dedent(OOM_ALWAYS))
    monkeypatch.setenv("FLAG_DIR", str(tmp_path))
    out, files = tmp_path / "out", ("test_oom_once.py", "test_oom_always.py", "test_chain_fail.py")
    r = run_fake(suite, out, "--files", *files, "--jobs", 3, "--chain", "pool=pool(cuda_async)")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "2 file(s) again, alone" in r.stderr  # not test_chain_fail.py: no memory error
    pool = json.loads((out / "summary.json").read_text())["results"]["fake"]["pool"]
    assert sorted(pool["files_run_alone"]) == ["test_oom_always.py", "test_oom_once.py"]
    # the run alone is the result: the first passes there, the second is a real regression
    assert {r["test"] for r in pool["regressions"]} == {
        "test_oom_always.py::test_short_of_memory_always",
        "test_chain_fail.py::test_fails_with_chain",
    }
    first = out / "fake" / "pool" / "test_oom_once.first.xml"
    assert "out of memory" in first.read_text()  # the first run is kept
    assert "2 file(s) run again alone (out of memory)" in r.stdout
    assert "Run again alone after an out-of-memory error" in (out / "summary.md").read_text()

    # a resumed run does not run them a third time
    again = harness(
        "--suite",
        f"fake={suite}",
        "--out",
        out,
        "--files",
        *files,
        "--resume",
        "--chain",
        "pool=pool(cuda_async)",
    )
    assert "again, alone" not in again.stderr
    assert "--resume: 6 file(s) already done, 0 to run" in again.stderr


WARNS_AT_IMPORT = """
    import warnings

    warnings.warn("the 'generic' unit is deprecated", DeprecationWarning)
    """


def _stand_in(site, module):
    """A package tree under ``site`` whose ``module`` warns as numpy 2.5 makes it warn."""
    *packages, leaf = module.split(".")
    d = site.joinpath(*packages)
    d.mkdir(parents=True, exist_ok=True)
    for k in range(len(packages)):
        (site.joinpath(*packages[: k + 1]) / "__init__.py").touch()
    (d / f"{leaf}.py").write_text(textwrap.dedent(WARNS_AT_IMPORT))


@pytest.mark.parametrize("rapids", ["1", ""])
@pytest.mark.parametrize(
    "module, importer",
    [
        ("numba.cuda.np.npdatetime_helpers", "conftest.py"),  # through cuDF, in its conftest
        ("cudf.testing._utils", "test_a.py"),  # cuDF's test helpers, in a test file
    ],
)
def test_rapids_suites_import_numba_cuda_before_their_conftest(tmp_path, rapids, module, importer):
    """cuDF's conftest imports cuDF, which imports a numba-cuda module that warns on numpy 2.5,
    and 21 files of its suite import cuDF's test helpers, which warn too; the suite makes
    warnings errors: the plugin imports those modules, the warning ignored, before any conftest
    (in pytest_configure it came too late and no file was collected; without the helpers 21
    files failed to collect on numpy 2.5). Stand-ins that warn the same way; without
    RMM_FENCES_DS_RAPIDS the conftest or the test file fails to import."""
    _stand_in(tmp_path / "site", module)
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\nfilterwarnings =\n    error\n")
    (suite / "conftest.py").write_text("")
    (suite / "test_a.py").write_text("def test_a():\n    pass\n")
    with open(suite / importer, "a") as f:
        f.write(f"import {module}  # noqa: F401\n")
    env = dict(
        os.environ,
        RMM_FENCES_DS_RAPIDS=rapids,
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
        PYTHONPATH=os.pathsep.join([str(TOOLS / "downstream"), str(tmp_path / "site")]),
    )
    for name in ("PYTEST_ADDOPTS", "RMM_FENCES_DS_FAKE", "RMM_FENCES_DS_CHAIN"):
        env.pop(name, None)  # no chain: the plugin imports neither rmm nor cupy
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "plugin", "-p", "no:cacheprovider", "-q"],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if rapids:
        assert r.returncode == 0, r.stdout + r.stderr
        assert "1 passed" in r.stdout
    else:  # 4: the conftest failed to import; 2: a test file failed to collect
        assert r.returncode == (4 if importer == "conftest.py" else 2), r.stdout + r.stderr
        assert "DeprecationWarning" in r.stdout + r.stderr


def test_chain_resource_builds_the_chain_in_a_spawned_process(monkeypatch):
    """A process a cudf-polars test spawns inherits the variable naming plugin.chain_resource
    but never ran the plugin's configure: the chain is built there from RMM_FENCES_DS_CHAIN,
    once (it returned None, and cudf-polars' child process died on it)."""
    plugin = load_script(TOOLS / "downstream" / "plugin.py", "ds_plugin_spawned")
    built = []
    monkeypatch.setattr(plugin, "_build", lambda spec: built.append(spec) or object())
    monkeypatch.setenv("RMM_FENCES_DS_CHAIN", "pool(cuda_async)")
    first = plugin.chain_resource()
    assert first is not None
    assert plugin.chain_resource() is first
    assert built == ["pool(cuda_async)"]
    monkeypatch.setattr(plugin, "_chain", None)
    monkeypatch.setenv("RMM_FENCES_DS_CHAIN", "")
    with pytest.raises(RuntimeError, match="RMM_FENCES_DS_CHAIN is empty"):
        plugin.chain_resource()


def test_the_summary_names_the_gpu_and_the_rapids_versions(tmp_path, monkeypatch):
    """The versions probe takes the GPU and driver from rmm_fences' own ``environment()`` (as
    every data file does) and cuDF's version from its metadata, in the suites' environment; the
    line under the title names them, and names no GPU where the probe found none (fails on a
    harness that recorded neither)."""
    run = _load_run()
    stub = tmp_path / "stub"
    (stub / "rmm_fences").mkdir(parents=True)
    (stub / "rmm_fences" / "__init__.py").write_text("__version__ = '9.9'\n")
    (stub / "rmm_fences" / "_cuda.py").write_text(
        "def environment():\n"
        "    return {'gpu': 'NVIDIA H200', 'driver': '580.159.04', 'cuda_driver_api': 13000}\n"
    )
    (stub / "cudf").mkdir()
    (stub / "cudf" / "__init__.py").write_text("")
    dist = stub / "cudf_cu13-26.10.2.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: cudf-cu13\nVersion: 26.10.2\n")
    (dist / "top_level.txt").write_text("cudf\n")
    monkeypatch.setenv("PYTHONPATH", str(stub))
    v = run.versions(tmp_path)
    assert (v["rmm_fences"], v["gpu"], v["driver"], v["cudf"]) == (
        "9.9",
        "NVIDIA H200",
        "580.159.04",
        "26.10.2",
    )
    summary = {
        "generated": "2026-12-05T00:00:00+00:00",
        "commit": "0123abcd",
        "versions": {"python": "3.12.3", "rmm": "26.10.00", "cudf": "26.10.2", "polars": "1.44.2"},
        "results": {},
        "suites": {},
    }
    gpu = {"gpu": "NVIDIA H200", "driver": "580.159.04"}
    line = run.markdown({**summary, "versions": {**summary["versions"], **gpu}}).splitlines()[2]
    assert line.endswith(
        "python 3.12.3, rmm 26.10.00, cudf 26.10.2, polars 1.44.2; "
        "GPU NVIDIA H200, driver 580.159.04"
    )
    assert "GPU" not in run.markdown(summary).splitlines()[2]
