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


def size(text: str) -> int:
    from rmm_fences._sizes import parse_bytes

    try:
        return parse_bytes(text, "size")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def spec_error(args) -> str | None:
    """The first spec error of the command's --resource arguments (checked without a GPU)."""
    from rmm_fences.compose import SpecError, parse_spec

    specs = getattr(args, "resource", None)
    for spec in [specs] if isinstance(specs, str) else (specs or []):
        try:
            parse_spec(spec)
        except SpecError as exc:
            return str(exc)
    return None
