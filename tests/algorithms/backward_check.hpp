// Shared by the backward-schedule tests: runs a backward schedule on a whole problem after the
// FA2 forward has produced O and LSE, and measures its gradients against the oracle's.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "algorithms/00_oracle.hpp"
#include "algorithms/04_fa2_forward.hpp"
#include "algorithms/05_standard_backward.hpp"
#include "algorithms/06_fa1_backward.hpp"
#include "algorithms/07_fa2_backward.hpp"
#include "algorithms/run_schedule.hpp"
#include "reference/reference_check.hpp"

namespace flashlab::backward_test {

enum class Schedule { standard, fa1, fa2 };

inline const char* to_string(Schedule schedule) {
  switch (schedule) {
    case Schedule::standard: return "05 standard backward (FA1 Algorithm 3)";
    case Schedule::fa1: return "06 FA1 backward (FA1 Algorithm 4)";
    case Schedule::fa2: return "07 FA2 backward (FA2 Algorithm 2)";
  }
  return "?";
}

struct Blocks {
  int rows = 64;
  int cols = 64;
};

// Runs one backward schedule over the problem with the given memory model; tensors must hold
// Q, K, V, dO, O and LSE. tensors == nullptr: shape-only.
template <class Memory = DataMemory>
Counters run(Schedule schedule, const Problem& problem, AttentionTensors* tensors, Blocks blocks,
             std::int64_t sram_bytes = 0) {
  switch (schedule) {
    case Schedule::standard:
      return run_standard_backward<Memory>(problem, tensors, sram_bytes, BlockTiling{blocks.rows, blocks.cols});
    case Schedule::fa1:
      return run_fa1_backward<Memory>(problem, tensors, sram_bytes, BlockTiling{blocks.rows, blocks.cols});
    case Schedule::fa2:
      return run_fa2_backward<Memory>(problem, tensors, sram_bytes, BlockTiling{blocks.rows, blocks.cols});
  }
  return {};
}

// Fresh random Q, K, V, dO in the problem's dtype; O and LSE from the FA2 forward (in the same
// dtype); dQ, dK, dV poisoned with NaN.
inline AttentionTensors forward_inputs(const Problem& problem, std::uint64_t seed) {
  AttentionTensors tensors = reference::random_inputs(problem, seed, /*with_backward=*/true);
  run_per_head(problem, tensors, 0, [](auto& mem, const HeadProblem& head, const HeadTensors& x) {
    fa2_forward(mem, head, BlockTiling{64, 64}, x);
  });
  return tensors;
}

struct GradientErrors {
  reference::ErrorReport dQ, dK, dV;
  double max_error() const { return std::max({dQ.max_error, dK.max_error, dV.max_error}); }
  bool any_nan() const { return dQ.nan_count != 0 || dK.nan_count != 0 || dV.nan_count != 0; }
  std::string describe() const {
    return dQ.describe("dQ") + "\n" + dK.describe("dK") + "\n" + dV.describe("dV");
  }
};

inline GradientErrors compare_gradients(const AttentionTensors& tensors, const OracleResult& oracle) {
  return {reference::compare(tensors.dQ, oracle.dQ), reference::compare(tensors.dK, oracle.dK),
          reference::compare(tensors.dV, oracle.dV)};
}

// The largest |gradient| of the oracle, to scale an fp32 tolerance.
inline double largest_gradient(const OracleResult& oracle) {
  double largest = 0;
  for (const OracleTensor* t : {&oracle.dQ, &oracle.dK, &oracle.dV})
    for (double v : t->values) largest = std::max(largest, std::fabs(v));
  return largest;
}

}  // namespace flashlab::backward_test
