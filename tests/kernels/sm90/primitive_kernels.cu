// Device side of the Hopper primitive tests: small kernels that exercise one primitive each of
// kernels/common/sm90_*.cuh. See primitive_kernels.hpp.
#include "primitive_kernels.hpp"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/common/sm90_sync.cuh"
#include "kernels/common/sm90_tma.cuh"
#include "kernels/common/sm90_wgmma.cuh"
#include "kernels/common/tma_host.hpp"

namespace flashlab::sm90_tests {

using namespace flashlab::kernels;
using namespace flashlab::kernels::sm90;

namespace {

void ok(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

template <typename T>
struct DeviceArray {
  T* data = nullptr;
  std::size_t size = 0;
  explicit DeviceArray(std::size_t count) : size(count) { ok(cudaMalloc(&data, count * sizeof(T)), "cudaMalloc"); }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    ok(cudaMemcpy(data, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  ~DeviceArray() { cudaFree(data); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  std::vector<T> download() const {
    std::vector<T> host(size);
    ok(cudaMemcpy(host.data(), data, size * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return host;
  }
};

void synchronize(const char* what) {
  ok(cudaGetLastError(), what);
  ok(cudaDeviceSynchronize(), what);
}

// A 2-D row-major tensor of 16-bit elements as a TMA map (one head, one batch).
CUtensorMap map_2d(const void* base, DType dtype, int columns, int rows, int box_columns, int box_rows) {
  TmaTensor tensor{base, columns, rows, 1, 1, columns, 0, 0};
  return make_tma_map(tensor, dtype, box_columns, box_rows, "test tensor");
}

__device__ __forceinline__ unsigned char* aligned_1024(unsigned char* raw) {
  return reinterpret_cast<unsigned char*>((reinterpret_cast<std::uintptr_t>(raw) + 1023) / 1024 * 1024);
}

__device__ __forceinline__ void init_single_barrier(Mbarrier* barrier) {
  if (threadIdx.x == 0) {
    mbarrier_init(barrier, 1);
    mbarrier_init_fence();
  }
  __syncthreads();
}

// ---------------------------------------------------------------------------------------------
// TMA and the swizzle.

__global__ void tma_load_box_kernel(const __grid_constant__ CUtensorMap map, int column, int row, int box_bytes,
                                    std::uint16_t* out) {
  extern __shared__ unsigned char raw[];
  unsigned char* tile = aligned_1024(raw);
  __shared__ Mbarrier barrier;
  init_single_barrier(&barrier);
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_bytes(&barrier, box_bytes);
    tma_load(tile, map, column, row, 0, 0, &barrier);
  }
  mbarrier_wait(&barrier, 0);
  for (int i = threadIdx.x; i < box_bytes / 2; i += blockDim.x) out[i] = reinterpret_cast<const std::uint16_t*>(tile)[i];
}

__global__ void tma_store_box_kernel(const __grid_constant__ CUtensorMap map, int column, int row, int box_rows) {
  extern __shared__ unsigned char raw[];
  unsigned char* tile = aligned_1024(raw);
  for (int i = threadIdx.x; i < box_rows * 64; i += blockDim.x) {
    const int r = i / 64, c = i % 64;
    *reinterpret_cast<std::uint16_t*>(tile + swizzled_offset(r, c, box_rows)) = static_cast<std::uint16_t>(r * 256 + c + 1);
  }
  fence_shared_to_async_proxy();
  __syncthreads();
  if (threadIdx.x == 0) {
    tma_store(map, column, row, 0, 0, tile);
    tma_store_commit();
    tma_store_wait_all();
  }
}

// ---------------------------------------------------------------------------------------------
// One wgmma.

template <typename T>
std::uint16_t bits_of(float value) {
  const T rounded = T(value);
  std::uint16_t bits;
  std::memcpy(&bits, &rounded, 2);
  return bits;
}
template <typename T>
float value_of(std::uint16_t bits) {
  T x;
  std::memcpy(&x, &bits, 2);
  return static_cast<float>(x);
}

// Random 16-bit values and their exact float values.
template <typename T>
struct RandomMatrix {
  std::vector<std::uint16_t> bits;
  std::vector<float> values;
  RandomMatrix(int rows, int columns, std::mt19937_64& rng) : bits(rows * columns), values(rows * columns) {
    std::normal_distribution<float> normal(0.f, 1.f);
    for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = bits_of<T>(normal(rng)), values[i] = value_of<T>(bits[i]);
  }
};

// D (64 x N) from the accumulator layout (sm90_wgmma.cuh) to row-major fp32.
template <int N>
__device__ __forceinline__ void store_accumulators(const float (&acc)[N / 2], float* d) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < N / 8; ++i)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int e = 0; e < 2; ++e) d[(warp * 16 + g + 8 * r) * N + 8 * i + 2 * t + e] = acc[4 * i + 2 * r + e];
}

// D = A B^T, A 64 x K and B N x K (K-major), both by TMA into 64-column panels: the S = Q K^T form.
template <typename T, int N, int K>
__global__ void wgmma_ss_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                                float* d) {
  extern __shared__ unsigned char raw[];
  unsigned char* a_tile = aligned_1024(raw);
  unsigned char* b_tile = a_tile + K / 64 * 64 * 128;
  __shared__ Mbarrier barrier;
  init_single_barrier(&barrier);
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_bytes(&barrier, K / 64 * (64 + N) * 128);
    for (int panel = 0; panel < K / 64; ++panel) {
      tma_load(a_tile + panel * 64 * 128, map_a, panel * 64, 0, 0, 0, &barrier);
      tma_load(b_tile + panel * N * 128, map_b, panel * 64, 0, 0, 0, &barrier);
    }
  }
  mbarrier_wait(&barrier, 0);
  const std::uint64_t a = k_major_descriptor(static_cast<std::uint32_t>(__cvta_generic_to_shared(a_tile)));
  const std::uint64_t b = k_major_descriptor(static_cast<std::uint32_t>(__cvta_generic_to_shared(b_tile)));
  float acc[N / 2];
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < K / 16; ++k) {
    Wgmma<T, N>::template ss<0>(acc, a + ((k / 4 * 64 * 128 + k % 4 * 32) >> 4), b + ((k / 4 * N * 128 + k % 4 * 32) >> 4),
                                k > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_registers(acc);
  store_accumulators<N>(acc, d);
}

// D = A B, A 64 x K from registers (the mma A layout), B K x N stored N-contiguous (MN-major: its
// rows are K) in 64-column panels by TMA: the O = P V form.
template <typename T, int N, int K>
__global__ void wgmma_rs_kernel(const std::uint16_t* a_bits, const __grid_constant__ CUtensorMap map_b, float* d) {
  constexpr int kPanels = (N + 63) / 64;
  extern __shared__ unsigned char raw[];
  unsigned char* b_tile = aligned_1024(raw);
  __shared__ Mbarrier barrier;
  init_single_barrier(&barrier);
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_bytes(&barrier, kPanels * K * 128);
    for (int panel = 0; panel < kPanels; ++panel) tma_load(b_tile + panel * K * 128, map_b, panel * 64, 0, 0, 0, &barrier);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  auto pair = [&](int row, int column) {
    return static_cast<std::uint32_t>(a_bits[row * K + column]) | static_cast<std::uint32_t>(a_bits[row * K + column + 1]) << 16;
  };
  std::uint32_t a[K / 16][4];
#pragma unroll
  for (int k = 0; k < K / 16; ++k) {
    const int row = warp * 16 + g, column = 16 * k + 2 * t;
    a[k][0] = pair(row, column), a[k][1] = pair(row + 8, column);
    a[k][2] = pair(row, column + 8), a[k][3] = pair(row + 8, column + 8);
  }
  mbarrier_wait(&barrier, 0);
  const std::uint64_t b = mn_major_descriptor(static_cast<std::uint32_t>(__cvta_generic_to_shared(b_tile)), K * 128);
  float acc[N / 2];
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < K / 16; ++k) Wgmma<T, N>::template rs<1>(acc, a[k], b + ((k * 16 * 128) >> 4), k > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_registers(acc);
  fence_registers(a);
  store_accumulators<N>(acc, d);
}

// max |D - D_ref| / max |D_ref|; a NaN or an unwritten (poisoned) element counts as infinite.
double relative_error(const std::vector<float>& d, const std::vector<double>& reference) {
  double error = 0, scale = 0;
  for (std::size_t i = 0; i < d.size(); ++i) {
    error = std::max(error, std::isfinite(d[i]) ? std::abs(d[i] - reference[i]) : INFINITY);
    scale = std::max(scale, std::abs(reference[i]));
  }
  return error / scale;
}

template <typename T, int N, int K>
double ss_error(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const DType dtype = std::is_same_v<T, __half> ? DType::fp16 : DType::bf16;
  RandomMatrix<T> a(64, K, rng), b(N, K, rng);
  DeviceArray<std::uint16_t> a_device(a.bits), b_device(b.bits);
  DeviceArray<float> d(64 * N);
  ok(cudaMemset(d.data, 0xFF, 64 * N * sizeof(float)), "poison D");
  const CUtensorMap map_a = map_2d(a_device.data, dtype, K, 64, 64, 64), map_b = map_2d(b_device.data, dtype, K, N, 64, N);
  const int shared = K / 64 * (64 + N) * 128 + 1024;
  ok(cudaFuncSetAttribute(wgmma_ss_kernel<T, N, K>, cudaFuncAttributeMaxDynamicSharedMemorySize, shared), "smem");
  wgmma_ss_kernel<T, N, K><<<1, 128, shared>>>(map_a, map_b, d.data);
  synchronize("wgmma_ss_kernel");
  std::vector<double> reference(64 * N, 0.0);
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < N; ++j)
      for (int k = 0; k < K; ++k) reference[i * N + j] += double(a.values[i * K + k]) * b.values[j * K + k];
  return relative_error(d.download(), reference);
}

template <typename T, int N, int K>
double rs_error(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const DType dtype = std::is_same_v<T, __half> ? DType::fp16 : DType::bf16;
  RandomMatrix<T> a(64, K, rng), b(K, N, rng);  // b[k][n]: N contiguous
  DeviceArray<std::uint16_t> a_device(a.bits), b_device(b.bits);
  DeviceArray<float> d(64 * N);
  ok(cudaMemset(d.data, 0xFF, 64 * N * sizeof(float)), "poison D");
  const CUtensorMap map_b = map_2d(b_device.data, dtype, N, K, 64, K);
  const int shared = (N + 63) / 64 * K * 128 + 1024;
  ok(cudaFuncSetAttribute(wgmma_rs_kernel<T, N, K>, cudaFuncAttributeMaxDynamicSharedMemorySize, shared), "smem");
  wgmma_rs_kernel<T, N, K><<<1, 128, shared>>>(a_device.data, map_b, d.data);
  synchronize("wgmma_rs_kernel");
  std::vector<double> reference(64 * N, 0.0);
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < N; ++j)
      for (int k = 0; k < K; ++k) reference[i * N + j] += double(a.values[i * K + k]) * b.values[k * N + j];
  return relative_error(d.download(), reference);
}

// ---------------------------------------------------------------------------------------------
// A ring of full / empty mbarriers.

constexpr int kRingStages = 3, kRingTiles = 64, kRingConsumers = kRingConsumerThreads / 128;

__host__ __device__ std::uint16_t ring_pattern(int tile, int row, int column) {
  return static_cast<std::uint16_t>((tile * 64 + row) * 8 + column / 8);
}

__global__ void __launch_bounds__(128 * (kRingConsumers + 1), 1)
    ring_kernel(const __grid_constant__ CUtensorMap map, int iterations, unsigned long long* checked, int* wrong) {
  extern __shared__ unsigned char raw[];
  unsigned char* stages = aligned_1024(raw);
  __shared__ Mbarrier full[kRingStages], empty[kRingStages];
  if (threadIdx.x == 0) {
    for (int s = 0; s < kRingStages; ++s) mbarrier_init(&full[s], 1), mbarrier_init(&empty[s], 4 * kRingConsumers);
    mbarrier_init_fence();
  }
  __syncthreads();
  RingPosition<kRingStages> ring;
  if (threadIdx.x < 128) {
    if (threadIdx.x == 0) {
      for (int i = 0; i < iterations; ++i, ring.advance()) {
        mbarrier_wait(&empty[ring.stage], ring.phase ^ 1);
        mbarrier_arrive_expect_bytes(&full[ring.stage], 64 * 128);
        tma_load(stages + ring.stage * 64 * 128, map, 0, (i * 7 % kRingTiles) * 64, 0, 0, &full[ring.stage]);
      }
    }
    return;
  }
  const int thread = threadIdx.x - 128, row = thread % 64, column = thread / 64 * 16;
  int local_wrong = 0;
  for (int i = 0; i < iterations; ++i, ring.advance()) {
    mbarrier_wait(&full[ring.stage], ring.phase);
    const unsigned char* tile = stages + ring.stage * 64 * 128;
    const int index = i * 7 % kRingTiles;
    for (int c = column; c < column + 16; c += 8) {
      local_wrong += *reinterpret_cast<const std::uint16_t*>(tile + swizzled_offset(row, c, 64)) != ring_pattern(index, row, c);
    }
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbarrier_arrive(&empty[ring.stage]);
  }
  atomicAdd(wrong, local_wrong);
  atomicAdd(checked, 2ull * iterations);
}

std::vector<std::uint16_t> pattern_tensor() {
  std::vector<std::uint16_t> host(kTensorRows * kTensorColumns);
  for (int r = 0; r < kTensorRows; ++r)
    for (int c = 0; c < kTensorColumns; ++c) host[r * kTensorColumns + c] = pattern(r, c);
  return host;
}

}  // namespace

std::vector<std::uint16_t> tma_load_box(int column0, int row0) {
  DeviceArray<std::uint16_t> tensor(pattern_tensor()), out(kBoxRows * 64);
  const CUtensorMap map = map_2d(tensor.data, DType::bf16, kTensorColumns, kTensorRows, 64, kBoxRows);
  tma_load_box_kernel<<<1, 128, kBoxRows * 128 + 1024>>>(map, column0, row0, kBoxRows * 128, out.data);
  synchronize("tma_load_box_kernel");
  return out.download();
}

std::vector<std::uint16_t> tma_store_box(int column0, int row0) {
  DeviceArray<std::uint16_t> tensor(std::vector<std::uint16_t>(kTensorRows * kTensorColumns, 0));
  const CUtensorMap map = map_2d(tensor.data, DType::bf16, kTensorColumns, kTensorRows, 64, kBoxRows);
  tma_store_box_kernel<<<1, 128, kBoxRows * 128 + 1024>>>(map, column0, row0, kBoxRows);
  synchronize("tma_store_box_kernel");
  return tensor.download();
}

// The (n, k) shapes the tests use: the S and P V shapes of the attention tiles, in both types.
#define FLASHLAB_WGMMA_SHAPE(function, n, k)                                        \
  if (n == n_ && k == k_) {                                                                  \
    return dtype == DType::fp16 ? function<__half, n, k>(seed) : function<__nv_bfloat16, n, k>(seed); \
  }

double wgmma_ss_error(DType dtype, int n_, int k_, std::uint64_t seed) {
  FLASHLAB_WGMMA_SHAPE(ss_error, 64, 128)
  FLASHLAB_WGMMA_SHAPE(ss_error, 80, 256)
  FLASHLAB_WGMMA_SHAPE(ss_error, 112, 192)
  FLASHLAB_WGMMA_SHAPE(ss_error, 128, 128)
  FLASHLAB_WGMMA_SHAPE(ss_error, 256, 64)
  throw std::invalid_argument("wgmma_ss_error: shape not instantiated");
}

double wgmma_rs_error(DType dtype, int n_, int k_, std::uint64_t seed) {
  FLASHLAB_WGMMA_SHAPE(rs_error, 64, 128)
  FLASHLAB_WGMMA_SHAPE(rs_error, 96, 128)
  FLASHLAB_WGMMA_SHAPE(rs_error, 128, 128)
  FLASHLAB_WGMMA_SHAPE(rs_error, 192, 112)
  FLASHLAB_WGMMA_SHAPE(rs_error, 256, 80)
  throw std::invalid_argument("wgmma_rs_error: shape not instantiated");
}

RingResult run_ring(int iterations) {
  std::vector<std::uint16_t> host(kRingTiles * 64 * 64);
  for (int tile = 0; tile < kRingTiles; ++tile)
    for (int r = 0; r < 64; ++r)
      for (int c = 0; c < 64; ++c) host[(tile * 64 + r) * 64 + c] = ring_pattern(tile, r, c);
  DeviceArray<std::uint16_t> tiles(host);
  DeviceArray<unsigned long long> checked(std::vector<unsigned long long>{0});
  DeviceArray<int> wrong(std::vector<int>{0});
  const CUtensorMap map = map_2d(tiles.data, DType::bf16, 64, kRingTiles * 64, 64, 64);
  ring_kernel<<<1, 128 * (kRingConsumers + 1), kRingStages * 64 * 128 + 1024>>>(map, iterations, checked.data, wrong.data);
  synchronize("ring_kernel");
  return {checked.download()[0], wrong.download()[0]};
}

}  // namespace flashlab::sm90_tests
