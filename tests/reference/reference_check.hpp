// The reference-test library: fresh random inputs, poisoned outputs, errors against the oracle
// and the low-precision rule of the official flash-attention tests. CPU schedules, our GPU kernels
// and outside kernels are all checked through it.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "algorithms/00_oracle.hpp"
#include "algorithms/problem.hpp"
#include "algorithms/tensors.hpp"

namespace flashlab::reference {

// Standard-normal inputs (Q, K, V and dO when allocated) rounded to the problem's dtype, from a
// seed the caller makes fresh per case; outputs (O, LSE, dQ, dK, dV) poisoned with NaN so that
// an element a schedule never writes fails the check.
AttentionTensors random_inputs(const Problem& problem, std::uint64_t seed, bool with_backward);
void poison_outputs(AttentionTensors& tensors);

// A fresh seed per call (time and a counter), reported with every failure so it can be replayed:
// with FLASHLAB_TEST_SEED set, every call returns that seed instead.
std::uint64_t fresh_seed();

// The largest |got - expected| over a tensor, where it is, and whether anything was NaN or
// unwritten. -inf matches -inf (fully masked rows' LSE); a NaN anywhere is an infinite error.
struct ErrorReport {
  double max_error = 0;
  int row = -1, head = -1, col = -1;
  double got = 0, expected = 0;
  long long nan_count = 0;
  std::string describe(const std::string& tensor_name) const;
};
ErrorReport compare(const HostTensor& got, const OracleTensor& expected);

// The official tests' rule: error <= factor * naive_error + slack, where naive_error is that of
// a naive implementation in the same precision (factor 2 for outputs, 3 for gradients).
struct Tolerance {
  double factor = 2.0;
  double slack = 1e-5;
};
bool within_rule(const ErrorReport& error, double naive_error, Tolerance tolerance);

// The official tests' slack for an output stored in a low-precision dtype: twice the largest error
// that arithmetic in that dtype makes on the reference itself, |fl(fl(ref + 0.3) - 0.3) - fl(ref)|.
// It is the output format's own rounding at the output's magnitude: where the naive error is 0 (a
// row with one key: O = V exactly), an implementation whose P of that key is not exactly 1 (the
// scale folded into one FFMA) lands an ulp away. 0 for fp32.
double rounding_slack(DType dtype, const OracleTensor& reference);

// A failure an implementation finds on its own side (device_attention.hpp: a kernel wrote into
// the poisoned padding around its outputs). The checks record the case as failed with the message,
// as they record a refusal (std::invalid_argument) as refused.
struct ImplementationFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Q and K multiplied by `factor` (rounded to the dtype): scores grow as factor^2, so factor 30-100
// puts them in the thousands to tens of thousands, where exp overflows unless the softmax's max
// subtraction and rescaling are right.
void scale_queries_and_keys(AttentionTensors& tensors, double factor);

// A short description of a problem for failure reports.
std::string describe(const Problem& problem);

}  // namespace flashlab::reference
