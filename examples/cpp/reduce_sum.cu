/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * CUB's DeviceReduce::Sum with its temporary storage taken from rmm_fences'
 * stream_ordered_pool_memory_resource, set as the current device resource, and freed right after
 * each launch, with no synchronization: the pool reuses a freed block at once on the stream that
 * freed it (stream order makes that safe) and hands it to another stream only after that stream
 * waits, on the device, for the free's stream. Each launch is followed by another stream taking
 * and overwriting memory of the same size, the way a second thread would.
 *
 * Exit status: 0 when every sum equals the host float64 reference, 1 on a mismatch, 2 on a CUDA
 * error.
 */
#include <rmm_fences/stream_ordered_pool_memory_resource.hpp>

#include <rmm/aligned.hpp>
#include <rmm/cuda_stream.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/per_device_resource.hpp>
#include <rmm/resource_ref.hpp>

#include <cub/device/device_reduce.cuh>
#include <cuda/stream_ref>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <vector>

#define CHECK_CUDA(call)                                                                    \
  do {                                                                                      \
    cudaError_t const status_ = (call);                                                     \
    if (status_ != cudaSuccess) {                                                           \
      std::fprintf(                                                                         \
        stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(status_)); \
      std::exit(2);                                                                         \
    }                                                                                       \
  } while (0)

namespace {

int run()
{
  // Each value is a multiple of 1/4 in [0.25, 2]: every partial sum of 2^21 of them is a multiple
  // of 1/4 below 2^22, which float holds exactly, so whatever order CUB adds in, the sum on the
  // GPU must equal the float64 reference exactly: one corrupted value shows.
  constexpr std::size_t n         = std::size_t{1} << 21;
  constexpr int iterations        = 200;
  constexpr std::size_t tail_step = 4099;  // iteration i sums the first n - i * tail_step values
  std::vector<float> host(n);
  std::mt19937 rng{2026};
  std::uniform_int_distribution<int> quarters{1, 8};
  for (auto& v : host) {
    v = static_cast<float>(quarters(rng)) / 4.0F;
  }
  std::vector<double> prefix(n + 1);  // prefix[k]: the float64 sum of the first k values
  for (std::size_t j = 0; j < n; ++j) {
    prefix[j + 1] = prefix[j] + host[j];
  }
  std::vector<double> expected(iterations);
  for (int i = 0; i < iterations; ++i) {
    expected[i] = prefix[n - i * tail_step];
  }

  rmm::mr::cuda_memory_resource cuda;
  rmm_fences::mr::stream_ordered_pool_memory_resource pool{cuda};
  // The current device resource holds a copy of the pool: copies share one pool.
  rmm::mr::set_current_device_resource(pool);
  rmm::device_async_resource_ref mr = rmm::mr::get_current_device_resource_ref();
  constexpr std::size_t align       = rmm::CUDA_ALLOCATION_ALIGNMENT;

  int mismatches         = 0;
  std::size_t temp_bytes = 0;  // the first Sum call, with no storage, says how much it needs
  {
    rmm::cuda_stream stream_owner;
    rmm::cuda_stream other_owner;
    cuda::stream_ref const stream{stream_owner};
    cuda::stream_ref const other{other_owner};
    auto const in_bytes  = n * sizeof(float);
    auto const out_bytes = iterations * sizeof(float);
    auto* d_in           = static_cast<float*>(mr.allocate(stream, in_bytes, align));
    auto* d_out          = static_cast<float*>(mr.allocate(stream, out_bytes, align));
    CHECK_CUDA(cudaMemcpyAsync(d_in, host.data(), in_bytes, cudaMemcpyHostToDevice, stream.get()));

    CHECK_CUDA(cub::DeviceReduce::Sum(nullptr, temp_bytes, d_in, d_out, n, stream.get()));
    for (int i = 0; i < iterations; ++i) {
      void* temp = mr.allocate(stream, temp_bytes, align);
      CHECK_CUDA(
        cub::DeviceReduce::Sum(temp, temp_bytes, d_in, d_out + i, n - i * tail_step, stream.get()));
      mr.deallocate(stream, temp, temp_bytes, align);  // right after the launch: no sync
      // Another stream takes the same size at once and overwrites it: it must not be handed the
      // block the reduction may still be using.
      void* scratch = mr.allocate(other, temp_bytes, align);
      CHECK_CUDA(cudaMemsetAsync(scratch, 0xFF, temp_bytes, other.get()));
      mr.deallocate(other, scratch, temp_bytes, align);
    }

    std::vector<float> got(iterations);
    CHECK_CUDA(cudaMemcpyAsync(got.data(), d_out, out_bytes, cudaMemcpyDeviceToHost, stream.get()));
    stream.sync();
    for (int i = 0; i < iterations; ++i) {
      if (static_cast<double>(got[i]) != expected[i]) {
        if (++mismatches <= 5) {
          std::printf("MISMATCH: iteration %d summed %.2f, the float64 reference is %.2f\n",
                      i,
                      static_cast<double>(got[i]),
                      expected[i]);
        }
      }
    }
    mr.deallocate(stream, d_out, out_bytes, align);
    mr.deallocate(stream, d_in, in_bytes, align);
    // A stream that freed into the pool is retired from it before it is destroyed.
    pool.retire_stream(other);
    pool.retire_stream(stream);
  }

  auto const stats = pool.stats();
  std::printf(
    "rmm_fences reduce_sum: %d cub::DeviceReduce::Sum of up to %zu floats, temporary storage "
    "(%zu bytes) freed right after each launch: %s (first sum %.2f); pool: %llu same-stream "
    "reuses, %llu cross-stream reuses, %llu stream waits, %llu fences\n",
    iterations,
    n,
    temp_bytes,
    mismatches == 0 ? "every sum matches the float64 reference" : "MISMATCH",
    expected[0],
    static_cast<unsigned long long>(stats.same_stream_reuse),
    static_cast<unsigned long long>(stats.cross_stream_reuse),
    static_cast<unsigned long long>(stats.stream_waits),
    static_cast<unsigned long long>(stats.fences));
  // Drop the current device resource's copy of the pool before the CUDA runtime shuts down.
  rmm::mr::reset_current_device_resource();
  return mismatches == 0 ? 0 : 1;
}

}  // namespace

int main()
{
  try {
    return run();
  } catch (std::exception const& e) {  // rmm throws rmm::cuda_error, rmm::bad_alloc
    std::fprintf(stderr, "reduce_sum: %s\n", e.what());
    return 2;
  }
}
