# SPDX-License-Identifier: Apache-2.0
"""Threads of the tests: a body run on N threads with their failures collected, and the stacks
of a thread that is stuck."""

import os
import threading
from pathlib import Path


def run_threads(count: int, body) -> list[Exception]:
    """Runs ``body(i)`` on ``count`` threads (``i`` = 0 .. count - 1), all started before any is
    joined, and returns the exceptions they raised (empty when every body returned): the test
    asserts on them in its own thread."""
    failures = []

    def run(i):
        try:
            body(i)
        except Exception as exc:  # reported by the test
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failures


def dump_stacks(reason: str) -> None:
    """Print every Python thread's stack, and the kernel's view of every native thread of this
    process (name, wait channel, system call), to stderr: called by a test whose thread is
    stuck. (A debugger cannot attach to its own ancestor; tools/gpu_check.py attaches one from
    outside when a run passes its deadline.)"""
    import faulthandler
    import sys

    print(f"\n=== {reason}: Python stacks", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(sys.stderr, all_threads=True)
    print("=== native threads: tid, name, wchan, syscall", file=sys.stderr, flush=True)
    for task in sorted(Path(f"/proc/{os.getpid()}/task").iterdir(), key=lambda p: int(p.name)):

        def read(name, task=task):
            try:
                return (task / name).read_text().strip().split("\n")[0][:80]
            except OSError as exc:
                return f"<{exc.strerror}>"

        print(task.name, read("comm"), read("wchan"), read("syscall"), file=sys.stderr)
    sys.stderr.flush()
