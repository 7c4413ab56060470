# SPDX-License-Identifier: Apache-2.0
"""Byte sizes given as ints or strings such as ``"512MiB"`` or ``"2GB"``."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "ki": 2**10,
    "kib": 2**10,
    "mi": 2**20,
    "mib": 2**20,
    "gi": 2**30,
    "gib": 2**30,
    "ti": 2**40,
    "tib": 2**40,
}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | str, name: str) -> int:
    """Return ``value`` as a non-negative number of bytes.

    Parameters
    ----------
    value
        An int, or a string such as ``"1GiB"``, ``"512 MB"``, ``"1.5GB"``, ``"4096"``.
    name
        The argument's name, used in error messages.

    Raises
    ------
    TypeError
        If ``value`` is neither an int nor a string.
    ValueError
        If ``value`` is negative or not a size.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(
            f"{name} must be an int or a size string such as '1GiB', got {type(value).__name__}"
        )
    if isinstance(value, int):
        nbytes = value
    else:
        match = _SIZE.match(value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(
                f"{name} must be a size such as 4096, '512MiB' or '2GB' "
                f"(units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB); got {value!r}"
            )
        nbytes = int(float(match.group(1)) * _UNITS[unit])
    if nbytes < 0:
        raise ValueError(f"{name} must be non-negative, got {value!r}")
    return nbytes
