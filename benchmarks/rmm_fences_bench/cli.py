# SPDX-License-Identifier: Apache-2.0
"""Argument types shared by the benchmark scripts and the tools that read the benchmarks."""

from __future__ import annotations

import argparse


def size(text: str, name: str = "size") -> int:
    """A positive number of bytes ("1MiB", "4096", "2GB"), for ``argparse``'s ``type=``; a bad
    one is an ``argparse.ArgumentTypeError`` that says why (``name``: the argument's name in
    the message of a value that is no size)."""
    from rmm_fences._sizes import parse_bytes

    try:
        value = parse_bytes(text, name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive size in bytes, got {text!r}")
    return value
