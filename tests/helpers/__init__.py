# SPDX-License-Identifier: Apache-2.0
"""The test suite's shared code, one package imported as ``helpers``: pyproject.toml's pytest
``pythonpath`` puts tests/ on ``sys.path`` (with the host test harness, tests/native, and the
benchmarks' library, benchmarks/), and child processes that import any of it get the same roots
from ``helpers.children.child_env()``.

- ``paths``: the repository's folders and files the tests read, the child scripts below
- ``gate``: the GPU gate (a pytest plugin that tests/conftest.py registers): ``gpu`` tests skip
  without a device, and fail instead under RMM_FENCES_REQUIRE_GPU=1
- ``fixtures``: the shared fixtures (a pytest plugin that tests/conftest.py registers)
- ``children``: child processes: their environment, a child that reports a JSON line
- ``threads``: a body run on N threads, their failures collected; the stacks of stuck threads
- ``fill_check``: the multi-threaded fill/check traffic of the GPU tests of the resources
- ``reduce_cases``: the chains, fresh inputs and reference sums of the reduce's GPU tests
- ``stateful``: the hypothesis settings of the state-machine tests of the C++ cores
- ``fake_upstream``: ``FakeUpstream``, an rmm resource handing out fake addresses (CPU tests)
- ``rmm_log``: a sample of rmm's allocation log
- ``scripts``: scripts of tools/ (no package on ``sys.path``) imported by their path
- ``torch_child``, ``vmm_child``, ``vmm_pool_child``, ``sanitizer_child``: scripts the tests run
  as child processes
- ``alloc_shapes``: allocation logs of shapes the recorded ones lack, made from a seed
- ``numpy_row_stack``: ``numpy.row_stack`` back for numba-cuda (imported before cuDF; each Dask
  worker of the GPU tests preloads it)
"""
