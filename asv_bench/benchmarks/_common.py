# SPDX-License-Identifier: Apache-2.0
"""Shared pieces of the asv suite: the GPU gate, the chains (as rmm_fences specs), streams;
and the benchmarks' library on ``sys.path``."""

import pathlib
import sys

#: The benchmarks' library, ``rmm_fences_bench`` (timing loops, log replay and reader): in the
#: repository's benchmarks/, its native loops built in place by ``make install``; it is no part
#: of the installed package.
BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import rmm_fences_bench  # noqa: E402, F401  (not built: `asv check` fails here, at import)

# Peers and rmm_fences' resources, as parameters of the same benchmarks. Not the chains of
# `rmm-fences doctor` (src/rmm_fences/_cli/doctor.py CHAINS, a safety matrix with unsafe chains
# and every sync mode): a different set on purpose, with pools pre-sized and short names.
CHAINS = {
    "rmm_fences_pool": "pool(cuda, initial_pool_size=1GiB)",
    "rmm_pool": "rmm_pool(cuda, initial_pool_size=1GiB)",
    "cuda_async": "cuda_async",
    "cuda": "cuda",
    "sync_on_free_deferred": "sync_on_free(naive_cache(cuda), mode=deferred)",
    "sync_on_free_device": "sync_on_free(naive_cache(cuda), mode=device)",
    "tracking_pool": "tracking(pool(cuda, initial_pool_size=1GiB), on_hazard=record)",
}


def require_gpu():
    """Raise NotImplementedError (asv then skips the benchmark) where no GPU is usable."""
    from rmm_fences._cuda import device_count, no_device_reason

    if device_count() == 0:
        raise NotImplementedError(f"needs a CUDA GPU: {no_device_reason()}")


def make(chain):
    from rmm_fences import compose

    return compose(CHAINS[chain])


def streams(count=1):
    """(cupy streams, rmm streams) of ``count`` new non-blocking streams."""
    import cupy
    import rmm

    cs = [cupy.cuda.Stream(non_blocking=True) for _ in range(count)]
    return cs, [rmm.pylibrmm.stream.Stream(s) for s in cs]
