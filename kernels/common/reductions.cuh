// Reductions in registers: over a thread's own values as a balanced tree, and over the four
// lanes of a quad, which hold one row of an mma C fragment between them (lanes 4g .. 4g + 3).
#pragma once

namespace flashlab::kernels::device {

inline constexpr unsigned kAllLanes = 0xffffffffu;

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

// op over the kCount values as a balanced tree (depth log2 kCount instead of a chain of kCount).
template <int kCount, typename Op>
__device__ __forceinline__ float tree_reduce(const float (&values)[kCount], const Op& op) {
  static_assert((kCount & (kCount - 1)) == 0, "a power of two of values");
  if constexpr (kCount == 1) {
    return values[0];
  } else {
    float halves[kCount / 2];
#pragma unroll
    for (int i = 0; i < kCount / 2; ++i) halves[i] = op(values[i], values[i + kCount / 2]);
    return tree_reduce(halves, op);
  }
}

// op over the value of each lane of this lane's quad; every lane of the quad gets the result.
template <typename Op>
__device__ __forceinline__ float quad_reduce(float value, const Op& op) {
  value = op(value, __shfl_xor_sync(kAllLanes, value, 1));
  value = op(value, __shfl_xor_sync(kAllLanes, value, 2));
  return value;
}

}  // namespace flashlab::kernels::device
