# SPDX-License-Identifier: Apache-2.0
"""Optional dependencies: the core needs rmm alone; each extra of the wheel brings what one part
of the package uses, and a missing one raises an ImportError that names the extra."""

from __future__ import annotations

import importlib
from types import ModuleType

#: The distribution name, as ``pip install`` takes it.
DISTRIBUTION = "rmm-fences-cu13"

#: module -> (the extra that installs it, the project as users know it)
EXTRAS = {
    "cupy": ("cupy", "CuPy"),
    "cuda.compute": ("reduce", "cuda-cccl"),
    "torch": ("torch", "PyTorch"),
    "distributed": ("dask", "Dask distributed"),
    "matplotlib": ("plot", "matplotlib"),
}


def missing(module: str, user: str) -> ImportError:
    """The ImportError for ``user`` (a module or command of this package) without ``module``."""
    extra, project = EXTRAS[module]
    return ImportError(
        f"{user} needs {project} (the '{module}' module), which is not installed: "
        f"pip install '{DISTRIBUTION}[{extra}]'"
    )


def require(module: str, user: str) -> ModuleType:
    """``module`` imported, or the ImportError of :func:`missing` (from the original one)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise missing(module, user) from exc
