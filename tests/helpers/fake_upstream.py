# SPDX-License-Identifier: Apache-2.0
"""A fake upstream for CPU tests of the resources: rmm's ``CallbackMemoryResource`` handing out
fake addresses and logging its calls (nothing touches the memory). On the default stream the
pool, the tracker over a stream-ordered upstream and SyncOnFree's allocations make no CUDA
call over it."""

import itertools

import rmm

_ADDRESSES = itertools.count(1)  # every fake upstream's addresses differ, as device ones do


class FakeUpstream:
    """An rmm resource (``mr``, a ``CallbackMemoryResource``) that logs its calls in ``calls``
    and hands out fake, 4 GiB-aligned addresses."""

    def __init__(self):
        self.calls = []
        self.mr = rmm.mr.CallbackMemoryResource(self._allocate, self._deallocate)

    def _allocate(self, nbytes, stream):
        ptr = next(_ADDRESSES) << 32
        self.calls.append(("allocate", ptr, nbytes))
        return ptr

    def _deallocate(self, ptr, nbytes, stream):
        self.calls.append(("deallocate", ptr, nbytes))
