// The Hopper primitives of kernels/common/sm90_*.cuh, each alone on the GPU, and the rung's GEMM:
//   - a TMA load with the 128-byte swizzle puts every element where swizzled_offset() says and
//     reads zeros outside the tensor; a TMA store writes such a tile back and drops what falls
//     outside;
//   - one wgmma per shape against the CPU: SS with K-major A and B (the S = Q K^T form) and RS with
//     A in registers and an MN-major B (the O = P V form), in bf16 and fp16;
//   - a three-stage ring of full and empty mbarriers over 10,000 iterations delivers every tile, in
//     order, to two consumer warpgroups;
//   - the warp-specialized GEMM against the CPU on shapes that are not multiples of its tiles.
// The executable is built for sm_90a only; its main skips it (exit 77) without a 9.0 device.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "catch.hpp"
#include "kernels/03_fa3_sm90/gemm.hpp"
#include "kernels/common/swizzle.hpp"
#include "kernels/sm90/primitive_kernels.hpp"

using namespace flashlab;
using namespace flashlab::sm90_tests;
using flashlab::kernels::swizzled_offset;

TEST_CASE("TMA load with the 128-byte swizzle: every element where swizzled_offset says, zeros outside",
          "[sm90_primitives]") {
  const int column0 = 8, row0 = 40;  // rows 100..103 of the box lie outside the tensor
  const auto tile = tma_load_box(column0, row0);
  int wrong = 0, unswizzled_matches = 0;
  for (int r = 0; r < kBoxRows; ++r) {
    for (int c = 0; c < 64; ++c) {
      const std::uint16_t expected = row0 + r < kTensorRows ? pattern(row0 + r, column0 + c) : 0;
      wrong += tile[swizzled_offset(r, c, kBoxRows) / 2] != expected;
      unswizzled_matches += tile[r * 64 + c] == expected;
    }
  }
  CHECK(wrong == 0);
  CHECK(unswizzled_matches < kBoxRows * 64 / 4);  // the layout really is swizzled
}

TEST_CASE("TMA store of a swizzled tile: written inside the tensor, dropped outside", "[sm90_primitives]") {
  const int column0 = 16, row0 = 50;  // columns 72..79 and rows 100..113 of the box fall outside
  const auto tensor = tma_store_box(column0, row0);
  int wrong = 0;
  for (int r = 0; r < kTensorRows; ++r) {
    for (int c = 0; c < kTensorColumns; ++c) {
      const bool inside = r >= row0 && c >= column0;
      const std::uint16_t expected = inside ? static_cast<std::uint16_t>((r - row0) * 256 + (c - column0) + 1) : 0;
      wrong += tensor[r * kTensorColumns + c] != expected;
    }
  }
  CHECK(wrong == 0);
}

TEST_CASE("one wgmma, SS (K-major A and B), against the CPU", "[sm90_primitives]") {
  const std::uint64_t seed = Catch::rngSeed();
  for (const DType dtype : {DType::bf16, DType::fp16}) {
    for (const auto& [n, k] : std::vector<std::pair<int, int>>{{64, 128}, {80, 256}, {112, 192}, {128, 128}, {256, 64}}) {
      INFO(to_string(dtype) << " m64n" << n << " over k " << k);
      CHECK(wgmma_ss_error(dtype, n, k, seed + n) < 1e-5);
    }
  }
}

TEST_CASE("one wgmma, RS (A in registers, MN-major B), against the CPU", "[sm90_primitives]") {
  const std::uint64_t seed = Catch::rngSeed() + 1;
  for (const DType dtype : {DType::bf16, DType::fp16}) {
    for (const auto& [n, k] : std::vector<std::pair<int, int>>{{64, 128}, {96, 128}, {128, 128}, {192, 112}, {256, 80}}) {
      INFO(to_string(dtype) << " m64n" << n << " over k " << k);
      CHECK(wgmma_rs_error(dtype, n, k, seed + n) < 1e-5);
    }
  }
}

TEST_CASE("a three-stage TMA ring over 10,000 iterations delivers every tile in order", "[sm90_primitives]") {
  constexpr int kIterations = 10000;
  const RingResult result = run_ring(kIterations);
  CHECK(result.wrong == 0);
  CHECK(result.checked == 2ull * kIterations * kRingConsumerThreads);
}

namespace {

float bf16_value(std::uint16_t bits) {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}

struct DeviceBuffer {
  void* data = nullptr;
  explicit DeviceBuffer(std::size_t bytes) { REQUIRE(cudaMalloc(&data, bytes) == cudaSuccess); }
  ~DeviceBuffer() { cudaFree(data); }
};

}  // namespace

TEST_CASE("the warp-specialized GEMM against the CPU, shapes off its tiles", "[sm90_primitives]") {
  std::mt19937 rng(Catch::rngSeed() + 2);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (const auto& [m, n, k] : std::vector<std::tuple<int, int, int>>{{200, 264, 136}, {128, 256, 64}, {1, 8, 8}, {333, 520, 1000}}) {
    INFO("m " << m << " n " << n << " k " << k);
    std::vector<std::uint16_t> a(static_cast<std::size_t>(m) * k), b(static_cast<std::size_t>(n) * k);
    for (auto* matrix : {&a, &b}) {
      for (auto& x : *matrix) {
        const __nv_bfloat16 value = __float2bfloat16_rn(normal(rng));
        std::memcpy(&x, &value, 2);
      }
    }
    DeviceBuffer a_device(a.size() * 2), b_device(b.size() * 2), c_device(static_cast<std::size_t>(m) * n * 2);
    REQUIRE(cudaMemcpy(a_device.data, a.data(), a.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaMemcpy(b_device.data, b.data(), b.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaMemset(c_device.data, 0xFF, static_cast<std::size_t>(m) * n * 2) == cudaSuccess);  // NaN
    kernels::sm90_gemm_bf16(a_device.data, b_device.data, c_device.data, m, n, k, nullptr);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<std::uint16_t> c(static_cast<std::size_t>(m) * n);
    REQUIRE(cudaMemcpy(c.data(), c_device.data, c.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
    int wrong = 0;
    double worst = 0;
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        double reference = 0;
        for (int l = 0; l < k; ++l) reference += double(bf16_value(a[i * k + l])) * bf16_value(b[j * k + l]);
        const double value = bf16_value(c[i * n + j]);
        // bf16 output rounding (2^-9 relative) plus fp32 accumulation.
        const double error = std::isfinite(value) ? std::abs(value - reference) : INFINITY;
        worst = std::max(worst, error);
        wrong += error > std::abs(reference) * 0x1p-8 + 1e-4 * std::sqrt(double(k));
      }
    }
    INFO("worst error " << worst);
    CHECK(wrong == 0);
  }
}

TEST_CASE("the GEMM refuses shapes it cannot take, by name", "[sm90_primitives]") {
  DeviceBuffer buffer(1 << 16);
  CHECK_THROWS_WITH(kernels::sm90_gemm_bf16(buffer.data, buffer.data, buffer.data, 16, 12, 16, nullptr),
                    flashlab::testing::contains_text("n = 12"));
  CHECK_THROWS_WITH(kernels::sm90_gemm_bf16(buffer.data, buffer.data, buffer.data, 0, 16, 16, nullptr),
                    flashlab::testing::contains_text("m, n, k"));
}
