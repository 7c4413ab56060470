# SPDX-License-Identifier: Apache-2.0
"""PyTorch workloads under each allocator, one allocator per process (PyTorch chooses its
allocator once, before its first CUDA allocation, and cannot switch back).

    python asv_bench/benchmarks/_torch_workloads.py train ALLOCATOR MODEL [--steps N] [--batch B]
    python asv_bench/benchmarks/_torch_workloads.py hazard ALLOCATOR PATTERN [--trials N]
    python asv_bench/benchmarks/_torch_workloads.py switch CASE
    python asv_bench/benchmarks/_torch_workloads.py mempool CASE

The last line printed is a JSON object. Used by the asv training benchmarks
(torch_training.py), by tests/allocators/test_torch_gpu.py and by tools/torch_hazards.py. No
downloads: random weights and data from fixed random states.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

#: Allocators, by name: how each is chosen in a fresh process (see ``choose``).
ALLOCATORS = {
    "torch": "PyTorch's caching allocator",
    "torch_expandable": "PyTorch's caching allocator, expandable_segments:True",
    "rmm_async": "rmm_torch_allocator over rmm's CudaAsyncMemoryResource",
    "rmm_pool": "rmm_torch_allocator over rmm's PoolMemoryResource(cuda, 1 GiB initial)",
    "fences_pool": "rmm_fences.allocators.torch over pool(cuda), the pool's own growth rule",
    "fences_tracker": "rmm_fences.allocators.torch over tracking(pool(cuda))",
    "fences_vmm_pool": "rmm_fences.allocators.torch over vmm_pool, the pool over pages it maps",
}
FENCES_SPECS = {
    "fences_pool": "pool(cuda)",
    "fences_tracker": "tracking(pool(cuda), on_hazard=record)",
    "fences_vmm_pool": "vmm_pool",
}
MODELS = ("gpt2_small", "resnet50")
PATTERNS = ("prefetch", "offload")


def env_for(allocator: str) -> dict:
    """Environment variables the process of ``allocator`` needs before PyTorch loads."""
    if allocator == "torch_expandable":
        return {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    return {}


def choose(allocator: str):
    """Make ``allocator`` PyTorch's allocator (call before any CUDA allocation). Returns the
    rmm_fences ``TorchAllocator`` for the fences_* allocators, else None."""
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator must be one of {sorted(ALLOCATORS)}, got {allocator!r}")
    if allocator in ("torch", "torch_expandable"):
        return None
    if allocator.startswith("rmm_"):
        import rmm
        import torch
        from rmm.allocators.torch import rmm_torch_allocator

        if allocator == "rmm_async":
            mr = rmm.mr.CudaAsyncMemoryResource()
        else:
            mr = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=1 << 30)
        rmm.mr.set_current_device_resource(mr)
        torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
        return None
    from rmm_fences.allocators import torch as fences_torch

    return fences_torch.install(FENCES_SPECS[allocator])


def _fix_random_state(random_state: int) -> None:
    import torch

    torch.manual_seed(random_state)
    torch.cuda.manual_seed_all(random_state)


def gpt2_small(
    vocab: int = 50257, width: int = 768, layers: int = 12, heads: int = 12, context: int = 1024
):
    """A GPT-2-small-shaped decoder: token and position embeddings, pre-norm causal blocks,
    tied LM head."""
    import torch
    from torch import nn

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, width)
            self.pos = nn.Embedding(context, width)
            layer = nn.TransformerEncoderLayer(
                width,
                heads,
                4 * width,
                dropout=0.0,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(width)

        def forward(self, idx):
            t = idx.shape[1]
            x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
            mask = nn.Transformer.generate_square_subsequent_mask(t, device=idx.device)
            x = self.blocks(x, mask=mask, is_causal=True)
            return self.norm(x) @ self.tok.weight.t()

    return GPT()


def resnet50(classes: int = 1000):
    """ResNet-50 (bottleneck blocks 3-4-6-3), written out: no torchvision needed."""
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, mid, stride):
            super().__init__()
            cout = mid * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, mid, 1, bias=False),
                nn.BatchNorm2d(mid),
                nn.ReLU(inplace=True),
                nn.Conv2d(mid, mid, 3, stride, 1, bias=False),
                nn.BatchNorm2d(mid),
                nn.ReLU(inplace=True),
                nn.Conv2d(mid, cout, 1, bias=False),
                nn.BatchNorm2d(cout),
            )
            self.skip = (
                nn.Identity()
                if stride == 1 and cin == cout
                else nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )
            )
            self.act = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.act(self.body(x) + self.skip(x))

    cin, blocks = 64, []
    for mid, count, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(count):
            blocks.append(Bottleneck(cin, mid, stride if i == 0 else 1))
            cin = mid * 4
    return nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
        *blocks,
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(cin, classes),
    )


def _fences_report(fences) -> dict:
    """The rmm_fences allocator's stats and, with a tracker as its resource, its hazards."""
    if fences is None:
        return {}
    report = {"stats": fences.memory_stats()}
    if hasattr(fences.resource, "hazards"):
        report["hazards"] = [str(h) for h in fences.resource.hazards]
    return report


def _used_bytes() -> int:
    import torch

    free, total = torch.cuda.mem_get_info()
    return total - free


def model_and_loss(model: str, batch: int | None = None, random_state: int = 0):
    """``(net, loss_of, batch)``: ``model`` built on the GPU with random data of ``batch``
    samples (default 8 for gpt2_small, 128 for resnet50; from a generator
    started at ``random_state + 1``),
    and the function of no argument that computes its loss under bf16 autocast."""
    import torch

    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    gen = torch.Generator(device="cuda").manual_seed(random_state + 1)
    if model == "gpt2_small":
        batch = batch or 8
        net = gpt2_small().cuda()
        data = torch.randint(0, 50257, (batch, 1024), device="cuda", generator=gen)
        target = torch.randint(0, 50257, (batch, 1024), device="cuda", generator=gen)

        def loss_of():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = net(data)
            return torch.nn.functional.cross_entropy(
                logits.float().view(-1, logits.shape[-1]), target.view(-1)
            )
    else:
        batch = batch or 128
        net = resnet50().cuda().to(memory_format=torch.channels_last)
        data = torch.randn(batch, 3, 224, 224, device="cuda", generator=gen).to(
            memory_format=torch.channels_last
        )
        target = torch.randint(0, 1000, (batch,), device="cuda", generator=gen)

        def loss_of():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = net(data)
            return torch.nn.functional.cross_entropy(out.float(), target)

    return net, loss_of, batch


def train(
    allocator: str,
    model: str,
    steps: int = 10,
    batch: int | None = None,
    warmup: int = 3,
    random_state: int = 0,
) -> dict:
    """``warmup`` + ``steps`` training steps of ``model`` under ``allocator``: the loss of every
    step, the median step time (CUDA events), and device memory in use (peak of samples taken
    after each forward and each step, minus what was in use before the model was built)."""
    fences = choose(allocator)
    import torch

    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    _fix_random_state(random_state)
    torch.cuda.init()
    torch.cuda.synchronize()
    base = _used_bytes()
    net, loss_of, batch = model_and_loss(model, batch, random_state)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    losses, times, peak = [], [], 0
    for i in range(warmup + steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        opt.zero_grad(set_to_none=True)
        loss = loss_of()
        peak = max(peak, _used_bytes())
        loss.backward()
        opt.step()
        end.record()
        torch.cuda.synchronize()
        peak = max(peak, _used_bytes())
        losses.append(float(loss))
        if i >= warmup:
            times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    result = {
        "allocator": allocator,
        "model": model,
        "batch": batch,
        "losses": losses,
        "step_s": times[len(times) // 2],
        "steps_per_s": 1.0 / times[len(times) // 2],
        "peak_used_bytes": peak - base,
    }
    if allocator.startswith("torch"):
        result["torch_max_reserved"] = torch.cuda.max_memory_reserved()
    result.update(_fences_report(fences))
    return result


def hazard(allocator: str, pattern: str, trials: int = 20, random_state: int = 0) -> dict:
    """A block freed while another stream still reads it, the way PyTorch code does it, with
    ``Tensor.record_stream`` declaring the reader; ``trials`` checksums against float64.

    ``prefetch``: a side stream copies the next batch in (allocated on the side stream), the
    main stream waits for it, ``batch.record_stream(main)``, a slow kernel on main then reads
    it, the batch is dropped and the side stream at once fills a new tensor of the same size.
    ``offload``: a tensor made on main is copied to pinned host memory on a side stream,
    ``t.record_stream(side)``, dropped at once, and main fills a new tensor of the same size.
    """
    fences = choose(allocator)
    import numpy as np
    import torch

    if pattern not in PATTERNS:
        raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")
    rng = np.random.default_rng(random_state)
    n = 1 << 22  # 16 MiB of float32
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    # About 20 ms of GPU clock (kHz where PyTorch reports it; else an H200's 1.98 GHz).
    khz = getattr(torch.cuda.get_device_properties(0), "clock_rate", 0) or 1_980_000
    cycles = int(khz * 1e3 * 0.02)
    corrupted = 0
    for _ in range(trials):
        host = torch.from_numpy(rng.standard_normal(n, dtype=np.float32) + 1.0).pin_memory()
        ref = float(host.double().sum())
        if pattern == "prefetch":
            with torch.cuda.stream(side):
                batch = host.to("cuda", non_blocking=True)  # allocated on the side stream
            main.wait_stream(side)
            batch.record_stream(main)
            torch.cuda._sleep(cycles)  # main is busy: the reader below runs late
            got = batch.double().sum()
            del batch  # freed on its allocation stream (side), main still to read it
            with torch.cuda.stream(side):
                junk = torch.full((n,), -7.0, device="cuda")  # same size: the freed block
            main.synchronize()
            side.synchronize()
            del junk
            corrupted += not np.isclose(float(got), ref, rtol=1e-6)
        else:
            dev = host.to("cuda")
            out = torch.empty(n, dtype=torch.float32, pin_memory=True)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                torch.cuda._sleep(cycles)  # the copy below runs late
                out.copy_(dev, non_blocking=True)
            dev.record_stream(side)
            del dev  # freed on main (its allocation stream) while side will still read it
            junk = torch.full((n,), -7.0, device="cuda")
            side.synchronize()
            main.synchronize()
            del junk
            corrupted += not np.isclose(float(out.double().sum()), ref, rtol=1e-6)
    result = {"allocator": allocator, "pattern": pattern, "trials": trials, "corrupted": corrupted}
    result.update(_fences_report(fences))
    return result


def switch(case: str) -> dict:
    """The rules of choosing the allocator: ``after_init`` (install once PyTorch's CUDA is
    initialized), ``twice`` (install a second time), ``first`` (install, then allocate)."""
    import torch

    from rmm_fences.allocators import torch as fences_torch

    error = None
    try:
        if case == "after_init":
            torch.zeros(1, device="cuda")
            fences_torch.install("pool(cuda)")
        elif case == "twice":
            fences_torch.install("pool(cuda)")
            fences_torch.install("pool(cuda)")
        elif case == "first":
            fences_torch.install("pool(cuda)")
            x = torch.arange(1 << 20, device="cuda", dtype=torch.float64)
            if float(x.sum()) != float(sum(range(1 << 20))):
                error = "wrong sum"
        else:
            raise ValueError(f"case must be after_init, twice or first, got {case!r}")
    except RuntimeError as exc:
        error = f"RuntimeError: {exc}"
    installed = fences_torch.installed()
    return {
        "case": case,
        "error": error,
        "installed": installed is not None,
        "backend": torch.cuda.get_allocator_backend(),
    }


def mempool(case: str, random_state: int = 0) -> dict:
    """The MemPool route (``rmm_fences.allocators.torch.mem_pool`` over rmm_fences' pool):
    ``route``: tensors made inside ``torch.cuda.use_mem_pool`` take segments from the pool,
    the results match float64, PyTorch's ``memory_stats()`` keeps working, and after the context
    allocations go to PyTorch's own pool again (the pool's segment count does not move);
    ``graph``: one step captured with ``torch.cuda.graph(..., pool=pool.id)`` and replayed."""
    import numpy as np
    import torch

    from rmm_fences.allocators import torch as fences_torch

    if case not in ("route", "graph"):
        raise ValueError(f"case must be route or graph, got {case!r}")
    pool = fences_torch.mem_pool(FENCES_SPECS["fences_pool"])
    rng = np.random.default_rng(random_state)
    host = rng.standard_normal((1024, 1024))
    ref = float((host @ host).sum())
    out = {"case": case, "backend": torch.cuda.get_allocator_backend()}
    if case == "route":
        with torch.cuda.use_mem_pool(pool):
            x = torch.from_numpy(host).cuda()
            got = float((x @ x).sum())
        inside = fences_torch.mem_pool_stats()
        y = torch.ones(1 << 24, device="cuda")  # 64 MiB outside the context
        torch.cuda.synchronize()
        after = fences_torch.mem_pool_stats()
        out.update(
            ok=abs(got - ref) <= 1e-9 * max(1.0, abs(ref)),
            segments_inside=inside["segment.all.current"],
            segments_after=after["segment.all.current"],
            torch_allocated=torch.cuda.memory_stats()["allocated_bytes.all.current"],
            outside_bytes=int(y.numel() * 4),
        )
    else:
        x = torch.from_numpy(host).cuda()
        static_out = torch.empty((), dtype=torch.float64, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up outside the capture, as PyTorch asks
            static_out.copy_((x @ x).sum())
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool.id):
            static_out.copy_((x @ x).sum())
        results = []
        for k in range(3):
            x.mul_(1.0 if k == 0 else 2.0)
            g.replay()
            torch.cuda.synchronize()
            results.append(float(static_out))
        scale = [1.0, 4.0, 16.0]
        out.update(
            ok=all(
                abs(r - ref * c) <= 1e-9 * max(1.0, abs(ref * c)) for r, c in zip(results, scale)
            ),
            replays=results,
            segments=fences_torch.mem_pool_stats()["segment.all.current"],
        )
    out["stats"] = fences_torch.mem_pool_stats()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train")
    p.add_argument("allocator", choices=sorted(ALLOCATORS))
    p.add_argument("model", choices=MODELS)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=None)
    p = sub.add_parser("hazard")
    p.add_argument("allocator", choices=sorted(ALLOCATORS))
    p.add_argument("pattern", choices=PATTERNS)
    p.add_argument("--trials", type=int, default=20)
    p = sub.add_parser("switch")
    p.add_argument("case", choices=("after_init", "twice", "first"))
    p = sub.add_parser("mempool")
    p.add_argument("case", choices=("route", "graph"))
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    if args.command == "train":
        out = train(args.allocator, args.model, args.steps, args.batch, args.warmup)
    elif args.command == "hazard":
        out = hazard(args.allocator, args.pattern, args.trials)
    elif args.command == "mempool":
        out = mempool(args.case)
    else:
        out = switch(args.case)
    out["wall_s"] = round(time.perf_counter() - t0, 3)
    print(json.dumps(out), flush=True)
    return 0


def run_json(argv: list[str], timeout: float, env: dict | None = None) -> dict:
    """Run ``argv`` and return the JSON of its last stdout line; raises RuntimeError with the
    output when it fails or prints nothing."""
    import subprocess

    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{argv[1:]} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(lines[-1])


def run(command: list[str], allocator: str | None = None, timeout: float = 600) -> dict:
    """Run this module in a fresh process (the allocator is chosen once per process) and
    return its JSON line; raises RuntimeError with the output when it fails."""
    env = dict(os.environ, **env_for(allocator or ""))
    return run_json([sys.executable, "-P", os.path.abspath(__file__), *command], timeout, env)


if __name__ == "__main__":
    sys.exit(main())
