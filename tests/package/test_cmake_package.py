# SPDX-License-Identifier: Apache-2.0
"""C++ consumers of the installed package: ``find_package(rmm_fences)`` and its target, built by
the host compiler (no GPU needed; the CUDA headers are)."""

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

import rmm_fences

CONSUMER_CMAKE = """\
cmake_minimum_required(VERSION 4.0)  # rmm's CMake package asks for 4.0
project(rmm_fences_consumer LANGUAGES CXX)
find_package(rmm_fences {version} REQUIRED)
message(STATUS "consumer found rmm_fences ${{rmm_fences_VERSION}} in ${{rmm_fences_DIR}}")
get_target_property(type rmm_fences::rmm_fences TYPE)
get_target_property(links rmm_fences::rmm_fences INTERFACE_LINK_LIBRARIES)
message(STATUS "consumer target ${{type}} links ${{links}}")
add_executable(consumer consumer.cpp)
target_link_libraries(consumer PRIVATE rmm_fences::rmm_fences)
"""

# Every public header, then each resource behind an rmm::device_async_resource_ref, the way
# libcudf and cuML take one. Built, never run (constructing a resource needs a GPU).
CONSUMER_CPP = """\
{includes}
#include <rmm/aligned.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/per_device_resource.hpp>
#include <rmm/resource_ref.hpp>

#include <cuda/stream_ref>

#include <cstdio>

namespace {{
void use(rmm::device_async_resource_ref mr)
{{
  cuda::stream_ref const stream{{cudaStream_t{{}}}};
  void* p           = mr.allocate(stream, 256, rmm::CUDA_ALLOCATION_ALIGNMENT);
  mr.deallocate(stream, p, 256, rmm::CUDA_ALLOCATION_ALIGNMENT);
}}
}}  // namespace

int main(int argc, char**)
{{
  if (argc > 1) {{
    rmm::mr::cuda_memory_resource cuda;
    rmm_fences::mr::stream_ordered_pool_memory_resource pool{{cuda}};
    rmm_fences::mr::sync_on_free_resource_adaptor sync_on_free{{
      rmm_fences::mr::naive_caching_memory_resource{{cuda}}}};
    rmm_fences::mr::hazard_tracking_resource_adaptor tracker{{pool, true}};
    rmm::mr::set_current_device_resource(tracker);
    use(rmm::mr::get_current_device_resource_ref());
    use(sync_on_free);
  }}
  std::puts("consumer built");
  return 0;
}}
"""


PACKAGE = pathlib.Path(rmm_fences.__file__).parent
# beside librmm's (librmm/lib64/cmake/rmm): <package>/lib64/cmake/<name>
CMAKE_DIR = PACKAGE / "lib64" / "cmake" / "rmm_fences"
INCLUDE = PACKAGE / "_lib" / "include"


def test_the_package_ships_its_headers_and_cmake_package():
    assert pathlib.Path(rmm_fences.get_include()) == INCLUDE
    assert (INCLUDE / "rmm_fences" / "stream_ordered_pool_memory_resource.hpp").is_file()
    assert pathlib.Path(rmm_fences.get_cmake_dir()) == CMAKE_DIR
    files = sorted(p.name for p in CMAKE_DIR.glob("*.cmake"))
    assert "rmm_fences-config.cmake" in files, files
    assert "rmm_fences-config-version.cmake" in files, files
    assert "rmm_fences-targets.cmake" in files, files
    version = (CMAKE_DIR / "rmm_fences-config-version.cmake").read_text()
    assert f'set(PACKAGE_VERSION "{rmm_fences.__version__}")' in version


def _cmake():
    """CMake 4.0 or newer (the test extra brings it), the venv's first, or None."""
    for path in (os.path.dirname(sys.executable), None):
        exe = shutil.which("cmake", path=path)
        if not exe:
            continue
        out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
        found = re.search(r"cmake version (\d+)\.(\d+)", out)
        if found and (int(found[1]), int(found[2])) >= (4, 0):
            return exe
    return None


def _cuda_headers():
    """The CUDA toolkit's folder where FindCUDAToolkit looks for it, or None."""
    roots = [os.environ.get(v) for v in ("CUDAToolkit_ROOT", "CUDA_PATH", "CUDA_HOME")]
    nvcc = shutil.which("nvcc")
    if nvcc:  # <root>/bin/nvcc, unless it is a wrapper elsewhere
        roots.append(str(pathlib.Path(nvcc).resolve().parents[1]))
    roots.append("/usr/local/cuda")
    for root in filter(None, roots):
        if (pathlib.Path(root) / "include" / "cuda_runtime_api.h").is_file():
            return root
    return None


def test_find_package_gives_a_target_a_host_translation_unit_builds_with(tmp_path):
    # checked before any skip: wherever the test runs, the package must ship its config
    assert (CMAKE_DIR / "rmm_fences-config.cmake").is_file(), f"no CMake package in {CMAKE_DIR}"
    cmake = _cmake()
    if cmake is None:
        pytest.skip("needs CMake 4.0 or newer (rmm's CMake package asks for it): pip install cmake")
    cuda = _cuda_headers()
    if cuda is None:
        pytest.skip(
            "needs the CUDA toolkit's headers (nvcc on PATH, CUDAToolkit_ROOT or /usr/local/cuda)"
        )
    public = sorted(
        p.relative_to(INCLUDE).as_posix()
        for p in INCLUDE.glob("rmm_fences/**/*.hpp")
        if "detail" not in p.relative_to(INCLUDE).parts
    )
    assert "rmm_fences/stream_ordered_pool_memory_resource.hpp" in public, public
    src = tmp_path / "src"
    src.mkdir()
    major_minor = ".".join(rmm_fences.__version__.split(".")[:2])
    (src / "CMakeLists.txt").write_text(CONSUMER_CMAKE.format(version=major_minor))
    includes = "\n".join(f"#include <{h}>" for h in public)
    (src / "consumer.cpp").write_text(CONSUMER_CPP.format(includes=includes))

    # Only the package's own folder is given: rmm and rapids_logger are found beside it, in
    # the same site-packages, as pip installs them.
    env = {k: v for k, v in os.environ.items() if k not in ("CMAKE_PREFIX_PATH", "rmm_DIR")}
    env["CUDAToolkit_ROOT"] = cuda
    build = tmp_path / "build"
    configure = subprocess.run(
        [cmake, "-S", src, "-B", build, f"-DCMAKE_PREFIX_PATH={CMAKE_DIR}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    log = configure.stdout + configure.stderr
    assert configure.returncode == 0, log
    assert f"consumer found rmm_fences {rmm_fences.__version__} in {CMAKE_DIR}" in log, log
    assert "consumer target INTERFACE_LIBRARY links rmm::rmm" in log, log

    compiled = subprocess.run(
        [cmake, "--build", build], capture_output=True, text=True, env=env, timeout=600
    )
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    # linked against librmm and rapids_logger of the wheels, it loads (no CUDA call without args)
    ran = subprocess.run([build / "consumer"], capture_output=True, text=True, timeout=60)
    assert (ran.returncode, ran.stdout) == (0, "consumer built\n"), ran.stdout + ran.stderr
