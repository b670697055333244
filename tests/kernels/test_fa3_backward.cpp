// The FA3-generation backward (kernels/03_fa3_sm90/backward_*) through the reference-test library:
// gradients by the 3x rule against the double-precision oracle on the default grid (official odd
// shapes, both causal alignments, windows, GQA/MQA, varlen, rows that see no key) in bf16 and fp16
// with the atomic and the deterministic dQ, the other head dims it pads, d 256's head-dim-split
// dataflow, scores in the thousands, the deterministic mode bitwise repeated, and its refusals. On a device that is not compute
// capability 9.0 every case must come back refused, naming the compute capability.
#include <cuda_runtime.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "catch.hpp"
#include "kernels/03_fa3_sm90/backward_tiling.hpp"
#include "kernels/attention_api.hpp"
#include "reference/attention_check.hpp"
#include "reference/backward_check.hpp"
#include "reference/device_attention.hpp"
#include "reference/reference_check.hpp"

using namespace flashlab;
using reference::CaseResult;

namespace {

bool hopper_device() {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  return major == 9 && minor == 0;
}

reference::BackwardImplementation fa3_backward_on_device(bool deterministic) {
  return reference::on_device_backward([deterministic](const Problem& problem, const kernels::BackwardArgs& args) {
    kernels::BackwardArgs with_mode = args;
    with_mode.deterministic = deterministic;
    kernels::fa3_backward(problem, with_mode);
  });
}

// Passed on Hopper; refused naming the compute capability elsewhere.
void require_passed(const reference::BackwardCaseResult& result) {
  INFO(result.report);
  if (hopper_device()) {
    CHECK(result.status == CaseResult::Status::passed);
  } else {
    CHECK(result.status == CaseResult::Status::refused);
    CHECK(result.report.find("compute capability") != std::string::npos);
  }
}

// Whether a problem takes d 128's 80-row tiling: its padded head dim and the launcher's choice of
// variant (fa3::backward_masked_variant), read back from that tiling's block shape.
bool takes_80_rows(const Problem& problem) {
  namespace fa3 = kernels::fa3;
  if (fa3::backward_padded_head_dim(problem.head_dim) != 128) return false;
  const bool masked = fa3::backward_masked_variant(128, problem.mask.causal, problem.mask.window_left,
                                                   problem.mask.window_right, problem.seqlen_q);
  return (masked ? fa3::BackwardTiling<128, true>::kBlockM : fa3::BackwardTiling<128, false>::kBlockM) == 80;
}

// Each problem's reference (fresh inputs, the oracle and the naive backward: most of a case's
// time) worked out once, then the kernel in each dQ mode of `modes` held to it.
void check_problems(const std::vector<Problem>& problems, std::initializer_list<bool> modes = {false, true},
                    const reference::BackwardCheckOptions& options = {}) {
  for (const Problem& problem : problems) {
    const auto reference_case = reference::backward_reference(problem, reference::fresh_seed(), options.input_scale);
    for (const bool deterministic : modes) {
      INFO((deterministic ? "deterministic dQ" : "atomic dQ"));
      require_passed(reference::run_backward_case(fa3_backward_on_device(deterministic), reference_case, options));
    }
  }
}

}  // namespace

TEST_CASE("FA3 backward kernel passes the default grid, bf16 and fp16", "[fa3_backward]") {
  const DType dtype = GENERATE(DType::bf16, DType::fp16);
  check_problems(reference::default_forward_grid(dtype, {64, 128, 40, 96, 104}));
}

// The head-dim-split dataflow (d 256 and the head dims it pads) on the default grid: bf16 with the
// atomic dQ, fp16 with the deterministic one, as two cases that can run one at a time.
TEST_CASE("FA3 backward kernel: the head-dim-split dataflow on the default grid with the atomic dQ", "[fa3_backward]") {
  check_problems(reference::default_forward_grid(DType::bf16, {256, 192, 232}), {false});
}
TEST_CASE("FA3 backward kernel: the head-dim-split dataflow on the default grid with the deterministic dQ", "[fa3_backward]") {
  check_problems(reference::default_forward_grid(DType::fp16, {256, 192, 232}), {true});
}

TEST_CASE("FA3 backward kernel: more key blocks and query blocks than one, GQA, every mask", "[fa3_backward]") {
  std::vector<Problem> problems;
  for (const int head_dim : {64, 128, 256}) {
    for (const int mask : {0, 1, 2, 3}) {
      Problem p;
      p.dtype = DType::bf16, p.batch = 2, p.heads_q = 4, p.heads_kv = 1, p.seqlen_q = 700, p.seqlen_k = 650;
      p.head_dim = head_dim;
      if (mask == 3) {
        p.mask.window_left = 130, p.mask.window_right = 70;
      } else {
        p.mask.causal = mask != 0;
        p.mask.alignment = mask == 2 ? CausalAlignment::top_left : CausalAlignment::bottom_right;
      }
      problems.push_back(p);
    }
  }
  Problem varlen;
  varlen.dtype = DType::fp16, varlen.heads_q = 6, varlen.heads_kv = 2, varlen.head_dim = 128, varlen.mask.causal = true;
  set_varlen(varlen, {700, 1, 333, 129, 64}, {700, 5, 333, 1000, 17});
  problems.push_back(varlen);
  // d 128 under a causal mask with fa3::kBackwardLongCausal queries or more takes the 80-row
  // tiling (below, the masked variant's 64 rows): both alignments, few keys so that the oracle
  // stays small (bottom right: the first 7200 queries see no key).
  Problem long_causal;
  long_causal.dtype = DType::bf16, long_causal.heads_q = 2, long_causal.heads_kv = 1, long_causal.head_dim = 128;
  long_causal.seqlen_q = 8200, long_causal.seqlen_k = 333, long_causal.mask.causal = true;
  long_causal.mask.alignment = CausalAlignment::top_left;
  REQUIRE(takes_80_rows(long_causal));
  problems.push_back(long_causal);
  long_causal.dtype = DType::fp16, long_causal.seqlen_k = 1000, long_causal.mask.alignment = CausalAlignment::bottom_right;
  problems.push_back(long_causal);
  check_problems(problems);
}

// At d 64 the kernel is persistent (a block per SM walks key blocks): problems with several
// times more key blocks than an H200 has SMs, so that every block walks several, among them key
// blocks no query sees (causal, top left, fewer queries than keys) and, varlen, key blocks past
// their sequence's end. The d 128 and 256 problems check the same walk's one-key-block path,
// whose producer roles read their key block from shared memory.
TEST_CASE("FA3 backward kernel: blocks that walk several key blocks", "[fa3_backward]") {
  std::vector<Problem> problems;
  Problem causal;  // 9 key blocks x 12 KV heads x 4 sequences = 432 key blocks, 6 of 9 seen by no query
  causal.dtype = DType::bf16, causal.batch = 4, causal.heads_q = 24, causal.heads_kv = 12;
  causal.seqlen_q = 300, causal.seqlen_k = 1100, causal.head_dim = 64;
  causal.mask.causal = true, causal.mask.alignment = CausalAlignment::top_left;
  problems.push_back(causal);
  Problem window = causal;  // d 256: 18 key blocks x 8 KV heads x 2 sequences = 288
  window.dtype = DType::fp16, window.batch = 2, window.heads_q = 16, window.heads_kv = 8, window.seqlen_q = 200;
  window.head_dim = 256, window.mask = {};
  window.mask.window_left = 300, window.mask.window_right = 40;
  problems.push_back(window);
  Problem bottom_right = causal;  // d 128: 9 key blocks x 8 KV heads x 3 sequences = 216
  bottom_right.batch = 3, bottom_right.heads_q = 16, bottom_right.heads_kv = 8, bottom_right.seqlen_q = 256;
  bottom_right.head_dim = 128, bottom_right.mask.alignment = CausalAlignment::bottom_right;
  problems.push_back(bottom_right);
  Problem varlen;  // 8 key blocks (of the longest) x 4 KV heads x 12 sequences = 384, most past their sequence
  varlen.dtype = DType::bf16, varlen.heads_q = 8, varlen.heads_kv = 4, varlen.head_dim = 64;
  set_varlen(varlen, {300, 1, 64, 129, 700, 5, 33, 256, 1000, 17, 90, 2}, {1000, 3, 64, 200, 700, 1, 500, 255, 40, 17, 91, 130});
  problems.push_back(varlen);
  // d 128's 80-row tiling (the longest sequence has kBackwardLongCausal queries) with key blocks
  // no query sees: 3 key blocks (of the longest) x 48 KV heads x 2 sequences = 288; the second
  // sequence's 40 queries see none of its keys past 39, the first's one key leaves two past its end.
  Problem long_causal_unseen;
  long_causal_unseen.dtype = DType::bf16, long_causal_unseen.heads_q = 96, long_causal_unseen.heads_kv = 48;
  long_causal_unseen.head_dim = 128, long_causal_unseen.mask.causal = true;
  long_causal_unseen.mask.alignment = CausalAlignment::top_left;
  set_varlen(long_causal_unseen, {kernels::fa3::kBackwardLongCausal, 40}, {1, 300});
  REQUIRE(takes_80_rows(long_causal_unseen));
  problems.push_back(long_causal_unseen);
  check_problems(problems);
}

TEST_CASE("FA3 backward kernel: scores in the thousands stay within the rule", "[fa3_backward]") {
  reference::BackwardCheckOptions options;
  options.input_scale = 100;  // bf16: Q and K times 100
  std::vector<Problem> problems;
  for (const int causal : {0, 1}) {
    Problem p;
    p.dtype = DType::bf16, p.batch = 1, p.heads_q = 2, p.heads_kv = 1, p.seqlen_q = 300, p.seqlen_k = 257;
    p.head_dim = causal ? 64 : 128, p.mask.causal = causal == 1;
    problems.push_back(p);
    p.head_dim = 256;
    problems.push_back(p);
  }
  check_problems(problems, {false}, options);
}

// 9 key blocks (18 at d 256) x 16 KV heads x 2 sequences: more than an H200's 132 SMs, so that
// where the kernel is persistent its blocks walk several key blocks and take their dQ turns there.
TEST_CASE("FA3 backward kernel: the deterministic mode is bitwise repeatable over 20 runs", "[fa3_backward]") {
  Problem problem;
  problem.dtype = DType::bf16, problem.batch = 2, problem.heads_q = 32, problem.heads_kv = 16;
  problem.seqlen_q = 160, problem.seqlen_k = 1100, problem.head_dim = GENERATE(64, 128, 256);
  problem.mask.causal = GENERATE(false, true);
  const auto reference_case = reference::backward_reference(problem, reference::fresh_seed());
  AttentionTensors first;
  const auto result = reference::run_backward_case(fa3_backward_on_device(true), reference_case, {}, &first);
  require_passed(result);
  if (!hopper_device()) return;
  for (int repeat = 0; repeat < 20; ++repeat) {
    AttentionTensors again;
    reference::run_backward_case(fa3_backward_on_device(true), reference_case, {}, &again);
    INFO(reference::describe(problem) << ", repeat " << repeat);
    CHECK(again.dQ.values == first.dQ.values);
    CHECK(again.dK.values == first.dK.values);
    CHECK(again.dV.values == first.dV.values);
  }
}

TEST_CASE("FA3 backward kernel refuses by name what it does not do", "[fa3_backward]") {
  Problem problem;
  problem.dtype = DType::bf16, problem.heads_q = 2, problem.heads_kv = 1, problem.seqlen_q = 64, problem.seqlen_k = 64;
  for (const int head_dim : {264, 512, 60}) {
    problem.head_dim = head_dim;
    const auto result = reference::check_backward_case(fa3_backward_on_device(false), problem);
    INFO(result.report);
    CHECK(result.status == CaseResult::Status::refused);
    CHECK(result.report.find("head_dim = " + std::to_string(head_dim)) != std::string::npos);
  }
  problem.head_dim = 64;
  problem.dtype = DType::fp32;
  CHECK_THROWS_WITH(kernels::fa3_backward(problem, kernels::BackwardArgs{}), flashlab::testing::contains_text("fp32"));
}

// A small grid for compute-sanitizer (memcheck, racecheck, synccheck): odd shapes, masks, GQA,
// varlen, every padded head dim, both dQ modes, blocks walking several key blocks.
TEST_CASE("FA3 backward kernel on a small grid (for the sanitizers)", "[sanitizer_grid_sm90]") {
  std::vector<Problem> problems;
  for (const auto& [seqlen_q, seqlen_k] : std::vector<std::pair<int, int>>{{113, 203}, {239, 1}, {128, 217}}) {
    for (const int head_dim : {64, 128, 256}) {
      Problem p;
      p.dtype = DType::bf16, p.heads_q = 2, p.heads_kv = 1, p.seqlen_q = seqlen_q, p.seqlen_k = seqlen_k;
      p.head_dim = head_dim, p.mask.causal = head_dim != 64;
      problems.push_back(p);
    }
  }
  Problem varlen;
  varlen.dtype = DType::bf16, varlen.head_dim = 128;
  set_varlen(varlen, {113, 1, 239}, {203, 3, 1});
  problems.push_back(varlen);
  // More key blocks than an H200 has SMs, a few query rows each, causal top left with key blocks
  // no query sees: at d 64 persistent blocks walk several of them.
  for (const int head_dim : {64, 128, 256}) {
    Problem walk;
    walk.dtype = DType::bf16, walk.batch = 3, walk.heads_q = 120, walk.heads_kv = 60, walk.seqlen_q = 40;
    walk.seqlen_k = 150, walk.head_dim = head_dim, walk.mask.causal = true, walk.mask.alignment = CausalAlignment::top_left;
    problems.push_back(walk);
  }
  for (const bool deterministic : {false, true}) {
    for (const Problem& problem : problems) {
      const auto result = reference::check_backward_case(fa3_backward_on_device(deterministic), problem);
      INFO(result.report);
      if (hopper_device()) CHECK(result.status == CaseResult::Status::passed);
    }
  }
}
