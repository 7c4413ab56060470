/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The global operator new and delete of the host test module (CPU tests only, never in a wheel):
 * malloc and free, as the C++ runtime's own, plus a count while a `count_heap` scope is open
 * (include/rmm_fences_testing/heap_count.hpp), which can also make allocations fail. The module is
 * linked with -Bsymbolic-functions, so its own calls (the cores' containers included) reach these
 * whatever the process loaded.
 */
#include <rmm_fences_testing/heap_count.hpp>

#include <cstddef>
#include <cstdlib>
#include <new>

namespace {

void* allocate(std::size_t bytes)
{
  if (!rmm_fences::testing::note_heap_allocation()) { throw std::bad_alloc{}; }
  if (bytes == 0) { bytes = 1; }
  for (;;) {
    if (void* p = std::malloc(bytes); p != nullptr) { return p; }
    auto handler = std::get_new_handler();
    if (handler == nullptr) { throw std::bad_alloc{}; }
    handler();
  }
}

void* allocate(std::size_t bytes, std::align_val_t alignment)
{
  if (!rmm_fences::testing::note_heap_allocation()) { throw std::bad_alloc{}; }
  auto const align = static_cast<std::size_t>(alignment);
  auto const size  = ((bytes == 0 ? 1 : bytes) + align - 1) / align * align;
  for (;;) {
    if (void* p = std::aligned_alloc(align, size); p != nullptr) { return p; }
    auto handler = std::get_new_handler();
    if (handler == nullptr) { throw std::bad_alloc{}; }
    handler();
  }
}

void deallocate(void* ptr) noexcept
{
  rmm_fences::testing::note_heap_free(ptr);
  std::free(ptr);
}

}  // namespace

void* operator new(std::size_t bytes) { return allocate(bytes); }
void* operator new[](std::size_t bytes) { return allocate(bytes); }
void* operator new(std::size_t bytes, std::nothrow_t const&) noexcept
{
  try {
    return allocate(bytes);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t bytes, std::nothrow_t const&) noexcept
{
  try {
    return allocate(bytes);
  } catch (...) {
    return nullptr;
  }
}
void* operator new(std::size_t bytes, std::align_val_t a) { return allocate(bytes, a); }
void* operator new[](std::size_t bytes, std::align_val_t a) { return allocate(bytes, a); }
void* operator new(std::size_t bytes, std::align_val_t a, std::nothrow_t const&) noexcept
{
  try {
    return allocate(bytes, a);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t bytes, std::align_val_t a, std::nothrow_t const&) noexcept
{
  try {
    return allocate(bytes, a);
  } catch (...) {
    return nullptr;
  }
}

void operator delete(void* p) noexcept { deallocate(p); }
void operator delete[](void* p) noexcept { deallocate(p); }
void operator delete(void* p, std::size_t) noexcept { deallocate(p); }
void operator delete[](void* p, std::size_t) noexcept { deallocate(p); }
void operator delete(void* p, std::nothrow_t const&) noexcept { deallocate(p); }
void operator delete[](void* p, std::nothrow_t const&) noexcept { deallocate(p); }
void operator delete(void* p, std::align_val_t) noexcept { deallocate(p); }
void operator delete[](void* p, std::align_val_t) noexcept { deallocate(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { deallocate(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { deallocate(p); }
void operator delete(void* p, std::align_val_t, std::nothrow_t const&) noexcept { deallocate(p); }
void operator delete[](void* p, std::align_val_t, std::nothrow_t const&) noexcept { deallocate(p); }
