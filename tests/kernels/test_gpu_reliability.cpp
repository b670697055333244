// The kernels where the flash layout and unit-variance inputs do not reach, through the
// reference-test library (fresh inputs per case, poisoned outputs, the 2x-naive rule for outputs
// and 3x for gradients):
//   - every forward kernel and the FA2 backward on the other layouts the host API promises: Q, K,
//     V as views into one packed QKV buffer (dQ, dK, dV into one dQKV buffer), head-major
//     [batch, heads, seqlen, dim], rows padded with poison (a kernel reading the padding computes
//     NaN; one writing the padding around an output fails the case), one layout per tensor;
//   - the layouts a kernel's contract refuses, refused naming the tensor;
//   - the atomic dQ accumulation of the FA2 backward, many repeats of one problem, each within the
//     rule, with the spread between repeats reported;
//   - scores in the thousands to tens of thousands (Q and K scaled up), finite and within the rule;
//   - random varlen batches (fixed seeds, printed).
// A kernel the device cannot run must refuse every case naming the compute capability.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"
#include "kernels/attention_api.hpp"
#include "reference/backward_check.hpp"
#include "reference/device_attention.hpp"
#include "reference/device_layouts.hpp"

using namespace flashlab;
using reference::CaseResult;
using reference::LayoutRule;
using reference::Operand;
using reference::TensorLayoutKind;

namespace {

int device_compute_capability() {
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  return major * 10 + minor;
}

// A forward kernel and what its contract takes.
struct ForwardKernel {
  const char* name;
  reference::DeviceForwardKernel run;
  int compute_capability;  // major * 10 + minor: the lowest it runs on, or the only one (exact)
  bool exact;
  std::vector<DType> dtypes;
  std::vector<int> head_dims;  // cycled through the cases; odd ones where the kernel takes them
  bool aligned_views;          // 16-byte aligned views and strides in multiples of 8 elements only
  bool runs_here() const {
    const int cc = device_compute_capability();
    return exact ? cc == compute_capability : cc >= compute_capability;
  }
};

const std::vector<ForwardKernel>& forward_kernels() {
  static const std::vector<ForwardKernel> kernels_list = {
      {"fa1_forward", kernels::fa1_forward, 75, false, {DType::fp16}, {59, 64, 111, 128}, false},
      {"fa2_forward",
       kernels::fa2_forward,
       80,
       false,
       {DType::bf16, DType::fp16},
       {40, 64, 128, 256},
       true},
      {"fa3_forward",
       kernels::fa3_forward,
       90,
       true,
       {DType::bf16, DType::fp16},
       {64, 96, 128, 256},
       true}};
  return kernels_list;
}

bool backward_runs_here() { return device_compute_capability() >= 80; }

reference::DeviceBackwardKernel fa2_backward_kernel(bool deterministic) {
  return [deterministic](const Problem& problem, const kernels::BackwardArgs& given) {
    kernels::BackwardArgs args = given;
    args.deterministic = deterministic;
    kernels::fa2_backward(problem, args);
  };
}

Problem make_problem(DType dtype, int batch, int heads_q, int heads_kv, int seqlen_q, int seqlen_k,
                     int head_dim,
                     int causal) {  // causal: 0 none, 1 bottom-right, 2 top-left
  Problem p;
  p.dtype = dtype, p.batch = batch, p.heads_q = heads_q, p.heads_kv = heads_kv;
  p.seqlen_q = seqlen_q, p.seqlen_k = seqlen_k, p.head_dim = head_dim;
  p.mask.causal = causal != 0;
  p.mask.alignment = causal == 2 ? CausalAlignment::top_left : CausalAlignment::bottom_right;
  return p;
}

// Odd shapes, every causal kind, MHA, GQA and MQA, a varlen batch; head dims cycled.
std::vector<Problem> layout_problems(DType dtype, const std::vector<int>& head_dims) {
  std::vector<Problem> problems = {
      make_problem(dtype, 2, 2, 2, 113, 203, 0, 0), make_problem(dtype, 1, 4, 2, 128, 217, 0, 1),
      make_problem(dtype, 2, 3, 1, 239, 1, 0, 2), make_problem(dtype, 3, 2, 1, 1, 1, 0, 0)};
  Problem varlen = make_problem(dtype, 1, 4, 2, 1, 1, 0, 1);
  set_varlen(varlen, {113, 1, 239}, {203, 3, 1});
  problems.push_back(varlen);
  for (std::size_t i = 0; i < problems.size(); ++i)
    problems[i].head_dim = head_dims[i % head_dims.size()];
  return problems;
}

// The same rows for queries and keys, as a packed QKV buffer has.
std::vector<Problem> packed_problems(DType dtype, const std::vector<int>& head_dims) {
  std::vector<Problem> problems = {
      make_problem(dtype, 2, 2, 2, 239, 239, 0, 0), make_problem(dtype, 1, 4, 2, 128, 128, 0, 1),
      make_problem(dtype, 3, 3, 1, 1, 1, 0, 0), make_problem(dtype, 2, 2, 2, 97, 97, 0, 2)};
  Problem varlen = make_problem(dtype, 1, 2, 2, 1, 1, 0, 1);
  set_varlen(varlen, {113, 1, 300}, {113, 1, 300});
  problems.push_back(varlen);
  for (std::size_t i = 0; i < problems.size(); ++i)
    problems[i].head_dim = head_dims[i % head_dims.size()];
  return problems;
}

// One layout per tensor (q, k, v, o, lse, d_o, dq, dk, dv): every kind the kernels take at once.
LayoutRule mixed_layout() {
  using K = TensorLayoutKind;
  return reference::per_operand_layout(
      "mixed (q head-major, k padded, v flash, o padded, lse head-major, d_o "
      "head-major, dq padded, dk head-major, dv padded)",
      {K::head_major, K::padded, K::flash, K::padded, K::head_major, K::head_major, K::padded,
       K::head_major, K::padded});
}

struct NamedLayout {
  LayoutRule rule;
  std::string name;
};

std::vector<NamedLayout> strided_layouts() {
  return {{reference::uniform_layout(TensorLayoutKind::head_major), "head-major"},
          {reference::uniform_layout(TensorLayoutKind::padded), "padded"},
          {reference::with_operand_layout(reference::uniform_layout(TensorLayoutKind::padded),
                                          Operand::lse, TensorLayoutKind::padded_odd),
           "padded, lse padded-odd"},
          {mixed_layout(), "mixed"}};
}

// Every case passed, or (on a device the kernel does not run on) was refused for the compute
// capability.
void require_passed(const reference::GridResult& result, bool runs_here) {
  INFO(result.summary());
  for (const CaseResult& c : result.cases) {
    INFO(c.report);
    if (runs_here) {
      CHECK(c.status == CaseResult::Status::passed);
    } else {
      CHECK(c.status == CaseResult::Status::refused);
      CHECK(c.report.find("compute capability") != std::string::npos);
    }
  }
}

// Every case refused, the message naming `named_input`.
void require_refused(const reference::GridResult& result, const std::string& named_input) {
  INFO(result.summary());
  for (const CaseResult& c : result.cases) {
    INFO(c.report << "\nexpected a refusal naming: " << named_input);
    CHECK(c.status == CaseResult::Status::refused);
    CHECK(c.report.find(named_input) != std::string::npos);
  }
}

void require_backward(const reference::BackwardCaseResult& result, bool runs_here) {
  INFO(result.report);
  if (runs_here) {
    CHECK(result.status == CaseResult::Status::passed);
  } else {
    CHECK(result.status == CaseResult::Status::refused);
    CHECK(result.report.find("compute capability") != std::string::npos);
  }
}

// Random varlen lengths: batch 3-9, lengths 1-300 on each side drawn apart (one of each side set
// to 1), so lengths are mostly no multiple of any block size and the two sides differ.
struct VarlenDraw {
  std::uint32_t seed;
  std::vector<int> seqlens_q, seqlens_k;
  int causal;  // 0 none, 1 bottom-right, 2 top-left
  std::string describe() const {
    std::ostringstream text;
    text << "varlen draw seed " << seed << ": q lengths {";
    for (int length : seqlens_q) text << length << ",";
    text << "}, k lengths {";
    for (int length : seqlens_k) text << length << ",";
    text << "}, causal " << causal;
    return text.str();
  }
};

VarlenDraw draw_varlen(std::uint32_t seed) {
  std::mt19937 rng(seed);
  VarlenDraw draw;
  draw.seed = seed;
  const int batch = std::uniform_int_distribution<int>(3, 9)(rng);
  std::uniform_int_distribution<int> length(1, 300);
  for (int b = 0; b < batch; ++b) {
    draw.seqlens_q.push_back(length(rng));
    draw.seqlens_k.push_back(length(rng));
  }
  std::uniform_int_distribution<int> position(0, batch - 1);
  draw.seqlens_q[position(rng)] = 1;
  draw.seqlens_k[position(rng)] = 1;
  draw.causal = static_cast<int>(seed % 3);
  return draw;
}

constexpr std::uint32_t kVarlenSeeds[] = {11, 23, 37, 41, 59};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Layouts.

TEST_CASE("forward kernels on packed QKV, head-major, padded and per-tensor layouts",
          "[gpu_reliability]") {
  for (const ForwardKernel& kernel : forward_kernels()) {
    for (const DType dtype : kernel.dtypes) {
      INFO(kernel.name << ", " << to_string(dtype));
      std::vector<NamedLayout> layouts = strided_layouts();
      // FA1 takes any stride and 2-byte aligned views: gaps of 3, 5 and 7 elements, offset 1, for
      // every tensor, or for O alone (its inputs then take the 16-byte loads).
      if (!kernel.aligned_views) {
        layouts.push_back({reference::uniform_layout(TensorLayoutKind::padded_odd), "padded-odd"});
        layouts.push_back(
            {reference::with_operand_layout(reference::uniform_layout(TensorLayoutKind::flash),
                                            Operand::o, TensorLayoutKind::padded_odd),
             "flash, o padded-odd"});
      }
      for (const NamedLayout& layout : layouts) {
        INFO("layout " << layout.name);
        require_passed(reference::check_forward_grid(reference::on_device(kernel.run, layout.rule),
                                                     layout_problems(dtype, kernel.head_dims)),
                       kernel.runs_here());
      }
      INFO("layout packed qkv");
      require_passed(reference::check_forward_grid(
                         reference::on_device(kernel.run, reference::packed_qkv_layout()),
                         packed_problems(dtype, kernel.head_dims)),
                     kernel.runs_here());
    }
  }
}

TEST_CASE("forward kernels refuse by name the layouts their contract excludes",
          "[gpu_reliability]") {
  // DeviceTensor has no column stride (the last dimension is contiguous by type), so a non-unit
  // last-dim stride cannot be asked for. What can be asked for and must be refused: output heads
  // closer together than a head's columns (o.head_stride = d / 2, lse.head_stride = 0: elements
  // that share memory) and, for the kernels that load 16 bytes at a time (FA2 by cp.async, FA3
  // by TMA), views that are not 16-byte aligned or strides that are no multiple of 8 elements.
  std::vector<Problem> problems = {make_problem(DType::fp16, 2, 2, 2, 113, 203, 64, 0)};
  Problem varlen = make_problem(DType::fp16, 1, 4, 2, 1, 1, 64, 1);
  set_varlen(varlen, {113, 1, 239}, {203, 3, 1});
  problems.push_back(varlen);
  const auto flash = reference::uniform_layout(TensorLayoutKind::flash);
  for (const ForwardKernel& kernel : forward_kernels()) {
    INFO(kernel.name);
    const std::string prefix = std::string(kernel.name) + ": ";
    require_refused(reference::check_forward_grid(
                        reference::on_device(kernel.run, reference::with_operand_layout(
                                                             flash, Operand::o,
                                                             TensorLayoutKind::heads_overlapping)),
                        problems),
                    prefix + "o.head_stride = 32 makes elements of the output share memory");
    require_refused(reference::check_forward_grid(
                        reference::on_device(kernel.run, reference::with_operand_layout(
                                                             flash, Operand::lse,
                                                             TensorLayoutKind::heads_overlapping)),
                        problems),
                    prefix + "lse.head_stride = 0");
    if (!kernel.aligned_views) continue;
    for (const Operand operand : {Operand::q, Operand::k, Operand::v, Operand::o}) {
      const auto odd = reference::with_operand_layout(flash, operand, TensorLayoutKind::padded_odd);
      require_refused(
          reference::check_forward_grid(reference::on_device(kernel.run, odd), problems),
          prefix + to_string(operand) + " is not 16-byte aligned");
    }
  }
}

TEST_CASE("FA2 backward on packed QKV/dQKV, head-major, padded and per-tensor layouts",
          "[gpu_reliability]") {
  const bool runs_here = backward_runs_here();
  const DType dtype = GENERATE(DType::bf16, DType::fp16);
  for (const bool deterministic : {false, true}) {
    for (const NamedLayout& layout : strided_layouts()) {
      for (const Problem& problem : layout_problems(dtype, {64, 128, 96, 256, 40})) {
        INFO("layout " << layout.name << (deterministic ? ", deterministic" : ", atomic dQ"));
        require_backward(
            reference::check_backward_case(
                reference::on_device_backward(fa2_backward_kernel(deterministic), layout.rule),
                problem),
            runs_here);
      }
    }
    // dQ, dK, dV as views into one dQKV buffer: the API takes it when they have the same extents
    // (MHA).
    for (Problem problem : packed_problems(dtype, {64, 128})) {
      problem.heads_kv = problem.heads_q;
      INFO("layout packed qkv" << (deterministic ? ", deterministic" : ", atomic dQ"));
      require_backward(reference::check_backward_case(
                           reference::on_device_backward(fa2_backward_kernel(deterministic),
                                                         reference::packed_qkv_layout()),
                           problem),
                       runs_here);
    }
  }
}

TEST_CASE("FA2 backward refuses by name the layouts its contract excludes", "[gpu_reliability]") {
  const Problem problem = make_problem(DType::bf16, 2, 2, 2, 113, 203, 64, 0);
  const auto flash = reference::uniform_layout(TensorLayoutKind::flash);
  const auto refusal = [&](const LayoutRule& layout, const Problem& p) {
    return reference::check_backward_case(
        reference::on_device_backward(fa2_backward_kernel(false), layout), p);
  };
  const auto require_refusal = [](const reference::BackwardCaseResult& result,
                                  const std::string& named_input) {
    INFO(result.report << "\nexpected a refusal naming: " << named_input);
    CHECK(result.status == CaseResult::Status::refused);
    CHECK(result.report.find(named_input) != std::string::npos);
  };
  for (const Operand operand : {Operand::q, Operand::k, Operand::v, Operand::o, Operand::d_o,
                                Operand::dq, Operand::dk, Operand::dv}) {
    require_refusal(
        refusal(reference::with_operand_layout(flash, operand, TensorLayoutKind::padded_odd),
                problem),
        std::string("fa2_backward: ") + to_string(operand) + " is not 16-byte aligned");
  }
  require_refusal(refusal(reference::with_operand_layout(flash, Operand::dq,
                                                         TensorLayoutKind::heads_overlapping),
                          problem),
                  "fa2_backward: dq.head_stride = 32 makes elements of the output share memory");
  // Packed dQKV with GQA: dQ and dK have different head extents in one buffer, which the API's
  // aliasing rule does not prove apart, so it refuses them.
  Problem grouped = make_problem(DType::bf16, 2, 4, 2, 97, 97, 64, 1);
  require_refusal(refusal(reference::packed_qkv_layout(), grouped),
                  "fa2_backward: dq shares memory with dk");
}

// ---------------------------------------------------------------------------------------------
// The atomic backward under repeats.

TEST_CASE("FA2 backward: atomic dQ accumulation over many repeats stays within the rule",
          "[gpu_reliability]") {
  // Every key block adds into each dQ row it sees (513 or 640 keys: 5 to 10 key blocks), over 64
  // (batch x heads) heads, GQA in the first problem; the order of the fp32 atomics differs from run
  // to run and the result may too, but every run must stay within the rule. The reference is
  // computed once per problem (about 12 s of CPU), each repeat costs a fraction of a second.
  constexpr int kRepeats = 30;
  const bool runs_here = backward_runs_here();
  const Problem grouped = make_problem(DType::bf16, 8, 8, 2, 256, 513, 64, 0);
  const Problem causal = make_problem(DType::fp16, 4, 16, 16, 200, 640, 64, 1);
  for (const Problem& problem : {grouped, causal}) {
    const auto reference_case = reference::backward_reference(problem, reference::fresh_seed());
    INFO(reference::describe(problem) << ", seed " << reference_case.seed);
    const auto implementation = reference::on_device_backward(fa2_backward_kernel(false));
    AttentionTensors first;
    std::array<double, 3> lowest{INFINITY, INFINITY, INFINITY}, highest{0, 0, 0}, spread{0, 0, 0};
    std::array<long long, 3> differing_elements{0, 0, 0};
    int differing_repeats = 0;
    for (int repeat = 0; repeat < kRepeats; ++repeat) {
      AttentionTensors gradients;
      const auto result =
          reference::run_backward_case(implementation, reference_case, {}, &gradients);
      INFO("repeat " << repeat << ": " << result.report);
      if (!runs_here) {
        CHECK(result.status == CaseResult::Status::refused);
        break;
      }
      REQUIRE(result.status == CaseResult::Status::passed);
      for (int g = 0; g < 3; ++g) {
        lowest[g] = std::min(lowest[g], result.errors[g].max_error);
        highest[g] = std::max(highest[g], result.errors[g].max_error);
      }
      if (repeat == 0) {
        first = std::move(gradients);
        continue;
      }
      bool differs = false;
      const HostTensor* now[3] = {&gradients.dQ, &gradients.dK, &gradients.dV};
      const HostTensor* then[3] = {&first.dQ, &first.dK, &first.dV};
      for (int g = 0; g < 3; ++g) {
        for (std::size_t i = 0; i < now[g]->values.size(); ++i) {
          const double difference = std::fabs(now[g]->values[i] - then[g]->values[i]);
          if (difference == 0) continue;
          differs = true;
          ++differing_elements[g];
          spread[g] = std::max(spread[g], difference);
        }
      }
      differing_repeats += differs ? 1 : 0;
    }
    if (!runs_here) continue;
    std::ostringstream summary;
    summary << reference::describe(problem) << ", " << kRepeats << " repeats: " << differing_repeats
            << " differ from the first";
    const char* names[3] = {"dQ", "dK", "dV"};
    for (int g = 0; g < 3; ++g) {
      summary << "; " << names[g] << " max error " << lowest[g] << " to " << highest[g]
              << " (naive " << reference_case.naive_errors[g]
              << "), largest change between repeats " << spread[g] << " in "
              << differing_elements[g] << " elements";
    }
    WARN(summary.str());
  }
}

// ---------------------------------------------------------------------------------------------
// Large scores.

TEST_CASE("forward kernels: scores in the tens of thousands stay finite and within the rule",
          "[gpu_reliability]") {
  // Q and K scaled by 100 (bf16) or 50 (fp16: its naive S must stay below 65504): scores have a
  // standard deviation of 10^4 (2.5 x 10^3), so exp overflows unless the max is subtracted first
  // and the online softmax's rescale is right. The naive errors must be finite, or the rule
  // would let anything through.
  for (const ForwardKernel& kernel : forward_kernels()) {
    for (const DType dtype : kernel.dtypes) {
      INFO(kernel.name << ", " << to_string(dtype));
      std::vector<Problem> problems = {make_problem(dtype, 2, 2, 2, 113, 203, 0, 0),
                                       make_problem(dtype, 1, 2, 1, 256, 512, 0, 1),
                                       make_problem(dtype, 1, 3, 1, 512, 256, 0, 2),
                                       make_problem(dtype, 1, 2, 2, 1023, 1024, 0, 1),
                                       make_problem(dtype, 2, 2, 2, 799, 3, 0, 0),
                                       make_problem(dtype, 3, 1, 1, 1, 1, 0, 0)};
      Problem varlen = make_problem(dtype, 1, 4, 2, 1, 1, 0, 1);
      set_varlen(varlen, {113, 1, 239, 64}, {203, 3, 1, 64});
      problems.push_back(varlen);
      for (std::size_t i = 0; i < problems.size(); ++i)
        problems[i].head_dim = kernel.head_dims[i % kernel.head_dims.size()];
      reference::ForwardCheckOptions options;
      options.input_scale = dtype == DType::bf16 ? 100 : 50;
      const auto result =
          reference::check_forward_grid(reference::on_device(kernel.run), problems, options);
      require_passed(result, kernel.runs_here());
      for (const CaseResult& c : result.cases) {
        if (c.status == CaseResult::Status::refused) continue;
        INFO(c.report);
        CHECK(std::isfinite(c.o_naive_error));
        CHECK(std::isfinite(c.lse_naive_error));
      }
    }
  }
}

TEST_CASE("FA2 backward: scores in the thousands stay finite and within the rule",
          "[gpu_reliability]") {
  // bf16: Q and K scaled by 100; fp16 by 30 at d 64 (the naive backward rounds Q K^T to fp16
  // before scaling, so its raw dot products must stay below 65504).
  const bool runs_here = backward_runs_here();
  struct Case {
    Problem problem;
    double scale;
  };
  std::vector<Case> cases;
  for (const int causal : {0, 1, 2}) {
    cases.push_back({make_problem(DType::bf16, 2, 4, 2, 113, 203, 64, causal), 100});
    cases.push_back({make_problem(DType::bf16, 1, 2, 1, 300, 257, 128, causal), 100});
    cases.push_back({make_problem(DType::fp16, 2, 2, 2, 177, 129, 64, causal), 30});
  }
  Problem varlen = make_problem(DType::bf16, 1, 2, 2, 1, 1, 64, 1);
  set_varlen(varlen, {130, 1, 257}, {70, 200, 257});
  cases.push_back({varlen, 100});
  for (const Case& c : cases) {
    for (const bool deterministic : {false, true}) {
      reference::BackwardCheckOptions options;
      options.input_scale = c.scale;
      const auto result = reference::check_backward_case(
          reference::on_device_backward(fa2_backward_kernel(deterministic)), c.problem, options);
      INFO((deterministic ? "deterministic" : "atomic dQ"));
      require_backward(result, runs_here);
      INFO(result.report);
      for (const double naive_error : result.naive_errors) CHECK(std::isfinite(naive_error));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Random varlen batches.

TEST_CASE("forward kernels on random varlen batches", "[gpu_reliability]") {
  for (const ForwardKernel& kernel : forward_kernels()) {
    for (const DType dtype : kernel.dtypes) {
      int next = 0;
      for (const std::uint32_t seed : kVarlenSeeds) {
        const VarlenDraw draw = draw_varlen(seed);
        INFO(kernel.name << ", " << to_string(dtype) << ", " << draw.describe());
        const int heads[3][2] = {{2, 2}, {4, 2}, {3, 1}};
        Problem problem =
            make_problem(dtype, 1, heads[next % 3][0], heads[next % 3][1], 1, 1,
                         kernel.head_dims[next % kernel.head_dims.size()], draw.causal);
        ++next;
        set_varlen(problem, draw.seqlens_q, draw.seqlens_k);
        require_passed(reference::check_forward_grid(reference::on_device(kernel.run), {problem}),
                       kernel.runs_here());
      }
    }
  }
}

TEST_CASE("FA2 backward on random varlen batches", "[gpu_reliability]") {
  const bool runs_here = backward_runs_here();
  int next = 0;
  for (const std::uint32_t seed : kVarlenSeeds) {
    const VarlenDraw draw = draw_varlen(seed);
    const int head_dims[] = {64, 128, 96, 40, 256};
    const DType dtype = next % 2 == 0 ? DType::bf16 : DType::fp16;
    Problem problem =
        make_problem(dtype, 1, next % 2 == 0 ? 4 : 2, 2, 1, 1, head_dims[next % 5], draw.causal);
    set_varlen(problem, draw.seqlens_q, draw.seqlens_k);
    for (const bool deterministic : {false, true}) {
      INFO(draw.describe() << (deterministic ? ", deterministic" : ", atomic dQ"));
      require_backward(
          reference::check_backward_case(
              reference::on_device_backward(fa2_backward_kernel(deterministic)), problem),
          runs_here);
    }
    ++next;
  }
}
