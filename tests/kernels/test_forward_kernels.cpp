// Our forward kernels (kernels/01_fa1_sm75/, kernels/02_fa2_sm80/forward_*) through the
// reference-test library's default grid: the official odd shapes, causal both ways, windows,
// GQA/MQA, varlen, each case with fresh inputs, poisoned outputs, the 2x-naive rule and a
// determinism re-run. Refusals are expected only where the kernel's contract says so.
#include <string>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "kernels/attention_api.hpp"
#include "kernels/common/constants.hpp"
#include "reference/device_attention.hpp"

using namespace flashlab;
using reference::CaseResult;

namespace {

// Every case passes, except the refusals the predicate expects (whose message must name the input).
template <class ExpectRefusal>
void require_grid(const reference::GridResult& result, ExpectRefusal expect_refusal, const std::string& named_input) {
  INFO(result.summary());
  for (const CaseResult& c : result.cases) {
    INFO(c.report);
    if (expect_refusal(c.problem)) {
      CHECK(c.status == CaseResult::Status::refused);
      CHECK(c.report.find(named_input) != std::string::npos);
    } else {
      CHECK(c.status == CaseResult::Status::passed);
    }
  }
  CHECK(result.passed > 0);
}

}  // namespace

TEST_CASE("FA2 forward kernel passes the default grid, bf16 and fp16", "[fa2_forward]") {
  const DType dtype = GENERATE(DType::bf16, DType::fp16);
  const auto grid = reference::default_forward_grid(dtype);
  const auto result = reference::check_forward_grid(reference::on_device(kernels::fa2_forward), grid);
  require_grid(result, [](const Problem& p) { return p.head_dim % 8 != 0; }, "head_dim");
}

TEST_CASE("FA2 forward kernel: the other padded head dims 32, 160, 192, 224, 248", "[fa2_forward]") {
  const auto grid = reference::default_forward_grid(DType::bf16, {32, 160, 192, 224, 248});
  std::vector<Problem> some(grid.begin(), grid.begin() + 15);  // five odd shapes x three masks
  const auto result = reference::check_forward_grid(reference::on_device(kernels::fa2_forward), some);
  require_grid(result, [](const Problem&) { return false; }, "");
}

TEST_CASE("FA2 forward kernel: the A100 tiling of head dims 224 and 256, and a limit no tiling fits", "[fa2_forward]") {
  // Within an A100's 163 KB per block, head dims above 192 take 4 warps on 32-key blocks instead of
  // 8 warps on 64-key blocks; on a Hopper this runs that tiling as an A100 would.
  const DType dtype = GENERATE(DType::bf16, DType::fp16);
  std::vector<Problem> some;
  for (int head_dim : {216, 256}) {
    const auto grid = reference::default_forward_grid(dtype, {head_dim});
    some.insert(some.end(), grid.begin(), grid.begin() + 15);  // five odd shapes x three masks
  }
  const auto within_ampere = [](const Problem& problem, const kernels::ForwardArgs& args) {
    kernels::fa2_forward_within(problem, args, kernels::kAmpereSharedBytes);
  };
  require_grid(reference::check_forward_grid(reference::on_device(within_ampere), some),
               [](const Problem&) { return false; }, "");
  // 64 KB holds no tiling of d = 256: refused, naming the head dim.
  const auto within_64kb = [](const Problem& problem, const kernels::ForwardArgs& args) {
    kernels::fa2_forward_within(problem, args, 64 * 1024);
  };
  some.resize(3);
  const auto refused = reference::check_forward_grid(reference::on_device(within_64kb), some);
  INFO(refused.summary());
  for (const CaseResult& c : refused.cases) {
    INFO(c.report);
    CHECK(c.status == CaseResult::Status::refused);
    CHECK(c.report.find("head_dim = 216") != std::string::npos);
  }
  CHECK(refused.cases.size() == 3);
}

TEST_CASE("FA2 forward kernel: scores that grow along the keys keep moving the running max", "[fa2_forward]") {
  // Later key blocks raise each row's max by several units, so every rescale path of the online
  // softmax (and the kernel's skipped rescales) shows in O.
  const DType dtype = GENERATE(DType::bf16, DType::fp16);
  const auto grid = reference::default_forward_grid(dtype, {64, 128, 256});
  std::vector<Problem> some(grid.begin(), grid.begin() + 15);  // five odd shapes x three masks,
  some.insert(some.end(), grid.begin() + 18, grid.begin() + 21);  // and 1023 x 1024
  reference::ForwardCheckOptions options;
  options.key_growth = 8.0;
  const auto result = reference::check_forward_grid(reference::on_device(kernels::fa2_forward), some, options);
  require_grid(result, [](const Problem&) { return false; }, "");
}

TEST_CASE("FA1 forward kernel passes the default grid, fp16, head dims up to 128", "[fa1_forward]") {
  const auto grid = reference::default_forward_grid(DType::fp16, {40, 59, 64, 96, 111, 128});
  const auto result = reference::check_forward_grid(reference::on_device(kernels::fa1_forward), grid);
  require_grid(result, [](const Problem&) { return false; }, "");
}

TEST_CASE("FA1 forward kernel refuses bf16 and head dims over 128", "[fa1_forward]") {
  auto grid = reference::default_forward_grid(DType::bf16, {64});
  grid.resize(2);
  auto wide = reference::default_forward_grid(DType::fp16, {160});
  grid.push_back(wide.front());
  const auto result = reference::check_forward_grid(reference::on_device(kernels::fa1_forward), grid);
  INFO(result.summary());
  CHECK(result.refused == 3);
  CHECK(result.cases[0].report.find("dtype bf16") != std::string::npos);
  CHECK(result.cases[2].report.find("head_dim = 160") != std::string::npos);
}

// A small grid for compute-sanitizer (memcheck, racecheck) runs: odd shapes, both masks, varlen.
TEST_CASE("forward kernels on a small grid (for the sanitizers)", "[sanitizer_grid]") {
  // FA2 at d 64 and 128 (4 warps x 32 rows) and 256 (8 warps x 16 rows); FA1 up to d 128.
  std::vector<Problem> grid;
  for (const auto& [seqlen_q, seqlen_k] : std::vector<std::pair<int, int>>{{113, 203}, {239, 1}, {128, 217}}) {
    for (const int head_dim : {64, 128, 256}) {
      Problem p;
      p.heads_q = 2, p.heads_kv = 1, p.seqlen_q = seqlen_q, p.seqlen_k = seqlen_k, p.head_dim = head_dim;
      p.mask.causal = head_dim != 64;
      grid.push_back(p);
    }
  }
  for (Problem& p : grid) p.dtype = DType::bf16;
  auto fa2 = reference::check_forward_grid(reference::on_device(kernels::fa2_forward), grid);
  std::erase_if(grid, [](const Problem& p) { return p.head_dim > 128; });
  for (Problem& p : grid) p.dtype = DType::fp16;
  auto fa1 = reference::check_forward_grid(reference::on_device(kernels::fa1_forward), grid);
  INFO(fa2.summary() << "\n" << fa1.summary());
  CHECK(fa2.failed + fa2.refused == 0);
  CHECK(fa1.failed + fa1.refused == 0);
}
