# SPDX-License-Identifier: Apache-2.0
"""The Python frames ``capture_stacks`` records (``_python_frames``, which the tracker calls from
C on every allocation and free): no GPU needed.

The tracker asks from C code, with no Python frame of its own, and at any moment, also while
Python tears down a function's frame. When the function was called from C (a callback, ``map``,
an event loop's handle), CPython 3.12 and later leave its C entry frame current during that
teardown; ``sys._getframe(0)`` there builds a frame object from the entry frame's uninitialized
``frame_obj`` field: a frame named ``<interpreter trampoline>``, or a crash. A run of cudf-polars'
tests under the tracker with capture_stacks died so, on an event loop's thread."""

from helpers.children import child_env

#: A child: blocks of a function that ``map`` (C) calls die as its frame is torn down; each
#: block's weakref calls ``defaultdict.__getitem__`` (C), which stores what ``_python_frames``
#: (C, no frame of its own) returns there, from C code all the way. The C stack under the entry
#: frame is varied (recursion depths) so that its stale contents differ from call to call.
TEARDOWN = r"""
import json, sys, weakref
from collections import defaultdict
from rmm_fences._lib.memory_resource import _python_frames

class Block:
    pass

seen = defaultdict(_python_frames)
refs = []

def dies_in_teardown(i):
    block = Block()
    ref = weakref.ref(block, seen.__getitem__)
    hash(ref)  # a weak reference hashes its object's hash, once, while it lives
    refs.append(ref)
    return i

def at_depth(depth):
    if depth:
        return at_depth(depth - 1)
    return sum(map(dies_in_teardown, range(50)))

def caller_of_map():
    for depth in range(64):
        at_depth(depth)

caller_of_map()
texts = list(seen.values())
assert len(texts) == 64 * 50, len(texts)
bad = [t for t in texts if t is None or "<shim>" in t or "trampoline" in t]
innermost = {t.splitlines()[-1].rsplit(" in ", 1)[-1] for t in texts if t}
first = str(bad[0])[-300:] if bad else ""
print(json.dumps({"innermost": sorted(innermost), "bad": len(bad), "first": first}))
sys.exit(1 if bad else 0)
"""


def test_frames_are_the_callers_while_a_frame_called_from_c_is_torn_down(json_child):
    """Every record holds complete frames only, the innermost being the code that called the C
    function (``at_depth``, which called ``map``), never the interpreter's entry frame; the
    child neither crashes nor records ``<interpreter trampoline>``."""
    rc, out, stdout, stderr = json_child(TEARDOWN, env=child_env())
    assert rc == 0, stdout[-3000:] + stderr[-3000:]
    assert out["innermost"] == ["at_depth"], out


def test_frames_of_a_plain_call_list_the_callers_innermost_last():
    from rmm_fences._lib.memory_resource import _python_frames

    def inner():
        return _python_frames()

    text = inner()
    lines = text.splitlines()
    assert lines[-1].endswith(", in inner") and lines[-2].endswith(
        ", in test_frames_of_a_plain_call_list_the_callers_innermost_last"
    )
    assert all(line.startswith('  File "') for line in lines) and len(lines) <= 32
