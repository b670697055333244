// Checking a whole attention implementation over a grid of problems: the part of the
// reference-test library that any implementation plugs into (a CPU schedule, our GPU kernels
// through device_attention.hpp, or an outside kernel).
//
// For each problem of the grid: fresh random inputs (a new seed per case, printed on failure),
// outputs poisoned with NaN, the implementation run, then
//   - NaN or unwritten elements of O and LSE are errors (poison that survives is NaN),
//   - max |O - oracle| <= 2 x max |O_naive - oracle| + slack, where O_naive is naive attention in
//     the same precision (S, P and O rounded to the dtype, fp32 accumulation: what a framework
//     computes on bf16/fp16 tensors) and the slack at least the output format's rounding of the
//     reference (rounding_slack, reference_check.hpp), and the same for LSE,
//   - fully masked rows (a causal corner or a window that hides every key) must give exactly
//     O = 0 and LSE = -inf (checked apart: the max-error rule alone would let small values pass),
//   - the forward pass is deterministic: a second run on the same inputs is bitwise identical.
// A problem the implementation refuses (std::invalid_argument) is recorded as refused with the
// message, never silently passed; the caller says which refusals it expects. A failure the
// implementation reports itself (ImplementationFailure) is recorded as failed with its message.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "algorithms/problem.hpp"
#include "algorithms/tensors.hpp"
#include "reference/reference_check.hpp"

namespace flashlab::reference {

// An implementation reads tensors.Q, K, V and writes tensors.O and tensors.LSE (host values in
// the problem's dtype; LSE natural-log, [rows_q, heads_q, 1]). It may throw std::invalid_argument.
using ForwardImplementation = std::function<void(const Problem&, AttentionTensors&)>;

// Naive attention in the problem's precision: S = round(modify(scale * Q K^T)) (fp32
// accumulation; softcap, ALiBi and the mask applied as the oracle does), P =
// round(softmax(S)) (softmax in fp32), dropout on P (kept entries round(P / (1 - p))),
// O = round(P V); LSE = logsumexp of the rounded S (before dropout).
struct NaiveOutputs {
  HostTensor O, LSE;
};
NaiveOutputs naive_forward_same_precision(const Problem& problem, const AttentionTensors& inputs);

struct ForwardCheckOptions {
  Tolerance output{2.0, 1e-5};
  Tolerance lse{2.0, 1e-5};
  bool check_determinism = true;
  // > 0: key j of each sequence has its K row scaled by 1 + key_growth * j / seqlen_k (rounded to
  // the dtype), so scores grow along the keys and later key blocks keep raising each row's max by
  // several units: the online softmax's rescaling, not only its first block, decides O.
  double key_growth = 0;
  // != 1: Q and K multiplied by it (scale_queries_and_keys), for scores in the thousands.
  double input_scale = 1;
  // false: the implementation gives no LSE (as PyTorch's SDPA): LSE is neither compared nor part
  // of the fully-masked-row and determinism checks, and the report says so.
  bool check_lse = true;
};

struct CaseResult {
  enum class Status { passed, failed, refused };
  Status status = Status::passed;
  Problem problem;
  std::uint64_t seed = 0;
  double o_error = 0, o_naive_error = 0, lse_error = 0, lse_naive_error = 0;
  long long fully_masked_rows = 0;
  std::string report;  // readable: shape, mask, errors and where; the refusal message if refused
};

struct GridResult {
  std::vector<CaseResult> cases;
  int passed = 0, failed = 0, refused = 0;
  std::string summary() const;  // one line per failing or refused case, then the counts
};

CaseResult check_forward_case(const ForwardImplementation& implementation, const Problem& problem,
                              const ForwardCheckOptions& options = {});
GridResult check_forward_grid(const ForwardImplementation& implementation, const std::vector<Problem>& grid,
                              const ForwardCheckOptions& options = {});

// The official tests' odd (seqlen_q, seqlen_k) shapes.
const std::vector<std::pair<int, int>>& official_odd_shapes();

// The default grid for a dtype: every official odd shape with no mask, causal bottom-right and
// causal top-left, head dims cycling through `head_dims` (each dim meets several shapes and
// masks), MHA, GQA and MQA, sliding windows (with and without causal), and varlen batches.
std::vector<Problem> default_forward_grid(DType dtype, const std::vector<int>& head_dims = {40, 59, 64, 96, 111, 128, 256});

// "(batch 1, position 17)" for a packed row of the problem (varlen aware).
std::string describe_row(const Problem& problem, int packed_row);

}  // namespace flashlab::reference
