#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Run other projects' pytest suites (RMM's, CuPy's, cuDF's, cudf-polars') under rmm_fences
chains; report regressions.

On a CUDA machine (no network needed), with rmm, cupy and rmm_fences installed and the suites'
sources fetched beforehand by ``tools/downstream/fetch_sources.sh`` (``make downstream`` runs
this with these defaults)::

    python tools/downstream/run.py --suite rmm=.downstream/rmm-tests \\
        --suite cupy=.downstream/cupy-tests --out .downstream/out [--jobs N] [--chains pool ...]
    python tools/downstream/run.py --suite cudf=.downstream/cudf-tests \
        --suite cudf_polars=.downstream/cudf-polars --out .downstream/out-rapids

Each selected test file runs once as shipped (chain ``baseline``) and once per chain of
``CHAINS`` (on the cupy suite each chain twice: through rmm's ``rmm_cupy_allocator`` and through
rmm_fences' ``CupyAllocator``): one pytest process per (suite, chain, file), loaded with
``-p plugin`` (``plugin.py`` beside this file, which installs the chain), ``--jobs`` at a time,
all baselines first. Each process leaves ``OUT/<suite>/<chain>/<file>.{xml,log,state,meta.json}``.
A chain's regressions are the tests that passed, skipped or xfailed in the baseline and fail,
error, crash or do not run under the chain. ``OUT/summary.json`` and ``OUT/summary.md`` hold the
results; the exit code is 1 when a chain has a regression or any process crashed (a signal, a
timeout, no junit report). ``--report-only OUT`` rebuilds the summaries from an existing output
folder (after an interrupted run: the files not finished are listed as such).

Processes sharing one GPU can take the memory another needs: a file whose failures (or crash)
name an out-of-memory error, or that the host killed (SIGKILL), runs again alone on the device
once its phase (the parallel files, then the serial marks) is over, and that run is its result
(the first is kept as ``BASE.first.*``; ``--no-retry-alone`` turns this off).

A long run can be cut into several: ``--deadline SECONDS`` starts no file after that and stops
the ones still running (they stay unfinished), and the same command with ``--resume`` on the
same OUT runs only what is unfinished (after an interrupted run too); ``--cupy-cache DIR``
keeps CuPy's compiled kernels in DIR, so that a later run does not compile them again. A file
that runs longer than such a part never finishes: ``--shard-kib KIB`` splits each file larger
than KIB KiB of source into shards, one process each running every n-th of its tests
(``OUT/<suite>/<chain>/<file>@shard<i>of<n>.*``, reported as ``<file> [shard i/n]``), and
``--shards [SUITE:]FILE=N`` sets the count of one file whose source size says little of its run
time. ``--sample [SUITE:]K/N`` runs, in every file (of SUITE, or of every suite), only the first
K of every N of its collected tests, the same tests under every chain: a selection of a suite
too long for the time there is (``OUT/<suite>/<chain>/<file>@sampleKofN.*``, reported as
``<file> [sample K/N]``). With ``--deadline``, a file that an earlier run in OUT (any chain)
says cannot finish in the time left is not started: the time goes to shorter files instead
of to a process that would be stopped (one expected to outlast a whole part starts only at a
part's start).

After the chains, rmm's own resources under the same allocators (the references: CudaAsync
for the pool and the tracker, rmm's pool for SyncOnFree) run on the files where a chain
regressed, and the report counts the regressions the reference does not share ("not under its
rmm reference"); ``--references every-file`` runs them on every file, ``none`` not at all.

``--chain NAME=SPEC`` (repeatable) replaces the chain table: those chains run on every suite,
with no CuPy allocator; the ones named ``ref_*`` are references. ``RMM_FENCES_DS_FAKE=1`` in
the environment makes the plugin build and install nothing;
``tests/downstream/test_downstream_harness.py`` runs a fake suite on a CPU that way. CI does not
run this harness: it needs a GPU, rmm, cupy and the suites' sources.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# rmm's pool starts at half the free device memory unless told otherwise: with --jobs processes
# sharing one GPU, the later ones would start with a sliver and fail where the suite would not.
CHAINS = {  # name -> rmm_fences.compose spec
    "pool": "pool(cuda_async)",
    "sof_deferred": "sync_on_free(rmm_pool(cuda, initial_pool_size=1GiB), mode=deferred)",
    "sof_stream": "sync_on_free(rmm_pool(cuda, initial_pool_size=1GiB), mode=stream)",
    "tracker": "tracking(pool(cuda_async), on_hazard=raise)",
}
# rmm's own resources under the same allocators (--references): a failure a chain shares with
# its rmm upstream alone is rmm's, not the adaptor's.
REFERENCE_CHAINS = {
    "ref_rmm_pool": "rmm_pool(cuda, initial_pool_size=1GiB)",
    "ref_cuda_async": "cuda_async",
}
REFERENCE_OF = {  # chain -> the reference holding its rmm upstream alone
    "pool": "ref_cuda_async",
    "tracker": "ref_cuda_async",
    "sof_deferred": "ref_rmm_pool",
    "sof_stream": "ref_rmm_pool",
}
CUPY_ALLOCATORS = {"rmm": "rmm_cupy_allocator", "rmm_fences": "CupyAllocator"}  # DS_CUPY: suffix
DEFAULT_FILES = {  # globs relative to the suite's folder; any other suite: test_*.py
    "cupy": [
        "cupy_tests/core_tests/test_ndarray_reduction.py",
        "cupy_tests/core_tests/test_cub_reduction.py",
        "cupy_tests/core_tests/test_reduction.py",
        "cupy_tests/math_tests/test_sumprod.py",
        "cupy_tests/**/test_scan.py",
        "cupy_tests/sorting_tests/test_*.py",
        "cupy_tests/statistics_tests/test_*.py",
        "cupy_tests/cuda_tests/test_stream.py",
        "cupy_tests/cuda_tests/test_graph.py",
    ],
}
# cuDF's tests by subject (groupby, join and merge, sort, reductions and scans, strings, IO,
# window functions) of the whole suite's ~100,000 (--files for others). Collected with cuDF
# 26.10.2 without a GPU, this list with reshape/test_concat.py gave 22,717 tests and one file
# that needs a GPU to collect (series/methods/test_reductions.py); concatenation, none of the
# subjects, is left out so that the suite runs under three chains within a session's GPU time.
DEFAULT_FILES["cudf"] = [
    "groupby/test_*.py",
    "reshape/test_join.py",
    "reshape/test_merge.py",
    "dataframe/methods/test_sort_*.py",
    "series/methods/test_sort_*.py",
    "dataframe/methods/test_argsort.py",
    "series/methods/test_argsort.py",
    "dataframe/methods/test_nlargest_nsmallest.py",
    "series/methods/test_nlargest_nsmallest.py",
    "dataframe/methods/test_searchsorted.py",
    "series/methods/test_searchsorted.py",
    "dataframe/methods/test_reductions.py",
    "series/methods/test_reductions.py",
    "series/methods/test_cumulative_methods.py",
    "series/accessors/test_str.py",
    "text/test_text_methods.py",
    "input_output/test_csv.py",
    "input_output/test_json.py",
    "input_output/test_orc.py",
    "input_output/test_parquet.py",
    "input_output/test_feather.py",
    "input_output/test_text.py",
    "input_output/test_avro.py",
    "window/test_rolling.py",
    "window/test_ewm.py",
]
# cudf-polars' tests (the folder holding its pyproject.toml and tests/): the in-memory and the
# streaming engines; the Dask and Ray engines run only where distributed or ray is importable.
DEFAULT_FILES["cudf_polars"] = ["tests/**/test_*.py"]
RAPIDS_SUITES = {"cudf", "cudf_polars"}  # the plugin gets RMM_FENCES_DS_RAPIDS=1 for these
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "crashed", "not run")
GOOD = {"passed", "skipped", "xfailed", "xpassed"}
BAD = {"failed", "error", "crashed", "not run"}
RANK = {o: i for i, o in enumerate(("skipped", "xfailed", "passed", "xpassed", "failed", "error"))}
INI_FILES = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")
MSG = 500  # characters kept of a failure message
NOT_RUN = "not run (the process stopped before it, or did not collect it)"
RUN_FILES = (".xml", ".log", ".state", ".meta.json")  # what one process leaves: BASE + each
# A failure with one of these in its message (or a crash with one in its log's end) may be the
# device memory the other --jobs processes held: the file is run again, alone, after the rest.
SHORT_OF_MEMORY = re.compile(
    r"out of memory|out_of_memory|cudaErrorMemoryAllocation|OutOfMemoryError|"
    r"cudaErrorDevicesUnavailable",
    re.IGNORECASE,
)


def chain_table(specs=CHAINS, cupy_variants=True):
    """name -> (the suites it applies to, "*": every suite; the plugin's environment)."""
    table = {"baseline": (("*",), {})}
    for name, spec in specs.items():
        env = {"RMM_FENCES_DS_CHAIN": spec}
        if not cupy_variants:
            table[name] = (("*",), env)
            continue
        table[name] = (("rmm",), env)
        for how, suffix in CUPY_ALLOCATORS.items():
            table[f"{name}+{suffix}"] = (("cupy",), {**env, "RMM_FENCES_DS_CUPY": how})
    return table


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suite", action="append", default=[], metavar="NAME=PATH")
    p.add_argument(
        "--files",
        nargs="+",
        metavar="[SUITE:]GLOB",
        help="test files (globs relative to the suite folder) instead of the defaults",
    )
    p.add_argument("--out", type=Path, help="output folder")
    p.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    p.add_argument(
        "--chains",
        nargs="+",
        metavar="NAME",
        help="chains to run (pool selects pool+rmm_cupy_allocator etc. too)",
    )
    p.add_argument(
        "--chain",
        action="append",
        default=[],
        metavar="NAME=SPEC",
        help="replace the chain table (every suite, no CuPy allocator)",
    )
    p.add_argument(
        "--serial-mark",
        default="slow",
        metavar="MARK",
        help=(
            "tests marked MARK (CuPy marks its huge-memory tests 'slow') run in processes of "
            "their own after the rest, --serial-jobs at a time, so that they do not take the "
            "device memory the parallel processes need; '' runs every test in one process "
            "per file"
        ),
    )
    p.add_argument("--serial-jobs", type=int, default=2)
    p.add_argument(
        "--shard-kib",
        type=float,
        default=None,
        metavar="KIB",
        help=(
            "a test file whose source is larger than KIB KiB runs as ceil(size / KIB) "
            "processes, each with every n-th of its tests (the tests of --serial-mark stay "
            "in one): a --deadline then loses the work of a shard, not of the whole file"
        ),
    )
    p.add_argument(
        "--shards",
        action="append",
        default=[],
        metavar="[SUITE:]FILE=N",
        help=(
            "run FILE (relative to its suite's folder; of every suite without SUITE:) as N "
            "shards, whatever --shard-kib says: for a file whose run time its size "
            "understates (repeatable)"
        ),
    )
    p.add_argument(
        "--sample",
        action="append",
        default=[],
        metavar="[SUITE:]K/N",
        help=(
            "in each file (of SUITE; of every suite without SUITE:) run only the first K of "
            "every N collected tests, the same ones under every chain (repeatable)"
        ),
    )
    p.add_argument(
        "--no-retry-alone",
        dest="retry_alone",
        action="store_false",
        help=(
            "do not run again, alone on the device, a file whose failures include an "
            "out-of-memory error (by default its result is the one of the run alone; the "
            "first run is kept as BASE.first.*)"
        ),
    )
    p.add_argument("--timeout-file", type=float, default=900.0, help="seconds per process")
    p.add_argument(
        "--timeout-test",
        type=float,
        default=300.0,
        help="faulthandler_timeout: a test running longer has its stacks dumped",
    )
    p.add_argument("--only-baseline", action="store_true")
    p.add_argument(
        "--references",
        choices=("regressed", "every-file", "none"),
        default="regressed",
        help=(
            "rmm's own resources under the chains (ref_cuda_async for the pool and the "
            "tracker, ref_rmm_pool for SyncOnFree; with --chain, the chains named ref_*): run "
            "after the chains on the files where a chain regressed (default), on every file, "
            "or not at all; one named in --chains runs on every file"
        ),
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the files OUT already holds a finished result for; run the rest",
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=None,
        metavar="SECONDS",
        help=(
            "start no file after SECONDS and stop the ones still running then: "
            "they stay unfinished, for a later --resume"
        ),
    )
    p.add_argument(
        "--cupy-cache",
        type=Path,
        default=None,
        metavar="DIR",
        help=(
            "CuPy's kernel cache (CUPY_CACHE_DIR) for every process: kept from one "
            "run to the next, it saves the kernel compilations"
        ),
    )
    p.add_argument(
        "--report-only",
        type=Path,
        metavar="OUT",
        help="rebuild summary.{json,md} from an existing output folder",
    )
    args = p.parse_args(argv)
    if args.report_only is None and (not args.suite or args.out is None):
        p.error("--suite and --out are required (or --report-only OUT)")
    try:
        args.shard_counts = parse_shards(args.shards)
        args.samples = parse_samples(args.sample)
    except ValueError as e:
        p.error(str(e))
    return args


def parse_shards(items):
    """``--shards`` values as {(suite or None, file): count}; ValueError names a bad one."""
    counts = {}
    for item in items:
        where, _, n = item.rpartition("=")
        suite, _, file = where.rpartition(":")
        if not file or not n.isdigit() or int(n) < 1:
            raise ValueError(f"--shards {item!r}: expected [SUITE:]FILE=N with N >= 1")
        counts[suite or None, file] = int(n)
    return counts


def parse_samples(items):
    """``--sample`` values as {suite or None: "K/N"}; ValueError names a bad one."""
    samples = {}
    for item in items:
        suite, _, fraction = item.rpartition(":")
        m = re.fullmatch(r"(\d+)/(\d+)", fraction)
        if not m or not 1 <= int(m[1]) <= int(m[2]):
            raise ValueError(f"--sample {item!r}: expected [SUITE:]K/N with 1 <= K <= N")
        samples[suite or None] = f"{int(m[1])}/{int(m[2])}"
    return samples


def plan(args):
    """Each suite's files and unmatched globs; the jobs, every suite's baseline first."""
    specs = dict(kv.split("=", 1) for kv in args.chain)
    wanted = set(args.chains or [])
    if specs:
        table = chain_table(specs, cupy_variants=False)
    else:
        table = chain_table({**CHAINS, **REFERENCE_CHAINS})
    unknown = wanted - set(table) - {n.split("+")[0] for n in table}
    if unknown:
        sys.exit(f"unknown chain(s) {sorted(unknown)}; known: {sorted(table)}")

    def named(c):
        return bool(wanted & {c, c.split("+")[0]})

    chains = [
        c
        for c in table
        if c == "baseline"
        or (not args.only_baseline and not is_reference(c) and (not wanted or named(c)))
    ]
    # A reference runs on every file when named or asked so; else only where a chain it is the
    # reference of regressed (its jobs carry those chains: ``if_regressed``).
    conditional = {}
    for c in table:
        if not is_reference(c) or args.only_baseline:
            continue
        if named(c) or args.references == "every-file":
            chains.append(c)
        elif args.references == "regressed":
            if of := [x for x in chains if reference_of(x) == c]:
                conditional[c] = of
    suites, jobs = {}, []
    for item in args.suite:
        name, _, path = item.partition("=")
        root = Path(path).resolve()
        if not root.is_dir():
            sys.exit(f"--suite {item}: {root} is not a folder")
        globs = (
            [g.split(":", 1)[-1] for g in args.files if ":" not in g or g.split(":", 1)[0] == name]
            if args.files
            else DEFAULT_FILES.get(name, ["test_*.py"])
        )
        files, missing = [], []
        for pattern in globs:
            if Path(pattern).is_absolute():
                sys.exit(f"--files {pattern}: a glob relative to the suite's folder, please")
            hits = sorted(p.relative_to(root).as_posix() for p in root.glob(pattern) if p.is_file())
            files += [h for h in hits if h not in files]
            missing += [] if hits else [pattern]
        suites[name] = {"path": str(root), "files": files, "missing": missing}
    word = re.compile(rf"\b{re.escape(args.serial_mark)}\b") if args.serial_mark else None
    marked = {  # the files that may hold tests with the serial mark (their source names it)
        name: {f for f in s["files"] if word and word.search((Path(s["path"]) / f).read_text())}
        for name, s in suites.items()
    }
    size = {
        (n, f): (Path(s["path"]) / f).stat().st_size for n, s in suites.items() for f in s["files"]
    }
    for chain in [*chains, *conditional]:  # the table starts with the baseline
        where, env = table[chain]
        for name, suite in suites.items():
            if "*" in where or ("cupy" if name == "cupy" else "rmm") in where:
                for f in suite["files"]:
                    job = {
                        "suite": name,
                        "chain": chain,
                        "file": f,
                        "part": f,
                        "env": env,
                        "base": f"{name}/{chain}/{f.removesuffix('.py').replace('/', '__')}",
                    }
                    if chain in conditional:
                        job["if_regressed"] = conditional[chain]
                    if sample := args.samples.get(name, args.samples.get(None)):
                        k, n = sample.split("/")
                        job["sample"] = sample
                        job["part"] += f" [sample {sample}]"
                        job["base"] += f"@sample{k}of{n}"
                    shards = args.shard_counts.get(
                        (name, f), args.shard_counts.get((None, f))
                    ) or _shard_count(size[name, f], args.shard_kib)
                    if f not in marked[name]:
                        jobs += _shards(job, shards)
                        continue
                    mark = args.serial_mark
                    jobs += _shards({**job, "mark": f"not {mark}"}, shards)
                    jobs.append(
                        {
                            **job,
                            "mark": mark,
                            "serial": True,
                            "part": f"{f} [{mark}]",
                            "base": f"{job['base']}@{mark}",
                        }
                    )
    # The longest files first (source size stands in for run time), the baselines before all:
    # a --deadline then cuts short files, and the chains reuse the kernels CuPy
    # compiled for the baselines.
    jobs.sort(key=lambda j: (j["chain"] != "baseline", -size[j["suite"], j["file"]]))
    return suites, jobs


def _shard_count(nbytes, kib):
    """How many shards a file of ``nbytes`` of source runs as (1: whole) for ``--shard-kib``."""
    if not kib:
        return 1
    return max(1, math.ceil(nbytes / (kib * 1024)))


def _shards(job, count):
    """``job`` as ``count`` jobs, the i-th running every ``count``-th test from the i-th (the
    plugin's ``RMM_FENCES_DS_SHARD``); ``[job]`` when ``count`` is 1."""
    if count == 1:
        return [job]
    return [
        {
            **job,
            "shard": f"{i}/{count}",
            "part": f"{job['part']} [shard {i}/{count}]",
            "base": f"{job['base']}@shard{i}of{count}",
        }
        for i in range(1, count + 1)
    ]


def _file_key(job):
    """What a job runs, whatever its shards: (suite, chain, file, mark, sample)."""
    return job["suite"], job["chain"], job["file"], job.get("mark"), job.get("sample")


def is_reference(chain):
    """Whether ``chain`` is one of rmm's own resources run as a reference (named ``ref_*``)."""
    return chain.split("+")[0].startswith("ref_")


def reference_of(chain):
    """The reference chain of ``chain`` (its rmm upstream alone, same CuPy allocator), or None."""
    name, plus, how = chain.partition("+")
    ref = REFERENCE_OF.get(name)
    return f"{ref}{plus}{how}" if ref else None


_running: set = set()  # the pytest processes running now
_lock = threading.Lock()
_stopping = threading.Event()  # interrupted: a process killed then leaves no result


def kill_group(proc):
    """SIGTERM, then SIGKILL, to the process group of a pytest started in its own session."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            pass


def child_env(extra=None):
    env = dict(os.environ, PYTHONUNBUFFERED="1", RMM_FENCES_DS_CHAIN="", RMM_FENCES_DS_CUPY="")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    return {**env, **(extra or {})}


_T0 = time.monotonic()


def _left(args):
    """Seconds left before --deadline (None: no deadline)."""
    return None if args.deadline is None else args.deadline - (time.monotonic() - _T0)


# A chain's run of a file takes up to this many times its longest finished run in OUT (the
# RAPIDS suites under the chains took 1.35x-1.5x their baselines in all beside 12 other
# processes; single files up to 2.2x).
EXPECTED_MARGIN = 1.5


def expected_seconds(out):
    """{(suite, part): seconds} a run of each part is expected to take: ``EXPECTED_MARGIN``
    times its longest finished run in ``out`` under any chain (a file stopped by its own
    timeout counts with that timeout)."""
    took = {}
    for path in Path(out).glob("*/*/*.meta.json"):
        try:
            meta = json.loads(path.read_text())
            key, wall = (meta["suite"], meta["part"]), float(meta["wall_s"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        took[key] = max(took.get(key, 0.0), wall)
    return {key: wall * EXPECTED_MARGIN for key, wall in took.items()}


def fits(expected, left, deadline):
    """Whether a file expected to take ``expected`` seconds (None: unknown) starts with
    ``left`` seconds before the deadline. One expected to outlast a whole part of the run
    (90% of ``deadline``) starts only in the first tenth of one, so that it is not put off for
    ever."""
    if left is None or expected is None:
        return True
    return min(expected, 0.9 * deadline) <= left


def run_job(job, suites, out, args):
    base, root = out / job["base"], suites[job["suite"]]["path"]
    left = _left(args)
    if left is not None and left < 1:
        return None  # past the deadline: not started, left for --resume
    expected = args.expected.get((job["suite"], job["part"]))
    if not fits(expected, left, args.deadline):
        print(
            f"not started: {job['suite']} {job['chain']} {job['part']} would take about "
            f"{expected:.0f} s, {left:.0f} s left before the deadline",
            file=sys.stderr,
            flush=True,
        )
        return None  # it would be stopped: left for a --resume with the time it needs
    base.parent.mkdir(parents=True, exist_ok=True)
    for ext in RUN_FILES:
        Path(f"{base}{ext}").unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "plugin",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        root,
        "--confcutdir",
        root,
        "-o",
        f"faulthandler_timeout={args.timeout_test:g}",
        f"--junitxml={base}.xml",
        "-q",
        "-rfE",
        *(["-m", job["mark"]] if job.get("mark") else []),
        job["file"],
    ]
    if not any((Path(root) / n).exists() for n in INI_FILES):  # else pytest finds ours above
        cmd[3:3] = ["-c", str(out / "empty-pytest.ini")]
    extra = {**job["env"], "RMM_FENCES_DS_STATE": f"{base}.state"}
    if job["suite"] in RAPIDS_SUITES:
        extra["RMM_FENCES_DS_RAPIDS"] = "1"
    if job.get("shard"):
        extra["RMM_FENCES_DS_SHARD"] = job["shard"]
    if job.get("sample"):
        extra["RMM_FENCES_DS_SAMPLE"] = job["sample"]
    if args.cupy_cache is not None:
        extra["CUPY_CACHE_DIR"] = str(args.cupy_cache.resolve())
    env = child_env(extra)
    limit = args.timeout_file if left is None else min(args.timeout_file, left)
    t0, timed_out = time.monotonic(), False
    with open(f"{base}.log", "wb") as log:
        with _lock:  # no process starts once an interrupt has collected the running ones
            if _stopping.is_set():
                return None
            try:
                proc = subprocess.Popen(
                    cmd,
                    cwd=root,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError as exc:  # the suite's folder gone, say: this file alone is lost
                print(f"{job['base']}: could not start pytest: {exc}", file=sys.stderr)
                proc = None
            else:
                _running.add(proc)
        if proc is None:
            Path(f"{base}.log").unlink(missing_ok=True)
            return None  # not finished: the summary lists it, and a --resume runs it
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_group(proc)
        finally:
            with _lock:
                _running.discard(proc)
    if _stopping.is_set():
        return None
    if timed_out and limit < args.timeout_file:  # stopped by the deadline, not its own timeout
        for ext in (".xml", ".log", ".state"):
            Path(f"{base}{ext}").unlink(missing_ok=True)
        return None
    meta = {
        **job,
        "cmd": cmd,
        "rc": proc.returncode,
        "timed_out": timed_out,
        "timeout_s": args.timeout_file,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    Path(f"{base}.meta.json").write_text(json.dumps(meta, indent=1))
    return meta


def short_of_memory(out, job):
    """Whether a finished file not yet run alone failed or crashed with an out-of-memory
    error (its meta says ``retried_alone`` once it ran alone)."""
    try:
        meta = json.loads(Path(f"{out / job['base']}.meta.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False  # not finished: not retried (a later --resume runs it)
    if meta.get("retried_alone"):
        return False
    results, crash, _, _ = evaluate(out, meta)
    if crash and (
        SHORT_OF_MEMORY.search(crash["log_excerpt"] or "")
        or crash["reason"].startswith("killed by SIGKILL")  # the host's out-of-memory killer
    ):
        return True
    if not any(r["outcome"] in BAD for r in results.values()):
        return False
    # the failure's message, or its traceback in the log (-q -rfE: the log holds only the
    # failures' reports; CuPy's helpers re-raise an error as "Only cupy raises error")
    log = Path(f"{out / job['base']}.log").read_text(encoding="utf-8", errors="replace")
    return bool(SHORT_OF_MEMORY.search(log)) or any(
        r["outcome"] in BAD and SHORT_OF_MEMORY.search(r["message"]) for r in results.values()
    )


def run_alone(job, suites, out, args):
    """Runs a file again (alone: the caller runs one at a time), its first run kept as
    BASE.first.*; put back when the deadline leaves no time to start."""
    base = out / job["base"]
    if (left := _left(args)) is not None and left < 1:
        return None
    for ext in RUN_FILES:
        if Path(f"{base}{ext}").is_file():
            Path(f"{base}{ext}").replace(f"{base}.first{ext}")
    meta = run_job({**job, "retried_alone": True}, suites, out, args)
    if meta is None:  # not run to its end: the first run stands
        for ext in RUN_FILES:
            if Path(f"{base}.first{ext}").is_file():
                Path(f"{base}.first{ext}").replace(f"{base}{ext}")
    return meta


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def run_all(args):
    for sig in (signal.SIGINT, signal.SIGTERM):  # the pytest processes have sessions of their own
        signal.signal(sig, _interrupt)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "empty-pytest.ini").write_text("[pytest]\n")
    suites, jobs = plan(args)
    for name, suite in suites.items():
        for pattern in suite["missing"]:
            print(f"{name}: no file matches {pattern} (skipped)")
    todo = [j for j in jobs if not j.get("if_regressed")]  # references where needed: later
    if args.resume and (out / "run.json").is_file():
        # The jobs of the earlier calls stay in the report, but for the files this plan runs
        # (split another way: this plan's shards replace them); those finished are not run again.
        earlier = json.loads((out / "run.json").read_text())
        known = {_file_key(j) for j in jobs}
        jobs = jobs + [j for j in earlier.get("jobs", []) if _file_key(j) not in known]
        suites = {**earlier.get("suites", {}), **suites}
        left = [j for j in todo if not Path(f"{out / j['base']}.meta.json").is_file()]
        print(
            f"--resume: {len(todo) - len(left)} file(s) already done, {len(left)} to run",
            file=sys.stderr,
        )
        todo = left
    args.expected = expected_seconds(out) if args.deadline is not None else {}
    run = {
        "argv": sys.argv,
        "started": _now(),
        "suites": suites,
        "jobs": jobs,
        "fake": os.environ.get("RMM_FENCES_DS_FAKE", "") == "1",
        "versions": versions(out),
        "commit": commit(),
    }
    (out / "run.json").write_text(json.dumps(run, indent=1))
    print(f"{len(todo)} pytest processes, {args.jobs} at a time, in {out}", file=sys.stderr)
    phases = [
        ([j for j in todo if not j.get("serial")], args.jobs),  # baselines first
        ("retry", 1),  # then, one at a time, the files that ran short of memory
        ([j for j in todo if j.get("serial")], args.serial_jobs),  # then the serial marks
        ("retry", 1),  # and those of them that ran short of memory
        # then rmm's reference resources where a chain regressed (--references regressed)
        ("references", args.jobs),
        ("serial references", args.serial_jobs),
        ("retry", 1),
    ]
    done = 0
    due = None  # the references due, found once the chains' phases are over
    try:
        for phase, width in phases:
            if phase == "retry":  # what ran short of memory among many runs again alone
                if not args.retry_alone:
                    continue
                phase = [j for j in jobs if short_of_memory(out, j)]
                if phase:
                    print(f"{len(phase)} file(s) again, alone", file=sys.stderr, flush=True)
                todo = todo + phase
                runner = run_alone
            elif isinstance(phase, str):  # the references' phases
                if due is None:
                    due = due_references(*finished(out, jobs)[:2])
                serial = phase == "serial references"
                phase = [j for j in due if bool(j.get("serial")) == serial]
                if phase:
                    print(
                        f"{len(phase)} file(s) under rmm's own resources, where a chain regressed",
                        file=sys.stderr,
                        flush=True,
                    )
                todo = todo + phase
                runner = run_job
            else:
                runner = run_job
            pool = cf.ThreadPoolExecutor(max_workers=max(1, width))
            futures = [pool.submit(runner, j, suites, out, args) for j in phase]
            for fut in cf.as_completed(futures):
                done += 1
                if m := fut.result():
                    mark = f" -m '{m['mark']}'" if m.get("mark") else ""
                    print(
                        f"[{done}/{len(todo)}] {m['suite']} {m['chain']} {m['file']}{mark}: "
                        f"rc={m['rc']}{' TIMEOUT' if m['timed_out'] else ''} {m['wall_s']} s",
                        file=sys.stderr,
                        flush=True,
                    )
            pool.shutdown()
    except KeyboardInterrupt:
        print("interrupted: stopping the running processes", file=sys.stderr)
        pool.shutdown(wait=False, cancel_futures=True)
        with _lock:
            _stopping.set()
            procs = list(_running)
        for proc in procs:
            kill_group(proc)
        pool.shutdown()
        report(out)
        return 130
    return report(out)


def versions(cwd):
    """python, rmm, cupy and rmm_fences as the suites' processes see them (same PYTHONPATH), the
    GPU and driver as rmm_fences' ``environment()`` reads them for every data file, and cuDF,
    cudf-polars and Polars where installed (from their metadata: importing cuDF here would meet
    what the plugin works around)."""
    probe = (
        "import json, sys\nimport importlib.metadata as md\n"
        "out = {'python': sys.version.split()[0]}\n"
        "for m in ('rmm', 'cupy', 'rmm_fences'):\n"
        "    try:\n        out[m] = getattr(__import__(m), '__version__', '?')\n"
        "    except Exception as e:\n        out[m] = f'not importable: {e!r}'[:300]\n"
        "try:\n    from rmm_fences._cuda import environment\n"
        "    e = environment()\n    out.update(gpu=e['gpu'], driver=e['driver'])\n"
        "except Exception:\n    pass\n"
        "dists = md.packages_distributions()\n"
        "for m in ('cudf', 'cudf_polars', 'polars'):\n"
        "    for d in dists.get(m, [])[:1]:\n        out[m] = md.version(d)\n"
        "print(json.dumps(out))"
    )
    try:  # cwd: not this checkout, whose rmm_fences has no compiled extension
        r = subprocess.run(
            [sys.executable, "-c", probe],
            cwd=cwd,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        return json.loads(r.stdout.strip().splitlines()[-1])
    except Exception as exc:  # noqa: BLE001 - a report without versions is still a report
        return {"error": repr(exc)[:300]}


def commit():
    """The rmm_fences commit under test: RMM_FENCES_COMMIT, else the repository's HEAD (marked
    when the package's sources differ from it; set RMM_FENCES_COMMIT when the installed wheel
    was built elsewhere)."""
    if os.environ.get("RMM_FENCES_COMMIT"):
        return os.environ["RMM_FENCES_COMMIT"]
    try:
        r = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        head = r.stdout.strip()
        if not head:
            return None
        dirty = subprocess.run(
            [
                "git",
                "-C",
                str(REPO),
                "status",
                "--porcelain",
                "--",
                "src",  # the package's sources (src/rmm_fences), C++ headers included
                "pyproject.toml",
                "CMakeLists.txt",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
        return head + ("+uncommitted changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _now():
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


# ------------------------------------------------------------ reading one process's files


def _merge(results, test, outcome, message=""):
    """Keep the worst outcome of a test's phases (an error in setup or teardown wins)."""
    old = results.get(test)
    if old is None or RANK.get(outcome, 9) > RANK.get(old["outcome"], 9):
        results[test] = {"outcome": outcome, "message": (message or "")[:MSG]}


def read_junit(path, file):
    """nodeid -> outcome and message; None when the report is missing or incomplete."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    module = file.removesuffix(".py").replace("/", ".")
    results = {}
    for tc in root.iter("testcase"):
        cls, name = tc.get("classname", ""), tc.get("name", "")
        if cls == module or cls.startswith(module + "."):  # back to file::Class::name[params]
            test = "::".join([file, *cls[len(module) + 1 :].split(".")]).rstrip(":") + "::" + name
        else:  # a collection error or module-level skip: classname "", name the module
            test = f"{cls}::{name}" if cls else name
        outcome, message = "passed", ""
        for child in tc:  # <failure>, <error> (setup, teardown), <skipped> (xfail: its type)
            o = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(child.tag)
            o = "xfailed" if o == "skipped" and child.get("type") == "pytest.xfail" else o
            if o and (outcome == "passed" or RANK[o] > RANK[outcome]):
                outcome, message = o, child.get("message") or child.text or ""
        _merge(results, test, outcome, message)
    return results


def read_state(path):
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError:
        return []
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:  # the line a crash cut short
            pass
    return events


def evaluate(out, meta):
    """One process: per-test results, its crash (or None), unraisables and hazards."""
    base, rc = out / meta["base"], meta["rc"]
    events = read_state(f"{base}.state")
    starts = [e["test"] for e in events if e.get("event") == "start"]
    from_state = {}
    for e in events:
        if e.get("event") == "result":
            _merge(from_state, e["test"], e["outcome"], e.get("message", ""))
    results = read_junit(f"{base}.xml", meta["file"])
    reason = (
        f"timeout after {meta['timeout_s']:g} s (killed)"
        if meta["timed_out"]
        else f"killed by {_signame(-rc)}"
        if rc is not None and rc < 0
        else f"exit code {rc} without a complete junit report"
        if results is None
        else None
    )
    died_in = starts[-1] if starts else "<collection>"
    if reason and results is not None:  # every test reported: it died on its way out
        reason += " after the junit report was written"
    elif reason:  # the tests it finished, from the plugin's log, and the one it died in
        results = {**from_state, died_in: {"outcome": "crashed", "message": reason}}
    for test, r in results.items():  # junit cannot tell xpassed from passed
        if r["outcome"] == "passed" and from_state.get(test, {}).get("outcome") == "xpassed":
            r["outcome"] = "xpassed"
    crash = reason and {
        "file": meta["file"],
        "test": died_in,
        "reason": reason,
        "log": f"{meta['base']}.log",
        "log_excerpt": _excerpt(f"{base}.log"),
    }
    unraisable = [
        {
            "file": meta["file"],
            "test": e.get("test"),
            "when": e.get("when"),
            "message": e.get("message") or "",
        }
        for e in events
        if e.get("event") == "unraisable"
    ]
    hazards = [
        {
            "file": meta["file"],
            "stats": e.get("stats") or {},
            "count": (e.get("stats") or {}).get("hazards", len(e.get("hazards") or [])),
            "hazards": (e.get("hazards") or [])[:10],
        }
        for e in events
        if e.get("event") == "hazards"
    ]
    return results, crash or None, unraisable, hazards


def _signame(num):
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _excerpt(path):
    """From the log: faulthandler's last report (a fatal signal, a test past --timeout-test),
    else the last 3000 characters."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    at = max(text.rfind("Fatal Python error"), text.rfind("Timeout ("))
    return text[at : at + 3000] if at >= 0 else text[-3000:]


# ------------------------------------------------------------ the report


def compare(chain, base, files):
    """A (suite, chain)'s counts, regressions, fixed tests, crashes, unraisables, hazards."""
    counts, regressions, fixed, crashes, unraisable, hazards = Counter(), [], [], [], [], []
    for file, (res, crash, unr, haz) in files.items():
        res = dict(res)
        if chain != "baseline" and file in base:
            ran = base[file][0]
            for test in ran:
                res.setdefault(test, {"outcome": "not run", "message": NOT_RUN})
            for test, c in res.items():
                b = ran.get(test, {"outcome": "absent", "message": ""})
                row = {
                    "test": test,
                    "part": file,
                    "baseline": b["outcome"],
                    "outcome": c["outcome"],
                    "message": c["message"] or b["message"],
                }
                if b["outcome"] in GOOD | {"absent"} and c["outcome"] in BAD:
                    regressions.append(row)
                elif b["outcome"] in BAD and c["outcome"] in ("passed", "xpassed"):
                    fixed.append(row)
        counts.update(r["outcome"] for r in res.values())
        crashes += [crash] if crash else []
        unraisable += unr
        hazards += haz
    return {
        "counts": {o: counts[o] for o in OUTCOMES},
        "regressions": regressions,
        "fixed": fixed,
        "crashes": crashes,
        "unraisable": unraisable,
        "hazards": hazards,
        "hazard_count": sum(h["count"] for h in hazards),
    }


def mark_shared(chain, entry, chains):
    """Marks each regression that the chain's rmm reference (its upstream alone, same
    allocator) has too, and counts the others (``own_regressions``; None: the reference did not
    run, or not on every part where the chain regressed)."""
    ref = reference_of(chain)
    ref_entry = chains.get(ref) if ref else None
    if ref and not entry["regressions"]:
        entry["own_regressions"] = 0  # nothing to check (a reference may run only where needed)
        return
    if ref_entry is None or not ref_entry.get("files_done"):
        entry["own_regressions"] = None
        return
    theirs = {r["test"] for r in ref_entry["regressions"]}
    for r in entry["regressions"]:
        if r["test"] in theirs:
            r["shared_with"] = ref
    ran = ref_entry.get("parts_done")  # None: a summary of an older harness, every file
    unchecked = ran is not None and any(r.get("part") not in ran for r in entry["regressions"])
    entry["own_regressions"] = (
        None if unchecked else sum("shared_with" not in r for r in entry["regressions"])
    )


def _part(job):
    return job.get("part", job["file"])  # run.json of an older harness: no parts


def finished(out, jobs):
    """What OUT holds for ``jobs``: (suite, chain) -> {part: evaluation}; the conditional
    references' jobs (``if_regressed``) not run; each finished job's meta by its base."""
    done, waiting, metas = {}, [], {}
    for job in jobs:
        try:
            meta = json.loads(Path(f"{out / job['base']}.meta.json").read_text())
        except (OSError, json.JSONDecodeError):
            waiting += [job] if job.get("if_regressed") else []
            continue
        metas[job["base"]] = meta
        done.setdefault((job["suite"], job["chain"]), {})[_part(job)] = evaluate(out, meta)
    return done, waiting, metas


def regressed(done, suite, chain, part):
    """Whether ``chain`` has a regression in the finished ``part`` of ``suite``."""
    files = done.get((suite, chain), {})
    if part not in files:
        return False
    base = done.get((suite, "baseline"), {})
    return bool(compare(chain, base, {part: files[part]})["regressions"])


def due_references(done, jobs):
    """The references' jobs among ``jobs`` that are due: a chain they are the reference of
    (``if_regressed``) regressed in their part."""
    return [
        j
        for j in jobs
        if any(regressed(done, j["suite"], c, _part(j)) for c in j.get("if_regressed", ()))
    ]


def report(out):
    """Write summary.json and summary.md from OUT's files and print the summary; exit code."""
    out = Path(out).resolve()
    try:
        run = json.loads((out / "run.json").read_text())
    except (OSError, json.JSONDecodeError):
        sys.exit(f"{out}/run.json missing or unreadable: not an output folder of this harness")
    done, waiting, metas = finished(out, run["jobs"])
    pending, envs = {}, {}  # (suite, chain) -> [part], env
    alone = {}  # (suite, chain) -> [part run again alone after an out-of-memory error]
    due = {j["base"] for j in due_references(done, waiting)}
    for job in run["jobs"]:
        key, part = (job["suite"], job["chain"]), _part(job)
        if job["base"] in metas:
            envs.setdefault(key, job["env"])
            if metas[job["base"]].get("retried_alone"):
                alone.setdefault(key, []).append(part)
        elif not job.get("if_regressed") or job["base"] in due:
            envs.setdefault(key, job["env"])
            pending.setdefault(key, []).append(part)
    results, failing = {}, False
    for suite, chain in envs:
        entry = compare(chain, done.get((suite, "baseline"), {}), done.get((suite, chain), {}))
        entry.update(
            env=envs[suite, chain],
            files_done=len(done.get((suite, chain), {})),
            parts_done=sorted(done.get((suite, chain), {})),
            files_pending=pending.get((suite, chain), []),
            files_run_alone=alone.get((suite, chain), []),
        )
        results.setdefault(suite, {})[chain] = entry
        failing |= bool(entry["crashes"] or entry["regressions"])
    for chains in results.values():
        for chain, entry in chains.items():
            mark_shared(chain, entry, chains)
    summary = {
        "generated": _now(),
        "out": str(out),
        **{k: run.get(k) for k in ("started", "argv", "fake", "commit", "versions", "suites")},
        "results": results,
        "exit_code": int(failing),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(markdown(summary))
    width = max(map(len, results), default=0)
    for suite, chains in results.items():
        for chain, e in chains.items():
            print(f"{suite:<{width}}  {line(chain, e)}")
            for r in e["regressions"][:50]:
                print(f"    {r['test']}: {r['baseline']} -> {r['outcome']}: {_first(r['message'])}")
            if len(e["regressions"]) > 50:
                print(f"    ... and {len(e['regressions']) - 50} more (summary.json)")
            for c in e["crashes"]:
                print(f"    CRASH in {c['test']}: {c['reason']} (log: {c['log']})")
            if e["files_pending"]:
                print(f"    {len(e['files_pending'])} file(s) not finished")
            if e.get("files_run_alone"):
                print(f"    {len(e['files_run_alone'])} file(s) run again alone (out of memory)")
    return summary["exit_code"]


def line(chain, e):
    c = e["counts"]
    extra = "".join(f", {c[o]} {o}" for o in OUTCOMES[4:] if c[o]) + (
        f", {c['error']} errors" if c["error"] else ""
    )
    return (
        f"{chain}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped{extra}; "
        f"{len(e['regressions'])} regressions"
        + (
            ""
            if e.get("own_regressions") is None
            else f" ({e['own_regressions']} not under its rmm reference)"
        )
        + f", {len(e['crashes'])} crashes, "
        f"{len(e['unraisable'])} unraisable, {e['hazard_count']} hazards"
    )


def _first(message):
    """The first line of a message; of an unraisable's, the first and the exception's line."""
    lines = [
        ln.strip()
        for ln in (message or "").splitlines()
        if ln.strip() and not ln.startswith(("Enable tracemalloc", "See https://docs.pytest.org"))
    ]
    if not lines:
        return ""
    return (
        f"{lines[0]} ... {lines[-1]}"
        if lines[0].startswith("Exception ignored") and len(lines) > 1
        else lines[0]
    )[:300]


VERSIONS_SHOWN = ("python", "rmm", "cupy", "rmm_fences", "cudf", "cudf_polars", "polars")


def markdown(s):
    v = s.get("versions") or {}
    md = [
        "# rmm_fences downstream run",
        "",
        f"{s['generated']}; rmm_fences commit `{s.get('commit')}`; "
        + ", ".join(f"{k} {v[k]}" for k in VERSIONS_SHOWN if k in v)
        + ("; GPU {gpu}, driver {driver}".format(**v) if v.get("gpu") and v.get("driver") else "")
        + ("; **fake run (RMM_FENCES_DS_FAKE=1)**" if s.get("fake") else ""),
        "",
        "| suite | chain | passed | failed | errors | skipped | regressions | not under its rmm "
        "reference | crashes | unraisable | hazards | processes finished |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for suite, chains in s["results"].items():
        for chain, e in chains.items():
            c = e["counts"]
            md.append(
                f"| {suite} | {chain} | {c['passed']} | {c['failed']} | {c['error']} | "
                f"{c['skipped'] + c['xfailed']} | {len(e['regressions'])} | "
                f"{'-' if e.get('own_regressions') is None else e['own_regressions']} | "
                f"{len(e['crashes'])} | {len(e['unraisable'])} | {e['hazard_count']} | "
                f"{e['files_done']} of {e['files_done'] + len(e['files_pending'])} |"
            )
    missing = [f"- {name}: `{p}`" for name, suite in s["suites"].items() for p in suite["missing"]]
    md += ["", "Globs that matched no file (skipped):", "", *missing] if missing else []
    for suite, chains in s["results"].items():
        for chain, e in chains.items():
            for title, items in (
                (
                    "Regressions",
                    [
                        f"`{r['test']}`: {r['baseline']} -> {r['outcome']}: {_first(r['message'])}"
                        + (f" (also under {r['shared_with']})" if r.get("shared_with") else "")
                        for r in e["regressions"]
                    ],
                ),
                (
                    "Crashes",
                    [
                        f"`{c['file']}` in `{c['test']}`: {c['reason']} ({c['log']})"
                        for c in e["crashes"]
                    ],
                ),
                (
                    "Fixed",
                    [f"`{r['test']}`: {r['baseline']} -> {r['outcome']}" for r in e["fixed"]],
                ),
                (
                    "Unraisable",
                    [
                        f"`{u['test']}` ({u['when']}): {_first(u['message'])}"
                        for u in e["unraisable"]
                    ],
                ),
                (
                    "Hazards",
                    [
                        f"`{h['file']}`: {h['count']}: {'; '.join(h['hazards'][:3])}"
                        for h in e["hazards"]
                        if h["count"]
                    ],
                ),
                ("Not finished", [f"`{f}`" for f in e["files_pending"]]),
                (
                    "Run again alone after an out-of-memory error among the parallel runs",
                    [f"`{f}`" for f in e.get("files_run_alone", [])],
                ),
            ):
                if items:
                    md += ["", f"## {suite} / {chain}: {title} ({len(items)})", ""]
                    md += [f"- {i}" for i in items[:100]]
                    if len(items) > 100:
                        md.append(f"- and {len(items) - 100} more (summary.json)")
    return "\n".join(md) + "\n"


def main(argv=None):
    args = parse_args(argv)
    return report(args.report_only) if args.report_only is not None else run_all(args)


if __name__ == "__main__":
    sys.exit(main())
