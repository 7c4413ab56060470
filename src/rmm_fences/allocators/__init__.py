# SPDX-License-Identifier: Apache-2.0
"""Allocators that route other libraries' device memory through an RMM resource.

- :mod:`rmm_fences.allocators.cupy`: ``CupyAllocator()`` for ``cupy.cuda.set_allocator``
  (rmm's current device resource on every call, or one resource).
- :mod:`rmm_fences.allocators.torch`: ``install()`` swaps PyTorch's CUDA allocator, honouring
  ``Tensor.record_stream`` (docs/torch.md).

Each imports its library only when imported itself.
"""
