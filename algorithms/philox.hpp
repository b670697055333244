// Philox4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3",
// SC'11): a counter-based RNG. The dropout decision for an element is a pure function of
// (seed, offset, batch, head, row, col), so CPU schedules, the oracle and GPU kernels that
// visit elements in any order agree bit for bit.
#pragma once

#include <cstdint>

#include "host_device.hpp"

namespace flashlab {

struct PhiloxOutput {
  std::uint32_t word[4];
};

FLASHLAB_HOST_DEVICE PhiloxOutput philox4x32_10(std::uint64_t key, std::uint32_t c0, std::uint32_t c1,
                                                std::uint32_t c2, std::uint32_t c3) {
  constexpr std::uint32_t kMultiplier0 = 0xD2511F53u, kMultiplier1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  std::uint32_t k0 = static_cast<std::uint32_t>(key), k1 = static_cast<std::uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t product0 = static_cast<std::uint64_t>(kMultiplier0) * c0;
    const std::uint64_t product1 = static_cast<std::uint64_t>(kMultiplier1) * c2;
    const std::uint32_t hi0 = static_cast<std::uint32_t>(product0 >> 32), lo0 = static_cast<std::uint32_t>(product0);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(product1 >> 32), lo1 = static_cast<std::uint32_t>(product1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {{c0, c1, c2, c3}};
}

// The uniform in [0, 1) deciding whether probability (row, col) of (batch, head) is dropped:
// the counter is (col, row, batch * 65536 + head, offset), the key is the seed.
FLASHLAB_HOST_DEVICE float dropout_uniform(std::uint64_t seed, std::uint64_t offset, int batch_index,
                                           int head_index, int row, int col) {
  const PhiloxOutput r = philox4x32_10(
      seed, static_cast<std::uint32_t>(col), static_cast<std::uint32_t>(row),
      static_cast<std::uint32_t>(batch_index) * 65536u + static_cast<std::uint32_t>(head_index),
      static_cast<std::uint32_t>(offset));
  return static_cast<float>(r.word[0] >> 8) * (1.0f / 16777216.0f);  // 24 random bits
}

}  // namespace flashlab
