# SPDX-License-Identifier: Apache-2.0
"""A fake test suite for tools/downstream/run.py (and tools/gpu_check.py's downstream part):
a pass, a skip, an xfail, parameters; a test that fails and one that crashes the process only
under a chain (RMM_FENCES_DS_CHAIN set); an exception raised in ``__del__``."""

import textwrap

FAKE_SUITE = {
    "test_pass.py": """
        import pytest

        def test_a():
            pass

        @pytest.mark.skip(reason="not here")
        def test_skipped():
            pass

        @pytest.mark.xfail(reason="known")
        def test_xfail():
            assert False

        class TestParams:
            @pytest.mark.parametrize("x", [1, 2])
            def test_p(self, x):
                pass
        """,
    "test_chain_fail.py": """
        import os

        def test_ok():
            pass

        def test_fails_with_chain():
            assert not os.environ.get("RMM_FENCES_DS_CHAIN"), "chain is set"
        """,
    "test_segv.py": """
        import os
        import signal

        def test_before():
            pass

        def test_segv():
            if os.environ.get("RMM_FENCES_DS_CHAIN"):
                os.kill(os.getpid(), signal.SIGSEGV)

        def test_after_1():
            pass

        def test_after_2():
            pass
        """,
    "test_unraisable.py": """
        import gc

        class Bad:
            def __del__(self):
                raise RuntimeError("boom in __del__")

        def test_del():
            bad = Bad()
            del bad
            gc.collect()
        """,
}


def write_fake_suite(root):
    """The fake suite's files in the folder ``root`` (made), which is returned."""
    root.mkdir(parents=True, exist_ok=True)
    for name, text in FAKE_SUITE.items():
        (root / name).write_text(textwrap.dedent(text))
    return root
