// The oracle: naive materialised attention in double precision (FA1 Algorithm 0 without the
// HBM round trips), with analytic gradients. Every schedule and kernel is checked against it.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "problem.hpp"
#include "tensors.hpp"

namespace flashlab {

// A double-precision tensor in the [rows, heads, dim] layout.
struct OracleTensor {
  int rows = 0, heads = 0, dim = 0;
  std::vector<double> values;

  OracleTensor() = default;
  OracleTensor(int rows, int heads, int dim)
      : rows(rows), heads(heads), dim(dim), values(tensor_elements("an oracle tensor", rows, heads, dim), 0.0) {}
  double& at(int row, int head, int col) { return values[(static_cast<std::size_t>(row) * heads + head) * dim + col]; }
  double at(int row, int head, int col) const { return values[(static_cast<std::size_t>(row) * heads + head) * dim + col]; }
};

struct OracleResult {
  OracleTensor O, LSE;         // LSE: dim 1; -inf for fully masked rows
  OracleTensor dQ, dK, dV;     // when dO was given
  // P per (batch, head) when asked for: P[b * heads_q + h] is seqlen_q_of(b) x seqlen_k_of(b),
  // row-major, after dropout (the matrix that multiplies V).
  std::vector<std::vector<double>> P;
};

struct OracleOptions {
  bool keep_probabilities = false;
  // Threads working on (sequence, KV head) units at once, each on its own heads' rows: the result
  // is the same bit for bit for any count (a unit adds its query heads into dK and dV in the
  // serial order); each thread holds one head's score matrices (oracle_bytes counts them).
  int workers = 1;
};

// Inputs are read as given (already rounded to the problem's dtype); all math in double.
OracleResult oracle_attention(const Problem& problem, const AttentionTensors& inputs,
                              const HostTensor* dO = nullptr, OracleOptions options = {});

// The host memory oracle_attention holds at its peak, in bytes: its double-precision outputs and
// the score-sized matrices of the largest sequence, which it materialises per head (per worker).
// An upper bound, saturated at the int64 maximum (no wrap).
std::int64_t oracle_bytes(const Problem& problem, bool with_gradients, OracleOptions options = {});

// The largest |got - expected| over two equally long sequences of values; -inf matches -inf (a
// fully masked row's LSE); a NaN, an unmatched infinity or a length mismatch is an infinite error.
double max_abs_error(std::span<const float> got, std::span<const double> expected);

}  // namespace flashlab
