# SPDX-License-Identifier: Apache-2.0
"""Native part of rmm_fences (C++ resources bound with Cython)."""
