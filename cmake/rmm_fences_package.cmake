# SPDX-License-Identifier: Apache-2.0
# The CMake package of the C++ headers, for C++ consumers of the installed wheel:
#   find_package(rmm_fences) -> the INTERFACE target rmm_fences::rmm_fences (the headers under
#   rmm_fences/_lib/include, C++20, linking rmm::rmm).
# The config and version files are installed into the wheel as rmm_fences/lib64/cmake/rmm_fences/,
# where librmm's wheel has rmm's (librmm/lib64/cmake/rmm/); rmm_fences.get_cmake_dir() returns
# that folder. Included by the top-level CMakeLists.txt after find_package(rmm).
include(CMakePackageConfigHelpers)

set(_rmm_fences_cmake_dir rmm_fences/lib64/cmake/rmm_fences)

# The version is written once, in src/rmm_fences/_version.py.
file(STRINGS "${PROJECT_SOURCE_DIR}/src/rmm_fences/_version.py" _rmm_fences_version_line
     REGEX "^__version__ = ")
string(REGEX MATCH "[0-9]+\\.[0-9]+\\.[0-9]+" RMM_FENCES_VERSION "${_rmm_fences_version_line}")
if(NOT RMM_FENCES_VERSION)
  message(FATAL_ERROR "no __version__ in src/rmm_fences/_version.py")
endif()

add_library(rmm_fences INTERFACE)
add_library(rmm_fences::rmm_fences ALIAS rmm_fences)
target_include_directories(
  rmm_fences INTERFACE "$<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/src/rmm_fences/_lib/include>"
                       "$<INSTALL_INTERFACE:rmm_fences/_lib/include>")
target_compile_features(rmm_fences INTERFACE cxx_std_20)
target_link_libraries(rmm_fences INTERFACE rmm::rmm)

install(TARGETS rmm_fences EXPORT rmm_fences-targets)
install(EXPORT rmm_fences-targets NAMESPACE rmm_fences:: DESTINATION "${_rmm_fences_cmake_dir}")

configure_package_config_file(
  "${CMAKE_CURRENT_LIST_DIR}/rmm_fences-config.cmake.in"
  "${CMAKE_CURRENT_BINARY_DIR}/rmm_fences-config.cmake"
  INSTALL_DESTINATION "${_rmm_fences_cmake_dir}" NO_SET_AND_CHECK_MACRO)
# Before 1.0 a minor release may break the C++ API, so only the same minor version matches.
if(RMM_FENCES_VERSION VERSION_LESS 1)
  set(_rmm_fences_compat SameMinorVersion)
else()
  set(_rmm_fences_compat SameMajorVersion)
endif()
write_basic_package_version_file(
  "${CMAKE_CURRENT_BINARY_DIR}/rmm_fences-config-version.cmake"
  VERSION "${RMM_FENCES_VERSION}" COMPATIBILITY ${_rmm_fences_compat} ARCH_INDEPENDENT)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/rmm_fences-config.cmake"
              "${CMAKE_CURRENT_BINARY_DIR}/rmm_fences-config-version.cmake"
        DESTINATION "${_rmm_fences_cmake_dir}")
