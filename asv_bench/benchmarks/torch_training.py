# SPDX-License-Identifier: Apache-2.0
"""Training steps of a GPT-2-small-shaped transformer (12 layers, 768 wide, sequence 1024,
batch 8, bf16 autocast, AdamW) and of ResNet-50 (batch 128, channels-last, bf16 autocast,
AdamW) under each PyTorch allocator: PyTorch's own (with and without expandable segments),
rmm_torch_allocator over CudaAsync and over rmm's pool, rmm_fences' pool and the tracker
around it. Each (model, allocator) runs in its own process (PyTorch picks its allocator once
per process): steps per second (median step, CUDA events) and the device memory in use at the
peak of the samples (``_torch_workloads.train``). Random weights and data, fixed random states."""

from ._common import require_gpu
from ._torch_workloads import ALLOCATORS, MODELS, run

_PARAMS = [list(MODELS), list(ALLOCATORS)]
_NAMES = ["model", "allocator"]


class Training:
    params = _PARAMS
    param_names = _NAMES
    timeout = 1800  # setup_cache trains 2 models x 7 allocators, one process each

    def setup_cache(self):
        # No GPU or no PyTorch: no results, and setup() skips every cell with the reason.
        try:
            require_gpu()
            import torch  # noqa: F401
        except (NotImplementedError, ImportError) as exc:
            return {"skip": str(exc)}
        results = {}
        for model in MODELS:
            for allocator in ALLOCATORS:
                try:
                    results[(model, allocator)] = run(
                        ["train", allocator, model, "--steps", "10"], allocator
                    )
                except RuntimeError as exc:  # reported, and that cell is skipped below
                    print(f"{model} under {allocator} failed: {exc}")
        return results

    def setup(self, results, model, allocator):
        if "skip" in results:
            raise NotImplementedError(results["skip"])
        if (model, allocator) not in results:
            raise NotImplementedError(f"{model} under {allocator} did not run")

    def track_steps_per_second(self, results, model, allocator):
        return results[(model, allocator)]["steps_per_s"]

    track_steps_per_second.unit = "steps/s"

    def track_peak_used_mib(self, results, model, allocator):
        return results[(model, allocator)]["peak_used_bytes"] / 2**20

    track_peak_used_mib.unit = "MiB"
