// The FA3-generation forward (kernels/03_fa3_sm90/) through the reference-test library: the
// default grid (official odd shapes, both causal alignments, windows, GQA/MQA, varlen, fully
// masked rows, a bitwise re-run) in bf16 and fp16, the other padded head dims, keys that keep
// raising the max, every step set of the ablation, and problems with more tiles than SMs (so the
// persistent blocks walk several tiles and the rings wrap across them). On a device that is not
// compute capability 9.0 every case must come back refused, naming the compute capability.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "catch.hpp"
#include "kernels/attention_api.hpp"
#include "reference/device_attention.hpp"

using namespace flashlab;
using reference::CaseResult;

namespace {

bool hopper_device() {
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  return major == 9 && minor == 0;
}

// Every case passes, except those the predicate expects refused (the message naming `named_input`);
// off Hopper, every case is refused for the compute capability.
template <class ExpectRefusal>
void require_grid(const reference::GridResult& result, ExpectRefusal expect_refusal, const std::string& named_input) {
  INFO(result.summary());
  const bool hopper = hopper_device();
  for (const CaseResult& c : result.cases) {
    INFO(c.report);
    if (!hopper) {
      CHECK(c.status == CaseResult::Status::refused);
      CHECK(c.report.find("compute capability") != std::string::npos);
    } else if (expect_refusal(c.problem)) {
      CHECK(c.status == CaseResult::Status::refused);
      CHECK(c.report.find(named_input) != std::string::npos);
    } else {
      CHECK(c.status == CaseResult::Status::passed);
    }
  }
  if (hopper) CHECK(result.passed > 0);
}

const auto none_refused = [](const Problem&) { return false; };

// Five odd shapes x three masks, and 1023 x 1024: the cases of the default grid that cover every
// mask at every head dim it cycles through.
std::vector<Problem> some_of(const std::vector<Problem>& grid) {
  std::vector<Problem> some(grid.begin(), grid.begin() + 15);
  some.insert(some.end(), grid.begin() + 18, grid.begin() + 21);
  return some;
}

}  // namespace

TEST_CASE("FA3 forward kernel passes the default grid, bf16 and fp16", "[fa3_forward]") {
  const DType dtype = GENERATE(DType::bf16, DType::fp16);
  const auto grid = reference::default_forward_grid(dtype, {40, 59, 64, 96, 111, 128, 192, 256});
  const auto result = reference::check_forward_grid(reference::on_device(kernels::fa3_forward), grid);
  require_grid(result, [](const Problem& p) { return p.head_dim % 8 != 0; }, "head_dim");
}

TEST_CASE("FA3 forward kernel: the other head dims 8, 32, 72, 160, 200, 248", "[fa3_forward]") {
  const auto grid = reference::default_forward_grid(DType::bf16, {8, 32, 72, 160, 200, 248});
  const auto result = reference::check_forward_grid(reference::on_device(kernels::fa3_forward), some_of(grid));
  require_grid(result, none_refused, "");
}

TEST_CASE("FA3 forward kernel: scores that grow along the keys keep moving the running max", "[fa3_forward]") {
  const DType dtype = GENERATE(DType::bf16, DType::fp16);
  reference::ForwardCheckOptions options;
  options.key_growth = 8.0;
  const auto grid = reference::default_forward_grid(dtype, {64, 128, 256});
  const auto result = reference::check_forward_grid(reference::on_device(kernels::fa3_forward), some_of(grid), options);
  require_grid(result, none_refused, "");
}

TEST_CASE("FA3 forward kernel: more tiles than SMs, so persistent blocks walk several tiles", "[fa3_forward]") {
  // 4 sequences x 10 heads x 5 (or 4) query blocks: 160 tiles of 128 rows, 160 of 192 (d 64).
  std::vector<Problem> grid;
  for (const int head_dim : {64, 128, 256}) {
    for (const bool causal : {false, true}) {
      Problem p;
      p.dtype = DType::bf16, p.batch = 4, p.heads_q = 10, p.heads_kv = 5, p.seqlen_q = 600, p.seqlen_k = 600;
      p.head_dim = head_dim, p.mask.causal = causal;
      grid.push_back(p);
    }
  }
  Problem varlen;
  varlen.dtype = DType::fp16, varlen.heads_q = 12, varlen.heads_kv = 4, varlen.head_dim = 128, varlen.mask.causal = true;
  set_varlen(varlen, {700, 1, 333, 129, 512, 64, 900}, {700, 5, 333, 1000, 512, 64, 17});
  grid.push_back(varlen);
  const auto result = reference::check_forward_grid(reference::on_device(kernels::fa3_forward), grid);
  require_grid(result, none_refused, "");
}

TEST_CASE("FA3 forward kernel: every step set of the ablation passes at head dim 128", "[fa3_forward]") {
  const kernels::Fa3Steps steps = GENERATE(kernels::Fa3Steps{false, false, false}, kernels::Fa3Steps{true, false, false},
                                           kernels::Fa3Steps{true, true, true}, kernels::Fa3Steps{false, true, false});
  INFO("ping_pong " << steps.ping_pong << " overlap " << steps.intra_warpgroup_overlap << " persistent "
                    << steps.persistent);
  auto grid = some_of(reference::default_forward_grid(DType::bf16, {128}));
  Problem many_tiles;  // 4 x 10 x 5 = 200 tiles
  many_tiles.dtype = DType::bf16, many_tiles.batch = 4, many_tiles.heads_q = many_tiles.heads_kv = 10;
  many_tiles.seqlen_q = many_tiles.seqlen_k = 600, many_tiles.head_dim = 128, many_tiles.mask.causal = true;
  grid.push_back(many_tiles);
  const auto with_steps = [steps](const Problem& problem, const kernels::ForwardArgs& args) {
    kernels::fa3_forward_steps(problem, args, steps);
  };
  require_grid(reference::check_forward_grid(reference::on_device(with_steps), grid), none_refused, "");
}

TEST_CASE("FA3 forward kernel refuses by name what it does not do", "[fa3_forward]") {
  auto grid = reference::default_forward_grid(DType::bf16, {64});
  grid.resize(1);
  Problem wide = grid.front();
  wide.head_dim = 264;
  Problem fp32 = grid.front();
  fp32.dtype = DType::fp32;
  const auto partial_steps = [](const Problem& problem, const kernels::ForwardArgs& args) {
    kernels::fa3_forward_steps(problem, args, kernels::Fa3Steps{true, false, true});
  };
  const auto wide_result = reference::check_forward_grid(reference::on_device(kernels::fa3_forward), {wide});
  const auto steps_result = reference::check_forward_grid(reference::on_device(partial_steps), grid);
  INFO(wide_result.summary() << "\n" << steps_result.summary());
  REQUIRE(wide_result.cases.size() == 1);
  CHECK(wide_result.cases[0].status == CaseResult::Status::refused);
  CHECK(wide_result.cases[0].report.find("head_dim = 264") != std::string::npos);
  if (hopper_device()) {
    CHECK(steps_result.cases[0].status == CaseResult::Status::refused);
    CHECK(steps_result.cases[0].report.find("fa3_forward_steps") != std::string::npos);
  }
  CHECK_THROWS_WITH(kernels::fa3_forward(fp32, kernels::ForwardArgs{}), flashlab::testing::contains_text("fp32"));
}

// A small grid for compute-sanitizer (memcheck, synccheck): odd shapes, masks, GQA, varlen, each
// padded head dim.
TEST_CASE("FA3 forward kernel on a small grid (for the sanitizers)", "[sanitizer_grid_sm90]") {
  std::vector<Problem> grid;
  for (const auto& [seqlen_q, seqlen_k] : std::vector<std::pair<int, int>>{{113, 203}, {239, 1}, {128, 217}}) {
    for (const int head_dim : {64, 96, 128, 192, 256}) {
      Problem p;
      p.dtype = DType::bf16, p.heads_q = 2, p.heads_kv = 1, p.seqlen_q = seqlen_q, p.seqlen_k = seqlen_k;
      p.head_dim = head_dim, p.mask.causal = head_dim != 64;
      grid.push_back(p);
    }
  }
  Problem varlen;
  varlen.dtype = DType::bf16, varlen.head_dim = 128;
  set_varlen(varlen, {113, 1, 239}, {203, 3, 1});
  grid.push_back(varlen);
  const auto result = reference::check_forward_grid(reference::on_device(kernels::fa3_forward), grid);
  INFO(result.summary());
  if (hopper_device()) CHECK(result.failed + result.refused == 0);
}
