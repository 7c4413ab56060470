# SPDX-License-Identifier: Apache-2.0
"""Allocators that route other libraries' device memory through an RMM resource."""
