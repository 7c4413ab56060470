# SPDX-License-Identifier: Apache-2.0
"""The command line without a GPU: help, spec errors, the no-GPU exit, the doctor's report."""

import json
import re
import subprocess
import sys

import pytest

import rmm_fences
from rmm_fences._cli.doctor import CHAINS, SCENARIOS, Cell, table, to_json
from rmm_fences._cuda import device_count

COMMANDS = ("doctor", "reduce")


def cli(*args):
    return subprocess.run(
        [sys.executable, "-P", "-m", "rmm_fences", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_help_works_everywhere(command):
    res = cli(command, "--help")
    assert res.returncode == 0 and "usage: rmm-fences " + command in res.stdout


def test_help_lists_exactly_the_two_commands():
    res = cli("--help")
    assert res.returncode == 0
    listed = re.search(r"\{([^}]*)\}", res.stdout).group(1).split(",")
    assert listed == list(COMMANDS)
    # bench: now benchmarks/alloc_free_pairs.py in the checkout (test_alloc_free_pairs.py)
    for removed in ("demo", "bench", "pool-bench", "reduce-bench", "tracking-bench"):
        assert removed not in res.stdout
        res = cli(removed)
        assert res.returncode == 2 and "invalid choice" in res.stderr


def test_subcommands_are_a_table_not_an_if_chain():
    from rmm_fences import _cli

    assert list(_cli.COMMANDS) == list(COMMANDS)
    for help_, add_arguments, run in _cli.COMMANDS.values():
        assert help_ and callable(add_arguments) and callable(run)


def test_console_script_is_declared():
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "rmm-fences"]
    assert ep.value == "rmm_fences._cli:main"


def test_the_scenarios_match_the_race_trial():
    pytest.importorskip("cupy")
    from rmm_fences import _scenarios

    assert _scenarios.SCENARIOS == SCENARIOS


def test_bad_specs_exit_2_with_the_caret():
    res = cli("reduce", "--resource", "poool(cuda)")
    assert res.returncode == 2
    assert "bad --resource" in res.stderr and "^" in res.stderr


@pytest.mark.parametrize("args", [("doctor", "--trials", "0"), ("reduce", "--n", "lots")])
def test_bad_numbers_are_usage_errors(args):
    res = cli(*args)
    assert res.returncode == 2 and "error: argument" in res.stderr


@pytest.mark.skipif(device_count() > 0, reason="checks the message shown where no GPU is present")
@pytest.mark.parametrize("command", COMMANDS)
def test_without_a_gpu_every_command_says_so_and_exits_2(command):
    res = cli(command)
    assert res.returncode == 2
    assert f"rmm-fences {command}: no CUDA device" in res.stderr
    assert "needs a CUDA GPU" in res.stderr


def sample_cells():
    return [
        Cell("naive_cache(cuda)", "cross_stream_reuse", 20, corrupted=19, free_us=0.9),
        Cell("naive_cache(cuda)", "free_in_flight", 20, free_us=0.8),
        Cell(
            "vmm_unmap(reserve_size=16GiB)",
            "free_in_flight",
            20,
            crashed="cudaErrorIllegalAddress: an illegal memory access was encountered",
        ),
        Cell(
            "tracking(naive_cache(cuda), on_hazard=record)",
            "cross_stream_reuse",
            20,
            corrupted=20,
            hazards=("freed_in_flight", "reuse_before_fence"),
            free_us=2.5,
        ),
    ]


def test_doctor_labels_table_and_json():
    cells = sample_cells()
    assert [c.outcome for c in cells] == ["corrupted", "correct", "crashed", "corrupted"]
    assert cells[0].label() == "corrupted 19/20"
    assert cells[2].label() == "crashed (cudaErrorIllegalAddress)"
    assert cells[3].label() == "corrupted 20/20 + freed_in_flight,reuse_before_fence"
    text = table(cells)
    assert "naive_cache(cuda)" in text and "crashed (cudaErrorIllegalAddress)" in text
    assert text.splitlines()[0].startswith("chain")
    data = json.loads(json.dumps(to_json(cells, device="test", trials=20)))
    assert data["device"] == "test" and len(data["cells"]) == 4
    assert data["cells"][2]["outcome"] == "crashed" and data["cells"][0]["corrupted"] == 19


def test_doctor_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from rmm_fences._cli.doctor import plot

    path = tmp_path / "matrix.png"
    plot(sample_cells(), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_matrix_covers_every_chain_of_the_issue():
    assert SCENARIOS == ("same_stream_reuse", "cross_stream_reuse", "free_in_flight")
    names = " ".join(CHAINS)
    for name in (
        "cuda",
        "cuda_async",
        "rmm_pool",
        "naive_cache",
        "vmm_unmap",
        "pool(",
        "tracking(naive_cache",
    ):
        assert name in names
    for mode in ("device", "stream", "deferred"):
        assert f"sync_on_free(naive_cache(cuda), mode={mode})" in CHAINS
        assert f"sync_on_free(vmm_unmap(reserve_size=16GiB), mode={mode})" in CHAINS


@pytest.mark.skipif(device_count() > 0, reason="a child without a GPU must fail to run a cell")
def test_a_child_that_dies_reads_as_a_crash():
    from rmm_fences._cli.doctor import run_cell_in_child

    cell = run_cell_in_child("cuda", "free_in_flight", 1)
    assert cell.outcome == "crashed" and cell.crashed
    assert cell.label().startswith("crashed (")


def test_version():
    from importlib.metadata import version

    res = cli("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"rmm-fences {rmm_fences.__version__}"
    assert version("rmm-fences-cu13") == rmm_fences.__version__  # the wheel's, from one place


@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_describes_itself(command):
    from rmm_fences import _cli

    res = cli(command, "--help")
    assert _cli.DESCRIPTIONS[command].split()[0] in res.stdout


@pytest.mark.parametrize(
    ("text", "value"), [("16M", 16 << 20), ("1m", 1 << 20), ("3K", 3072), ("2G", 2 << 30), ("7", 7)]
)
def test_counts_are_powers_of_two_as_the_help_says(text, value):
    from rmm_fences._cli._args import count

    assert count(text) == value


@pytest.mark.parametrize(
    "args",
    [
        ("reduce", "--n", "0"),
        ("reduce", "--n", "1.5M"),
        ("reduce", "--n", "16MB"),
        ("reduce", "--iters", "0"),
    ],
)
def test_zero_and_non_counts_are_usage_errors(args):
    res = cli(*args)
    assert res.returncode == 2 and f"error: argument {args[1]}" in res.stderr


def test_help_says_what_16m_means():
    res = cli("reduce", "--help")
    assert "16,777,216" in " ".join(res.stdout.split())


def test_doctor_checks_its_output_paths_before_the_run(tmp_path):
    res = cli("doctor", "--json", str(tmp_path / "missing" / "m.json"))
    assert res.returncode == 2 and "--json" in res.stderr and "no folder" in res.stderr
    res = cli("doctor", "--json", str(tmp_path))
    assert res.returncode == 2 and "is a folder" in res.stderr


def test_doctor_plot_without_matplotlib_fails_before_the_run(tmp_path):
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None:
        pytest.skip("matplotlib is installed here: the check has nothing to refuse")
    res = cli("doctor", "--plot", str(tmp_path / "m.png"))
    assert res.returncode == 2 and "--plot needs matplotlib" in res.stderr
