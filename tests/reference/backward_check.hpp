// The backward pass checked the official tests' way: gradients against the double-precision
// oracle's, max error <= 3x that of a naive backward in the same precision plus a tiny slack. The
// forward inputs of the backward (O rounded to the dtype, and the LSE) come from the oracle, so a
// forward bug cannot hide a backward one. Any implementation plugs in: a CPU schedule, our FA2
// backward kernel through device_attention.hpp, or an outside kernel.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>

#include "algorithms/00_oracle.hpp"
#include "reference/attention_check.hpp"

namespace flashlab::reference {

// The naive backward in the problem's precision, as a framework computes it on bf16/fp16 tensors:
// every materialised matrix (S, P, dP, dS and each matmul's output) rounded to the dtype, matmuls
// accumulated in fp32, the softmax and its backward in fp32 with rounded outputs; D = rowsum(dO o
// O) from the O the kernel is given.
struct NaiveGradients {
  HostTensor dQ, dK, dV;
};
NaiveGradients naive_backward_same_precision(const Problem& problem,
                                             const AttentionTensors& inputs);

// Fresh Q, K, V, dO (Q and K multiplied by input_scale), O (rounded to the dtype) and LSE from the
// oracle; dQ, dK, dV poisoned.
AttentionTensors backward_inputs(const Problem& problem, std::uint64_t seed,
                                 double input_scale = 1);

// Reads Q, K, V, O, LSE and dO of the tensors and writes dQ, dK, dV; may throw
// std::invalid_argument (a refusal) or ImplementationFailure.
using BackwardImplementation = std::function<void(const Problem&, AttentionTensors&)>;

struct BackwardCheckOptions {
  Tolerance gradients{3.0, 1e-4};
  double input_scale = 1;  // != 1: Q and K multiplied by it (scores in the thousands)
};

// One case's inputs and what its gradients are held to, computed once for any number of runs.
struct BackwardReference {
  Problem problem;
  std::uint64_t seed = 0;
  double input_scale = 1;
  AttentionTensors inputs;
  OracleResult oracle;
  NaiveGradients naive;
  std::array<double, 3> naive_errors{};  // dQ, dK, dV of the naive backward against the oracle
};
BackwardReference backward_reference(const Problem& problem, std::uint64_t seed,
                                     double input_scale = 1);

struct BackwardCaseResult {
  CaseResult::Status status = CaseResult::Status::passed;
  Problem problem;
  std::uint64_t seed = 0;
  std::array<ErrorReport, 3> errors;  // dQ, dK, dV
  std::array<double, 3> naive_errors{};
  std::string report;
};

// One run of the implementation on the reference's inputs (gradients poisoned first), held to the
// rule; the gradients it wrote are left in *gradients when given.
BackwardCaseResult run_backward_case(const BackwardImplementation& implementation,
                                     const BackwardReference& reference,
                                     const BackwardCheckOptions& options = {},
                                     AttentionTensors* gradients = nullptr);
// backward_reference with a fresh seed, then run_backward_case.
BackwardCaseResult check_backward_case(const BackwardImplementation& implementation,
                                       const Problem& problem,
                                       const BackwardCheckOptions& options = {});

}  // namespace flashlab::reference
