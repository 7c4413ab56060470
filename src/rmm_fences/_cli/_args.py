# SPDX-License-Identifier: Apache-2.0
"""Argument types and checks shared by the subcommands (no GPU, no CuPy)."""

from __future__ import annotations

import argparse


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


#: Suffixes of counts: powers of two, as the help says ("16M" is 16,777,216 items).
COUNT_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
COUNT_HELP = "K, M, G: 2^10, 2^20, 2^30 (16M = 16,777,216)"


def count(text: str) -> int:
    """A positive count: digits, optionally followed by K, M or G (powers of two)."""
    digits, suffix = text.strip(), ""
    if digits[-1:].upper() in COUNT_SUFFIXES and digits[-1:].isalpha():
        digits, suffix = digits[:-1], digits[-1:].upper()
    if not digits.isdigit():
        raise argparse.ArgumentTypeError(
            f"expected a positive count (digits, then an optional K, M or G), got {text!r}"
        )
    value = int(digits) * COUNT_SUFFIXES[suffix]
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive count, got {text!r}")
    return value


def writable_path(path: str, what: str) -> str | None:
    """Why ``path`` cannot be written (its folder missing or not writable, or a folder itself),
    or None."""
    import os

    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return f"{what} {path!r} is a folder"
    if not os.path.isdir(folder):
        return f"{what} {path!r}: no folder {folder!r}"
    if not os.access(folder, os.W_OK):
        return f"{what} {path!r}: folder {folder!r} is not writable"
    return None


def spec_error(args) -> str | None:
    """The first spec error of the command's --resource arguments (checked without a GPU)."""
    from rmm_fences.specs import SpecError, parse_spec

    specs = getattr(args, "resource", None)
    for spec in [specs] if isinstance(specs, str) else (specs or []):
        try:
            parse_spec(spec)
        except SpecError as exc:
            return str(exc)
    return None
