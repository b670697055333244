// n / d and n % d for a divisor d fixed at launch, by one multiply-high, a subtraction and two
// shifts in place of the division's reciprocal sequence (about 25 dependent instructions on the
// GPU): Granlund and Montgomery, "Division by invariant integers using multiplication" (1994),
// Figure 4.1, for unsigned 32-bit n. The host works out the multiplier once; plain C++, so the CPU
// tests check it against `/` and `%`.
#pragma once

#include <cstdint>

#include "algorithms/host_device.hpp"

namespace flashlab::kernels {

struct FixedDivisor {
  std::uint32_t divisor = 1;
  std::uint32_t multiplier = 1;  // m' = floor(2^32 (2^l - d) / d) + 1, l = ceil(log2 d)
  std::uint32_t shift1 = 0;      // min(l, 1)
  std::uint32_t shift2 = 0;      // max(l - 1, 0)

  // d in [1, 2^31 - 1]; the callers check their divisors are positive ints.
  static FixedDivisor of(int d) {
    FixedDivisor f;
    f.divisor = static_cast<std::uint32_t>(d);
    std::uint32_t l = 0;
    while ((std::uint64_t{1} << l) < f.divisor) ++l;
    f.multiplier = static_cast<std::uint32_t>(((std::uint64_t{1} << 32) * ((std::uint64_t{1} << l) - f.divisor)) / f.divisor + 1);
    f.shift1 = l < 1 ? l : 1;
    f.shift2 = l > 1 ? l - 1 : 0;
    return f;
  }

  FLASHLAB_HOST_DEVICE int quotient(int n) const {  // n >= 0
    const std::uint32_t u = static_cast<std::uint32_t>(n);
#if defined(__CUDA_ARCH__)
    const std::uint32_t t = __umulhi(multiplier, u);
#else
    const std::uint32_t t = static_cast<std::uint32_t>((static_cast<std::uint64_t>(multiplier) * u) >> 32);
#endif
    return static_cast<int>((t + ((u - t) >> shift1)) >> shift2);
  }
  FLASHLAB_HOST_DEVICE int remainder(int n, int q) const { return n - q * static_cast<int>(divisor); }
};

}  // namespace flashlab::kernels
