# SPDX-License-Identifier: Apache-2.0
"""The version of rmm_fences: the one place it is written (the wheel's metadata reads it here)."""

__version__ = "0.1.0"
