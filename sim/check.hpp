// The main job's check: every CPU schedule run on real data and compared with the
// double-precision oracle (forward: O and LSE; backward: dQ, dK, dV), plus the three softmax
// schedules of the softmax lab against a double softmax.
#pragma once

#include <string>
#include <vector>

#include "algorithms/00_oracle.hpp"
#include "algorithms/problem.hpp"
#include "schedules.hpp"

namespace flashlab::sim {

// The largest |got - expected| over a tensor; -inf matches -inf; a NaN is an infinite error.
double max_error(const HostTensor& got, const OracleTensor& expected);

struct CheckRow {
  std::string schedule;  // registry name, or softmax_* for the softmax lab
  std::string paper;
  BlockSizes blocks;
  std::vector<std::pair<std::string, double>> errors;  // ("O", 3e-7), ("LSE", ...), ...
  std::int64_t hbm_bytes = 0;
  double tolerance = 0;
  bool passed() const;
};

// The bound on the max error against the oracle: 1e-4 in fp32, 2e-2 in fp16 and bf16, times 3
// for gradients (the official rule's 3x).
double check_tolerance(DType dtype, Pass pass);

// The default problem of the main job: batch 2, 4 query heads on 2 KV heads (GQA), seqlen_q 113,
// seqlen_k 203, head_dim 59 (none of them multiples of the blocks), fp32, no mask.
Problem default_check_problem();

// Runs one registry schedule on data and compares it with the oracle.
CheckRow check_schedule(const std::string& schedule, const Problem& problem, std::int64_t sram_bytes, std::uint64_t seed);
// Every registry schedule, then the softmax lab.
std::vector<CheckRow> check_all(const Problem& problem, std::int64_t sram_bytes, std::uint64_t seed);

}  // namespace flashlab::sim
