# SPDX-License-Identifier: Apache-2.0
"""Where the installed package keeps its C++ headers and its CMake package (docs/cpp.md)."""

import os

_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def get_include() -> str:
    """The folder of the C++ headers: ``#include <rmm_fences/...>`` resolves there.

    For builds without CMake; a CMake build links ``rmm_fences::rmm_fences`` instead, which also
    brings rmm's headers and CUDA's.
    """
    return os.path.join(_PACKAGE, "_lib", "include")


def get_cmake_dir() -> str:
    """The folder of the CMake package (``rmm_fences-config.cmake``): pass it as
    ``-Drmm_fences_DIR=...`` or put it on ``CMAKE_PREFIX_PATH``, then
    ``find_package(rmm_fences)`` gives the target ``rmm_fences::rmm_fences``.
    """
    return os.path.join(_PACKAGE, "lib64", "cmake", "rmm_fences")
