#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Check rmm_fences on a CUDA machine and write a report folder.

    python tools/gpu_check.py --out DIR [--parts PART ...] [--limit PART=SECONDS ...] \\
        [--suite NAME=PATH ...] [--downstream-args ARGS] [--bench-args ARGS] \\
        [--asv-args ARGS] [--allow-missing STACKS] [-- PYTEST_ARGS]

From a checkout (the parts run in its root), with the Python whose environment holds rmm_fences,
rmm, CuPy and the test extra (``make install`` builds all of it into .venv, with the host test
harness and the benchmarks' native loops in place; ``.venv/bin/python tools/gpu_check.py``).
Parts, in this order (``--parts``, default ``tests bench``; ``all``: every one):

  tests       ``pytest -m gpu`` with RMM_FENCES_REQUIRE_GPU=1 (a gpu test that skips fails),
              failures printed as they happen (pytest-instafail, where installed), the Python
              stacks of a test running over 120 s dumped (faulthandler); PYTEST_ARGS after
              ``--`` are added (``-- -m ''``: the whole suite). Past its time limit, the
              threads of the pytest process (and their native stacks, where gdb is installed)
              go to tests_hang.txt before it is stopped.
  bench       ``benchmarks/alloc_free_pairs.py`` (``--bench-args``): allocate + deallocate per
              pair from Python and in the native loop, and each chain's ratio to rmm's pool.
  asv         the asv suite in quick mode (each benchmark once, nothing saved:
              ``asv run --python=same --quick --dry-run``; ``--asv-args``, e.g.
              ``"--bench alloc_free"``); records this machine for asv (~/.asv-machine.json)
              as ``make bench`` does.
  downstream  ``tools/downstream/run.py`` over the suites fetched into .downstream/ by
              tools/downstream/fetch_sources.sh (or ``--suite NAME=PATH``), output in
              DIR/downstream, with ``--resume`` and a ``--deadline`` inside the time limit:
              the same command again continues an interrupted or unfinished run.
              ``--downstream-args``: more options (``"--jobs 8 --chains pool"``).
  doctor      ``rmm-fences doctor --quick`` (the hazard matrix), as JSON in DIR/doctor.json.

DIR receives report.md (the commit, the GPU, the driver and the package versions, then a
summary table: each part's status, pytest's summary line, the regressions per suite and chain,
the benchmark ratios), summary.json (the same as data) and each part's log; both summaries are
rewritten after every part. Exit code: 0 when every part passed, 1 when one failed, ran out of
time or found a regression, 2 when nothing could run (no CUDA GPU, or rmm_fences not
importable: said on stderr and in the report, as ``make demo`` does).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
from downstream.run import kill_group  # noqa: E402 - SIGTERM, then SIGKILL, to a session

PARTS = ("tests", "bench", "asv", "downstream", "doctor")
DEFAULT_PARTS = ("tests", "bench")
LIMITS = {"tests": 1800, "bench": 600, "asv": 1800, "downstream": 3600, "doctor": 900}
# the distributions whose versions the report lists (any CUDA suffix: rmm-cu13, cupy-cuda13x)
PACKAGES = re.compile(
    r"^(rmm|librmm|rapids|cupy|cuda|numpy|cudf|dask|distributed|torch|pytest|hypothesis|asv)"
)
PYTEST_SUMMARY = re.compile(r"^=+ (.*\b(passed|failed|error|errors|skipped|no tests ran)\b.*) =+$")
# the child that reports what the parts will see: the packages, the devices, the driver
PROBE = r"""
import json, sys
from importlib.metadata import distributions
out = {"python": sys.version.split()[0], "executable": sys.executable, "packages": {}}
pattern = __import__("re").compile(sys.argv[1])
for dist in distributions():
    name = (dist.metadata["Name"] or "").lower().replace("_", "-")
    if pattern.match(name):
        out["packages"][name] = dist.version
try:
    import rmm_fences
    from rmm_fences._cuda import device_count, no_device_reason
    out["rmm_fences"] = f"{rmm_fences.__version__} ({rmm_fences.__file__})"
    out["device_count"], out["no_device"] = device_count(), no_device_reason()
except Exception as exc:
    out["device_count"], out["no_device"] = 0, f"rmm_fences is not importable: {exc!r}"
    out["no_rmm_fences"] = True
try:
    from cuda.bindings import runtime as rt
    err, v = rt.cudaDriverGetVersion()
    out["driver_cuda"] = f"{v // 1000}.{v % 1000 // 10}" if v else "none (no driver loaded)"
    err, v = rt.cudaRuntimeGetVersion()
    out["runtime_cuda"] = f"{v // 1000}.{v % 1000 // 10}"
    out["devices"] = []
    for i in range(out["device_count"]):
        err, p = rt.cudaGetDeviceProperties(i)
        out["devices"].append(
            f"{p.name.decode()}, {p.totalGlobalMem >> 20} MiB, sm_{p.major}{p.minor}"
        )
except Exception as exc:
    out["cuda_error"] = repr(exc)
print(json.dumps(out))
"""


def parse_args(argv):
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="the report folder")
    p.add_argument(
        "--parts",
        nargs="+",
        choices=(*PARTS, "all"),
        default=list(DEFAULT_PARTS),
        metavar="PART",
        help=f"which parts to run: {', '.join(PARTS)} or all (default: tests bench)",
    )
    p.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="PART=SECONDS",
        help="a part's time limit (defaults: "
        + ", ".join(f"{k} {v}" for k, v in LIMITS.items())
        + ")",
    )
    p.add_argument(
        "--suite",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a downstream suite (default: .downstream/rmm-tests and .downstream/cupy-tests, "
        "those fetched)",
    )
    for part in ("downstream", "bench", "asv"):
        p.add_argument(f"--{part}-args", default="", metavar="ARGS", help=f"more {part} options")
    p.add_argument(
        "--allow-missing",
        metavar="STACKS",
        help="optional stacks this machine lacks (e.g. cudf,torch): their gpu tests may skip "
        "(RMM_FENCES_ALLOW_MISSING)",
    )
    p.add_argument("--quiet", action="store_true", help="write the parts' output to the logs only")
    p.add_argument(
        "--without-gpu",
        action="store_true",
        help="run the parts even where no CUDA GPU is found (to try this script on a CPU "
        "machine: the parts then fail)",
    )
    args = p.parse_args(argv)
    args.pytest_args = pytest_args  # the parts run in the checkout's root: paths from there
    for i, suite in enumerate(args.suite):  # NAME=PATH from here
        name, sep, path = suite.partition("=")
        if not sep:
            p.error(f"--suite {suite!r}: expected NAME=PATH")
        args.suite[i] = f"{name}={Path(path).resolve()}"
    args.parts = [q for q in PARTS if q in args.parts or "all" in args.parts]
    args.limits = dict(LIMITS)
    for item in args.limit:
        part, _, seconds = item.partition("=")
        if part not in PARTS or not seconds.replace(".", "", 1).isdigit():
            p.error(f"--limit {item!r}: expected PART=SECONDS with PART one of {', '.join(PARTS)}")
        args.limits[part] = float(seconds)
    return args


# ------------------------------------------------------------ what this machine is


def git(*args):
    try:
        r = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    except OSError:
        return ""
    return r.stdout.strip() if r.returncode == 0 else ""


def machine():
    """The commit, the GPUs, the driver and the package versions the parts will see."""
    head = git("rev-parse", "HEAD")
    if head:
        branch, subject = git("rev-parse", "--abbrev-ref", "HEAD"), git("log", "-1", "--format=%s")
        head = f"{head} ({branch}: {subject[:72]}{'...' if len(subject) > 72 else ''})"
        if git("status", "--porcelain", "--untracked-files=no"):
            head += " +uncommitted changes"
    info = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": os.uname().nodename,
        "commit": head or "not a git checkout",
    }
    try:
        r = subprocess.run(
            [sys.executable, "-c", PROBE, PACKAGES.pattern],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        info.update(json.loads(r.stdout.strip().splitlines()[-1]))
    except (subprocess.SubprocessError, json.JSONDecodeError, IndexError) as exc:
        info.update(device_count=0, no_device=f"the environment probe failed: {exc!r}")
    smi = shutil.which("nvidia-smi")
    if smi:
        r = subprocess.run(
            [smi, "--query-gpu=index,name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        )
        info["nvidia_smi"] = r.stdout.strip().splitlines() or [r.stderr.strip()[:300]]
    else:
        info["nvidia_smi"] = ["nvidia-smi not found"]
    info["compute_sanitizer"] = shutil.which("compute-sanitizer") or next(
        (str(p) for p in sorted(Path("/usr/local").glob("cuda*/bin/compute-sanitizer"))),
        "not found",
    )
    return info


# ------------------------------------------------------------ running one part


def run_part(cmd, log, limit, *, cwd=REPO, env=None, echo=True, on_timeout=None):
    """Run ``cmd`` in a session of its own, its output into ``log`` (and echoed), stopping it
    after ``limit`` seconds: {"rc", "timed_out", "seconds"}."""
    start = time.monotonic()
    with open(log, "w") as f:
        f.write(f"$ {shlex.join(map(str, cmd))}\n")
        f.flush()
        proc = subprocess.Popen(
            list(map(str, cmd)),
            cwd=cwd,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            text=True,
            errors="replace",
        )

        def copy():
            for line in proc.stdout:
                f.write(line)
                f.flush()
                if echo:
                    sys.stdout.write(line)
                    sys.stdout.flush()

        reader = threading.Thread(target=copy, daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            if on_timeout:
                on_timeout(proc.pid)
            kill_group(proc)
        reader.join(timeout=30)
        if timed_out:
            f.write(f"\n=== stopped: past its time limit of {limit:g} s\n")
    return {"rc": proc.returncode, "timed_out": timed_out, "seconds": time.monotonic() - start}


def hang_report(path):
    """What a stuck pytest process does: each thread's state in the kernel's view, the GPUs'
    load, and the native stacks where gdb can attach."""

    def dump(pid):
        lines = [f"pytest (pid {pid}) past its time limit: threads (tid, name, wchan, syscall)"]
        for task in sorted(Path(f"/proc/{pid}/task").glob("*"), key=lambda t: int(t.name)):
            fields = []
            for name in ("comm", "wchan", "syscall"):
                try:
                    fields.append((task / name).read_text().strip()[:40])
                except OSError as exc:
                    fields.append(f"<{exc.strerror}>")
            lines.append(f"{task.name} {' '.join(fields)}")
        if shutil.which("nvidia-smi"):
            r = subprocess.run(
                ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv"],
                capture_output=True,
                text=True,
            )
            lines += ["", r.stdout.strip()]
        gdb = shutil.which("gdb") or shutil.which("cuda-gdb")
        if gdb:
            cmd = [gdb, "-p", str(pid), "-batch", "-nx", "-ex", "set pagination off"]
            cmd += ["-ex", "info threads", "-ex", "thread apply all bt 40"]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
                lines += ["", "native stacks (gdb):", r.stdout, r.stderr]
            except subprocess.TimeoutExpired:
                lines += ["", "gdb printed no stacks in 90 s"]
        else:
            lines += ["", "no gdb: no native stacks"]
        Path(path).write_text("\n".join(lines) + "\n")

    return dump


def pytest_summary(log):
    lines = [m.group(1) for ln in read(log).splitlines() if (m := PYTEST_SUMMARY.match(ln))]
    return lines[-1] if lines else "no pytest summary line"


def read(path):
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def last_line(path):
    lines = [ln for ln in read(path).splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def status(run, ok):
    if run["timed_out"]:
        return "timed out"
    return "passed" if ok else "failed"


# ------------------------------------------------------------ the parts


def part_tests(args, out):
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-o", "faulthandler_timeout=120"]
    cmd += [f"--junitxml={out / 'tests.xml'}"]
    if plugin_installed("pytest_instafail"):
        cmd.append("--instafail")
    env = {"RMM_FENCES_REQUIRE_GPU": "1"}
    if args.allow_missing:
        env["RMM_FENCES_ALLOW_MISSING"] = args.allow_missing
    run = run_part(
        cmd + args.pytest_args,
        out / "tests.log",
        args.limits["tests"],
        env=env,
        echo=not args.quiet,
        on_timeout=hang_report(out / "tests_hang.txt"),
    )
    result = pytest_summary(out / "tests.log")
    if run["timed_out"]:
        result += "; thread states: tests_hang.txt"
    return run, status(run, run["rc"] == 0), result, {}


def plugin_installed(module):
    r = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True)
    return r.returncode == 0


def part_bench(args, out):
    cmd = [sys.executable, "benchmarks/alloc_free_pairs.py", *shlex.split(args.bench_args)]
    run = run_part(cmd, out / "bench.log", args.limits["bench"], echo=not args.quiet)
    rows = bench_rows(read(out / "bench.log"))
    ref = next((r for r in rows if r["resource"].replace(" ", "") == "rmm_pool(cuda)"), None)
    ref = ref or (rows[0] if rows else None)
    for r in rows:
        r["python_ratio"] = r["python_us"] / ref["python_us"]
        r["native_ratio"] = r["native_ns"] / ref["native_ns"]
    result = "; ".join(f"{r['resource']} {r['native_ratio']:.2f}x" for r in rows if r is not ref)
    if ref:
        result = f"native pair / {ref['resource']}: {result or 'the one row'}"
    else:
        result = f"no rows: {last_line(out / 'bench.log')}"
    return run, status(run, run["rc"] == 0 and bool(rows)), result, {"rows": rows, "ref": ref}


def bench_rows(text):
    """alloc_free_pairs.py's rows: resource, us per pair from Python, ns in the native loop."""
    rows = []
    for line in text.splitlines():
        parts = line.rsplit(None, 2)
        if len(parts) == 3:
            try:
                py, native = float(parts[1]), float(parts[2])
            except ValueError:
                continue
            rows.append({"resource": parts[0], "python_us": py, "native_ns": native})
    return rows


def part_asv(args, out):
    asv = [sys.executable, "-m", "asv"]
    log = out / "asv.log"
    run = run_part(
        [*asv, "machine", "--yes"], out / "asv_machine.log", 120, cwd=REPO / "asv_bench", echo=False
    )
    if run["rc"] == 0:
        cmd = [*asv, "run", "--python=same", "--quick", "--dry-run", "--show-stderr"]
        run = run_part(
            cmd + shlex.split(args.asv_args),
            log,
            args.limits["asv"],
            cwd=REPO / "asv_bench",
            echo=not args.quiet,
        )
    else:
        log = out / "asv_machine.log"
    counts = {"ok": 0, "failed": 0, "skipped": 0}
    for line in read(log).splitlines():
        m = re.search(r"··· (\S+)\s+(ok|failed)$", line.strip())
        if m:
            counts[m.group(2)] += 1
        counts["skipped"] += "asv: skipped:" in line
    result = (
        f"{counts['ok']} benchmarks ok, {counts['failed']} failed; {counts['skipped']} "
        "parameter sets skipped (asv.log says why)"
    )
    ok = run["rc"] == 0 and counts["failed"] == 0 and counts["ok"] > 0
    return run, status(run, ok), result, counts


def part_downstream(args, out):
    suites = args.suite or [
        f"{name}=.downstream/{name}-tests"
        for name in ("rmm", "cupy")
        if (REPO / ".downstream" / f"{name}-tests").is_dir()
    ]
    if not suites:
        reason = "no suite: fetch them with tools/downstream/fetch_sources.sh, or give --suite"
        return None, "not run", reason, {}
    limit = args.limits["downstream"]
    cmd = [sys.executable, "tools/downstream/run.py", "--out", out / "downstream", "--resume"]
    cmd += ["--deadline", f"{max(limit - 120, limit * 0.8):.0f}"]
    for suite in suites:
        cmd += ["--suite", suite]
    run = run_part(
        cmd + shlex.split(args.downstream_args),
        out / "downstream.log",
        limit,
        echo=not args.quiet,
    )
    try:
        summary = json.loads((out / "downstream" / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return run, status(run, False), "no summary.json (downstream.log says why)", {}
    rows = [
        {
            "suite": suite,
            "chain": chain,
            "counts": e["counts"],
            "regressions": len(e["regressions"]),
            "crashes": len(e["crashes"]),
            "pending": len(e["files_pending"]),
        }
        for suite, chains in summary["results"].items()
        for chain, e in chains.items()
    ]
    bad = any(r["regressions"] or r["crashes"] for r in rows)
    pending = any(r["pending"] for r in rows)
    result = (
        f"{sum(r['regressions'] for r in rows)} regressions, {sum(r['crashes'] for r in rows)} "
        f"crashes, {sum(r['pending'] for r in rows)} files not finished over {len(rows)} "
        f"suite/chain pairs (downstream/summary.md)"
        + ("; fake run (RMM_FENCES_DS_FAKE=1)" if summary.get("fake") else "")
    )
    state = status(run, run["rc"] == 0 and not bad and not pending)
    if pending and not bad:  # the deadline came first: the same command again goes on
        state = "not finished"
        result += "; the same command again runs the rest (--resume)"
    return run, state, result, {"rows": rows}


def part_doctor(args, out):
    cmd = [sys.executable, "-m", "rmm_fences", "doctor", "--quick", "--json", out / "doctor.json"]
    run = run_part(cmd, out / "doctor.log", args.limits["doctor"], echo=not args.quiet)
    return run, status(run, run["rc"] == 0), last_line(out / "doctor.log"), {}


# ------------------------------------------------------------ the report


def report(out, info, parts):
    """report.md and summary.json from what is known so far."""
    (out / "summary.json").write_text(json.dumps({"machine": info, "parts": parts}, indent=1))
    pkgs = ", ".join(f"{k} {v}" for k, v in sorted(info.get("packages", {}).items()))
    head = [
        ("commit", info["commit"]),
        ("date", info["date"]),
        ("host", info["host"]),
        *((f"GPU {i}", d) for i, d in enumerate(info.get("devices", []))),
        *([] if info.get("devices") else [("GPU", "none found")]),
        ("nvidia-smi", "; ".join(info.get("nvidia_smi", []))),
        (
            "CUDA driver / runtime",
            f"{info.get('driver_cuda', '?')} / {info.get('runtime_cuda', '?')}",
        ),
        ("compute-sanitizer", info.get("compute_sanitizer", "?")),
        ("python", f"{info.get('python', '?')} ({info.get('executable', '?')})"),
        ("rmm_fences", info.get("rmm_fences", "not importable")),
        ("packages", pkgs or "?"),
    ]
    md = ["# rmm_fences GPU check", "", "| | |", "| --- | --- |"]
    md += [f"| {k} | {cell(v)} |" for k, v in head]
    if not info.get("device_count"):
        md += ["", f"**No CUDA GPU: {info.get('no_device')}.**"]
    md += ["", "| part | status | seconds | result | log |", "| --- | --- | ---: | --- | --- |"]
    for name, p in parts.items():
        md.append(
            f"| {name} | {p['status']} | {p.get('seconds', 0):.0f} | {cell(p['result'])} | "
            f"{p.get('log', '')} |"
        )
    bench = parts.get("bench", {}).get("detail", {})
    if bench.get("rows"):
        md += [
            "",
            f"## bench: allocate + deallocate per pair (ratio to {bench['ref']['resource']})",
        ]
        md += ["", "| resource | Python us | ratio | native ns | ratio |"]
        md += ["| --- | ---: | ---: | ---: | ---: |"]
        md += [
            f"| `{r['resource']}` | {r['python_us']:.3f} | {r['python_ratio']:.2f}x | "
            f"{r['native_ns']:.1f} | {r['native_ratio']:.2f}x |"
            for r in bench["rows"]
        ]
    down = parts.get("downstream", {}).get("detail", {})
    if down.get("rows"):
        md += ["", "## downstream: per suite and chain", ""]
        md += [
            "| suite | chain | passed | failed | skipped | regressions | crashes | not finished |"
        ]
        md += ["| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        md += [
            f"| {r['suite']} | {r['chain']} | {r['counts']['passed']} | {r['counts']['failed']} | "
            f"{r['counts']['skipped']} | {r['regressions']} | {r['crashes']} | {r['pending']} |"
            for r in down["rows"]
        ]
    (out / "report.md").write_text("\n".join(md) + "\n")


def cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


RUNNERS = {name: globals()[f"part_{name}"] for name in PARTS}


def main(argv=None):
    args = parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    info = machine()
    parts = {}
    if not info.get("device_count") and not (args.without_gpu and not info.get("no_rmm_fences")):
        need = "rmm_fences" if info.get("no_rmm_fences") else "a CUDA GPU"
        parts = {name: {"status": "not run", "result": f"needs {need}"} for name in args.parts}
        report(out, info, parts)
        print(read(out / "report.md"))
        print(f"gpu_check.py: {info['no_device']}; this needs {need}.", file=sys.stderr)
        print(f"gpu_check.py: nothing was run; report: {out / 'report.md'}", file=sys.stderr)
        return 2
    for name in args.parts:
        parts[name] = {"status": "running", "result": ""}
        report(out, info, parts)
        print(f"=== gpu_check: {name} (time limit {args.limits[name]:g} s)", flush=True)
        run, state, result, detail = RUNNERS[name](args, out)
        parts[name] = {"status": state, "result": result, "detail": detail, "log": f"{name}.log"}
        if run:
            parts[name].update(rc=run["rc"], seconds=run["seconds"], timed_out=run["timed_out"])
        report(out, info, parts)
    print(read(out / "report.md"))
    failed = [n for n, p in parts.items() if p["status"] != "passed"]
    if failed:
        print(f"gpu_check.py: not passed: {', '.join(failed)}; report: {out / 'report.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
