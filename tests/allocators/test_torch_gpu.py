# SPDX-License-Identifier: Apache-2.0
"""rmm_fences.allocators.torch on a real GPU, each case in its own process (PyTorch picks its
allocator once per process): the two record_stream hazards observed under rmm's allocator and
absent under ours, the rules of choosing the allocator, and a training step of each model
with the same losses as under PyTorch's own allocator."""

import math

import pytest

from benchmarks import _torch_workloads as workloads

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def _needs_torch():
    pytest.importorskip("torch")
    pytest.importorskip("rmm.allocators.torch")


def hazard(allocator, pattern, trials=10):
    out = workloads.run(["hazard", allocator, pattern, "--trials", str(trials)], allocator)
    print(f"\n{pattern} under {allocator}: {out}")
    return out


@pytest.mark.parametrize("pattern", workloads.PATTERNS)
def test_record_stream_hazard_is_seen_under_rmm_and_absent_under_ours(pattern):
    # PyTorch's allocator honours record_stream: the reference outcome.
    assert hazard("torch", pattern)["corrupted"] == 0
    # rmm_torch_allocator sets no record_stream hook: the block is reused on its allocation
    # stream while the recorded stream still reads it.
    assert hazard("rmm_pool", pattern)["corrupted"] > 0
    # Ours: at the free, the allocation stream waits on an event of each recorded stream.
    ours = hazard("fences_pool", pattern)
    assert ours["corrupted"] == 0
    assert ours["stats"]["record_stream_calls"] >= 10
    assert ours["stats"]["stream_waits"] >= 10
    assert ours["stats"]["leaked_blocks"] == 0 and ours["stats"]["rejected_frees"] == 0


@pytest.mark.parametrize("pattern", workloads.PATTERNS)
def test_record_stream_honoured_with_the_tracker_in_the_chain(pattern):
    out = hazard("fences_tracker", pattern)
    assert out["corrupted"] == 0
    assert out["stats"]["stream_waits"] >= 10
    # The frees reach the tracker ordered after the recorded streams, on the allocation
    # stream: nothing to report.
    assert out["hazards"] == []


def test_install_after_pytorch_initialized_cuda_is_refused():
    out = workloads.run(["switch", "after_init"])
    assert out["error"] is not None and "before" in out["error"], out
    assert not out["installed"] and out["backend"] == "native"


def test_install_twice_is_refused():
    out = workloads.run(["switch", "twice"])
    assert out["error"] is not None and "already" in out["error"], out
    assert out["installed"] and out["backend"] == "pluggable"


def test_install_first_then_pytorch_allocates_through_it():
    out = workloads.run(["switch", "first"])
    assert out == {**out, "error": None, "installed": True, "backend": "pluggable"}


@pytest.mark.parametrize(("model", "batch"), [("gpt2_small", 2), ("resnet50", 16)])
@pytest.mark.parametrize("allocator", ["fences_pool", "fences_tracker", "fences_vmm_pool"])
def test_training_steps_match_pytorchs_allocator(model, batch, allocator):
    args = ["--steps", "3", "--warmup", "0", "--batch", str(batch)]
    ref = workloads.run(["train", "torch", model, *args], "torch")
    got = workloads.run(["train", allocator, model, *args], allocator)
    print(f"\n{model}: torch {ref['losses']}, {allocator} {got['losses']}, {got.get('stats')}")
    assert all(math.isfinite(x) for x in ref["losses"])
    # Same seed, same kernels: equal within bf16 tolerance (the first step bit for bit).
    assert got["losses"][0] == pytest.approx(ref["losses"][0], rel=1e-5)
    assert got["losses"] == pytest.approx(ref["losses"], rel=2e-2)
    stats = got["stats"]
    assert stats["allocation.all.allocated"] > 0 and stats["rejected_frees"] == 0
    assert stats["allocated_bytes.all.peak"] >= stats["allocated_bytes.all.current"]
    if allocator == "fences_tracker":
        assert got["hazards"] == []  # one stream: no cross-stream use to report


def test_mem_pool_routes_the_context_and_switches_back():
    out = workloads.run(["mempool", "route"])
    print(f"\nmem_pool route: {out}")
    assert out["ok"] and out["backend"] == "native"  # PyTorch's own allocator stays global
    assert out["segments_inside"] >= 1  # x and the product took segments from the pool
    assert out["segments_after"] == out["segments_inside"]  # outside: PyTorch's own pool
    assert out["torch_allocated"] >= out["outside_bytes"]  # torch.cuda.memory_stats() works


def test_mem_pool_captures_and_replays_one_step():
    out = workloads.run(["mempool", "graph"])
    print(f"\nmem_pool graph: {out}")
    assert out["ok"], out["replays"]
    assert out["segments"] >= 1
