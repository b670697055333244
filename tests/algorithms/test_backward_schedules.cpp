// The backward schedules (05 standard, 06 FA1, 07 FA2) against the oracle's analytic gradients,
// on fresh random inputs, with O and LSE from the FA2 forward; fully masked rows, determinism,
// shape-only counting and bad input.
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "backward_check.hpp"
#include "catch.hpp"

using namespace flashlab;
using backward_test::Blocks;
using backward_test::Schedule;

namespace {

// fp32: the schedules accumulate in fp32 where the oracle uses double; the error is measured
// relative to the largest gradient (about 1e-6 of it in practice).
constexpr double kFp32RelativeTolerance = 1e-5;

void check_against_oracle(Schedule schedule, const Problem& problem, Blocks blocks) {
  const auto seed = reference::fresh_seed();
  AttentionTensors tensors = backward_test::forward_inputs(problem, seed);
  backward_test::run(schedule, problem, &tensors, blocks);
  const OracleResult oracle = oracle_attention(problem, tensors, &tensors.dO);
  const auto errors = backward_test::compare_gradients(tensors, oracle);
  const double tolerance = kFp32RelativeTolerance * std::max(1.0, backward_test::largest_gradient(oracle));
  INFO(backward_test::to_string(schedule) << "\n" << reference::describe(problem) << ", blocks " << blocks.rows << "x"
                                          << blocks.cols << ", seed " << seed << "\n" << errors.describe()
                                          << "\ntolerance " << tolerance);
  CHECK_FALSE(errors.any_nan());
  CHECK(errors.max_error() <= tolerance);
}

Problem base_problem(int seqlen_q, int seqlen_k, int head_dim) {
  Problem problem;
  problem.batch = 2;
  problem.heads_q = 2;
  problem.heads_kv = 1;
  problem.seqlen_q = seqlen_q;
  problem.seqlen_k = seqlen_k;
  problem.head_dim = head_dim;
  return problem;
}

// A block mask over 16 x 16 blocks with a fixed pattern: every third block dropped, and the
// whole second row of blocks dropped (its queries see nothing).
BlockSparsity sparsity_for(int seqlen_q, int seqlen_k) {
  BlockSparsity sparsity;
  sparsity.block_rows = 16;
  sparsity.block_cols = 16;
  sparsity.row_blocks = (seqlen_q + 15) / 16;
  sparsity.col_blocks = (seqlen_k + 15) / 16;
  sparsity.keep.resize(static_cast<std::size_t>(sparsity.row_blocks) * sparsity.col_blocks);
  for (int r = 0; r < sparsity.row_blocks; ++r)
    for (int c = 0; c < sparsity.col_blocks; ++c)
      sparsity.keep[static_cast<std::size_t>(r) * sparsity.col_blocks + c] = (r != 1 && (r + 2 * c) % 3 != 0) ? 1 : 0;
  return sparsity;
}

// The message of the exception fn throws ("" if none).
template <class Function>
std::string thrown_message(Function&& fn) {
  try {
    fn();
  } catch (const std::exception& error) {
    return error.what();
  }
  return "";
}

bool bitwise_equal(const HostTensor& a, const HostTensor& b) {
  return a.values.size() == b.values.size() &&
         std::memcmp(a.values.data(), b.values.data(), a.values.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("Backward schedules match the oracle's gradients on the odd shapes", "[backward]") {
  const auto [seqlen_q, seqlen_k] =
      GENERATE(table<int, int>({{113, 203}, {128, 217}, {1, 1}, {239, 1}, {799, 3}, {108, 256}, {256, 512}, {512, 256}}));
  const int mask_kind = GENERATE(0, 1, 2);  // none, causal bottom-right, causal top-left
  const Schedule schedule = GENERATE(Schedule::standard, Schedule::fa1, Schedule::fa2);
  Problem problem = base_problem(seqlen_q, seqlen_k, 59);
  problem.mask.causal = mask_kind != 0;
  problem.mask.alignment = mask_kind == 2 ? CausalAlignment::top_left : CausalAlignment::bottom_right;
  check_against_oracle(schedule, problem, {48, 40});
}

TEST_CASE("Backward schedules: head dims and block sizes that do not divide", "[backward]") {
  const int head_dim = GENERATE(40, 59, 96, 111, 128);
  const auto [block_rows, block_cols] = GENERATE(table<int, int>({{17, 29}, {64, 128}, {128, 32}}));
  const Schedule schedule = GENERATE(Schedule::standard, Schedule::fa1, Schedule::fa2);
  Problem problem = base_problem(113, 203, head_dim);
  problem.batch = 1;
  problem.heads_q = 4;
  problem.heads_kv = 2;  // GQA
  problem.mask.causal = true;
  check_against_oracle(schedule, problem, {block_rows, block_cols});
}

TEST_CASE("Backward schedules: masks, score modifications, dropout, GQA/MQA, varlen", "[backward]") {
  const Schedule schedule = GENERATE(Schedule::standard, Schedule::fa1, Schedule::fa2);
  const std::string feature =
      GENERATE("window", "window causal", "alibi", "softcap", "dropout", "mqa", "varlen", "head_dim_v",
               "block sparse", "everything");
  Problem problem = base_problem(97, 131, 40);
  problem.heads_q = 4;
  problem.heads_kv = 2;
  if (feature == "window") problem.mask.window_left = 23, problem.mask.window_right = 11;
  if (feature == "window causal") problem.mask.causal = true, problem.mask.window_left = 30;
  if (feature == "alibi") problem.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  if (feature == "softcap") problem.softcap = 1.5f;  // small enough that tanh saturates
  if (feature == "dropout") problem.dropout = {0.17f, reference::fresh_seed(), 12345};
  if (feature == "mqa") problem.heads_kv = 1;
  if (feature == "varlen") set_varlen(problem, {1, 97, 64, 30}, {131, 3, 64, 1});
  if (feature == "head_dim_v") problem.head_dim_v = 72;
  if (feature == "block sparse") problem.block_sparsity = sparsity_for(problem.seqlen_q, problem.seqlen_k);
  if (feature == "everything") {
    set_varlen(problem, {77, 33, 1}, {50, 129, 7});
    problem.heads_kv = 1;
    problem.head_dim_v = 24;
    problem.mask.causal = true;
    problem.mask.alignment = CausalAlignment::top_left;
    problem.mask.window_left = 40;
    problem.alibi_slopes = {0.3f, 0.0f, 0.1f, 0.7f};
    problem.softcap = 4.0f;
    problem.dropout = {0.1f, reference::fresh_seed(), 7};
  }
  INFO("feature: " << feature);
  check_against_oracle(schedule, problem, {32, 48});
}

TEST_CASE("Backward schedules on (1023, 1024) and (1024, 1023) problems", "[backward]") {
  const Schedule schedule = GENERATE(Schedule::standard, Schedule::fa1, Schedule::fa2);
  const auto [seqlen_q, seqlen_k] = GENERATE(table<int, int>({{1023, 1024}, {1024, 1023}}));
  Problem problem = base_problem(seqlen_q, seqlen_k, 32);  // one head, small d: the shape, kept cheap
  problem.batch = 1;
  problem.heads_q = 1;
  problem.mask.causal = true;
  check_against_oracle(schedule, problem, {128, 128});
}

TEST_CASE("Backward schedules: fully masked rows and unseen keys give zero gradients, never NaN", "[backward]") {
  const Schedule schedule = GENERATE(Schedule::standard, Schedule::fa1, Schedule::fa2);
  // Bottom-right causal with seqlen_q > seqlen_k: queries 0..29 see no key (their LSE is -inf).
  // Top-left causal with seqlen_k > seqlen_q: keys 20..49 are seen by no query.
  const bool unseen_keys = GENERATE(false, true);
  Problem problem = base_problem(unseen_keys ? 20 : 50, unseen_keys ? 50 : 20, 24);
  problem.mask.causal = true;
  problem.mask.alignment = unseen_keys ? CausalAlignment::top_left : CausalAlignment::bottom_right;
  const auto seed = reference::fresh_seed();
  AttentionTensors tensors = backward_test::forward_inputs(problem, seed);
  backward_test::run(schedule, problem, &tensors, {16, 8});
  INFO(backward_test::to_string(schedule) << ", " << reference::describe(problem) << ", seed " << seed);
  for (float value : tensors.dQ.values) REQUIRE_FALSE(std::isnan(value));
  for (float value : tensors.dK.values) REQUIRE_FALSE(std::isnan(value));
  for (float value : tensors.dV.values) REQUIRE_FALSE(std::isnan(value));
  for (int b = 0; b < problem.batch; ++b) {
    if (!unseen_keys) {
      for (int h = 0; h < problem.heads_q; ++h) {
        CHECK(tensors.LSE.at(b * 50, h, 0) == kNegInf);
        for (int row = 0; row < 30; ++row)
          for (int c = 0; c < problem.head_dim; ++c) CHECK(tensors.dQ.at(b * 50 + row, h, c) == 0.0f);
      }
    } else {
      for (int key = 20; key < 50; ++key) {
        for (int c = 0; c < problem.head_dim; ++c) CHECK(tensors.dK.at(b * 50 + key, 0, c) == 0.0f);
        for (int c = 0; c < problem.value_dim(); ++c) CHECK(tensors.dV.at(b * 50 + key, 0, c) == 0.0f);
      }
    }
  }
  const OracleResult oracle = oracle_attention(problem, tensors, &tensors.dO);
  const auto errors = backward_test::compare_gradients(tensors, oracle);
  INFO(errors.describe());
  CHECK(errors.max_error() <= kFp32RelativeTolerance * std::max(1.0, backward_test::largest_gradient(oracle)));
}

TEST_CASE("Backward schedules are bitwise repeatable", "[backward]") {
  const Schedule schedule = GENERATE(Schedule::standard, Schedule::fa1, Schedule::fa2);
  const DType dtype = GENERATE(DType::fp32, DType::bf16);
  Problem problem = base_problem(77, 93, 40);
  problem.heads_q = 6;
  problem.heads_kv = 2;
  problem.dtype = dtype;
  problem.mask.causal = true;
  problem.softcap = 5.0f;
  problem.dropout = {0.2f, reference::fresh_seed(), 3};
  const auto seed = reference::fresh_seed();
  AttentionTensors first = backward_test::forward_inputs(problem, seed);
  AttentionTensors second = first;
  backward_test::run(schedule, problem, &first, {32, 16});
  backward_test::run(schedule, problem, &second, {32, 16});
  INFO(backward_test::to_string(schedule) << ", " << reference::describe(problem) << ", seed " << seed);
  CHECK(bitwise_equal(first.dQ, second.dQ));
  CHECK(bitwise_equal(first.dK, second.dK));
  CHECK(bitwise_equal(first.dV, second.dV));
}

TEST_CASE("Backward schedules count the same with data, shape-only on tensors, and without tensors", "[backward]") {
  const Schedule schedule = GENERATE(Schedule::standard, Schedule::fa1, Schedule::fa2);
  Problem problem = base_problem(0, 0, 40);
  set_varlen(problem, {113, 1, 64}, {203, 17, 64});
  problem.heads_q = 4;
  problem.heads_kv = 2;
  problem.head_dim_v = 24;
  problem.dtype = GENERATE(DType::fp32, DType::fp16);
  problem.mask.causal = GENERATE(false, true);
  problem.softcap = 3.0f;
  problem.dropout = {0.1f, 1, 2};
  const auto seed = reference::fresh_seed();
  AttentionTensors tensors = backward_test::forward_inputs(problem, seed);
  const Counters data = backward_test::run<DataMemory>(schedule, problem, &tensors, {48, 40});
  const Counters shape = backward_test::run<ShapeMemory>(schedule, problem, &tensors, {48, 40});
  const Counters shape_only = backward_test::run<ShapeMemory>(schedule, problem, nullptr, {48, 40});
  INFO(backward_test::to_string(schedule) << ", " << reference::describe(problem));
  CHECK(data.matmul_flops > 0);
  CHECK(data.hbm_bytes() > 0);
  CHECK(data == shape);
  CHECK(data == shape_only);
}

TEST_CASE("FA2 backward moves K, V once and Q, dO once per key block", "[backward]") {
  // Unmasked, so no block is skipped: with Tc key blocks, K and V are read once, Q, dO, LSE and
  // D once per key block (plus dO and O once for D), dQ read Tc times and written Tc + 1 times
  // (the zero initialisation), dK and dV written once.
  Problem problem = base_problem(100, 70, 16);
  problem.batch = 1;
  problem.heads_q = 1;
  problem.head_dim_v = 8;
  const BlockTiling tiling{32, 32};
  const std::int64_t Tc = 3, Nq = 100, Nk = 70, d = 16, dv = 8;
  const Counters c = run_fa2_backward<ShapeMemory>(problem, nullptr, 0, tiling);
  CHECK(c[TensorId::K].hbm_read_elements == Nk * d);
  CHECK(c[TensorId::V].hbm_read_elements == Nk * dv);
  CHECK(c[TensorId::Q].hbm_read_elements == Tc * Nq * d);
  CHECK(c[TensorId::dO].hbm_read_elements == (Tc + 1) * Nq * dv);
  CHECK(c[TensorId::O].hbm_read_elements == Nq * dv);
  CHECK(c[TensorId::LSE].hbm_read_elements == Tc * Nq);
  CHECK(c[TensorId::D].hbm_read_elements == Tc * Nq);
  CHECK(c[TensorId::D].hbm_write_elements == Nq);
  CHECK(c[TensorId::dQ].hbm_read_elements == Tc * Nq * d);
  CHECK(c[TensorId::dQ].hbm_write_elements == (Tc + 1) * Nq * d);
  CHECK(c[TensorId::dK].hbm_write_elements == Nk * d);
  CHECK(c[TensorId::dV].hbm_write_elements == Nk * dv);
  CHECK(c[TensorId::P].hbm_read_elements + c[TensorId::P].hbm_write_elements == 0);
  CHECK(c.matmul_flops == 2 * Nq * Nk * (3 * d + 2 * dv));  // S, dQ, dK over d; dV, dP over dv
}

TEST_CASE("FA1 backward moves Q, O, dO, dQ, l, m once per key block (Algorithm 4, line 10)", "[backward]") {
  Problem problem = base_problem(100, 70, 16);
  problem.batch = 1;
  problem.heads_q = 1;
  problem.head_dim_v = 8;
  const std::int64_t Tc = 3, Nq = 100, Nk = 70, d = 16, dv = 8;
  const Counters c = run_fa1_backward<ShapeMemory>(problem, nullptr, 0, BlockTiling{32, 32});
  CHECK(c[TensorId::K].hbm_read_elements == Nk * d);  // line 7
  CHECK(c[TensorId::V].hbm_read_elements == Nk * dv);
  CHECK(c[TensorId::Q].hbm_read_elements == Tc * Nq * d);  // line 10
  CHECK(c[TensorId::O].hbm_read_elements == Tc * Nq * dv);
  CHECK(c[TensorId::dO].hbm_read_elements == Tc * Nq * dv);
  CHECK(c[TensorId::l].hbm_read_elements == Tc * Nq);
  CHECK(c[TensorId::m].hbm_read_elements == Tc * Nq);
  CHECK(c[TensorId::dQ].hbm_read_elements == Tc * Nq * d);
  CHECK(c[TensorId::dQ].hbm_write_elements == (Tc + 1) * Nq * d);  // line 5 and line 21
  CHECK(c[TensorId::dK].hbm_write_elements == 2 * Nk * d);         // line 5 and line 24
  CHECK(c[TensorId::dV].hbm_write_elements == 2 * Nk * dv);
  CHECK(c[TensorId::LSE].hbm_read_elements == 0);  // l and m instead; derived from LSE apart
  CHECK(c.matmul_flops == 2 * Nq * Nk * (3 * d + 2 * dv));
}

TEST_CASE("Standard backward moves P, dP and dS through HBM (Algorithm 3)", "[backward]") {
  Problem problem = base_problem(100, 70, 16);
  problem.batch = 1;
  problem.heads_q = 1;
  problem.head_dim_v = 8;
  const std::int64_t Tr = 4, Tc = 3, Nq = 100, Nk = 70, d = 16, dv = 8;
  const Counters c = run_standard_backward<ShapeMemory>(problem, nullptr, 0, BlockTiling{32, 32});
  // Line 3 by blocks (Bc = 32 < Nk = 70): P and dP read once for D_i, once more for dS_ij.
  CHECK(c[TensorId::P].hbm_read_elements == 3 * Nq * Nk);  // line 1, line 3 twice
  CHECK(c[TensorId::P].hbm_write_elements == 0);           // written by the forward pass
  CHECK(c[TensorId::dP].hbm_write_elements == Nq * Nk);    // line 2
  CHECK(c[TensorId::dP].hbm_read_elements == 2 * Nq * Nk); // line 3, twice
  CHECK(c[TensorId::dS].hbm_write_elements == Nq * Nk);    // line 3
  CHECK(c[TensorId::dS].hbm_read_elements == 2 * Nq * Nk); // lines 4 and 5
  CHECK(c[TensorId::dO].hbm_read_elements == Tc * Nq * dv + Nq * dv);  // lines 1 and 2
  CHECK(c[TensorId::V].hbm_read_elements == Tr * Nk * dv);             // line 2
  CHECK(c[TensorId::K].hbm_read_elements == Tr * Nk * d);              // line 4
  CHECK(c[TensorId::Q].hbm_read_elements == Tc * Nq * d);              // line 5
  CHECK(c[TensorId::dQ].hbm_write_elements == Nq * d);
  CHECK(c[TensorId::dK].hbm_write_elements == Nk * d);
  CHECK(c[TensorId::dV].hbm_write_elements == Nk * dv);
  CHECK(c.matmul_flops == 2 * Nq * Nk * (2 * d + 2 * dv));  // no S = Q K^T: P is read
  // One key block per row (Bc = 70 = Nk): line 3 reads whole rows of P and dP once.
  const Counters whole_rows = run_standard_backward<ShapeMemory>(problem, nullptr, 0, BlockTiling{32, 70});
  CHECK(whole_rows[TensorId::P].hbm_read_elements == 2 * Nq * Nk);  // lines 1 and 3
  CHECK(whole_rows[TensorId::dP].hbm_read_elements == Nq * Nk);     // line 3
  CHECK(whole_rows[TensorId::dS].hbm_write_elements == Nq * Nk);
}

TEST_CASE("Backward schedules reject bad block sizes and overflow a too small SRAM by name", "[backward]") {
  Problem problem = base_problem(64, 64, 32);
  AttentionTensors tensors = backward_test::forward_inputs(problem, reference::fresh_seed());
  const Schedule schedule = GENERATE(Schedule::standard, Schedule::fa1, Schedule::fa2);
  INFO(backward_test::to_string(schedule));
  const std::string zero_rows = thrown_message([&] { backward_test::run(schedule, problem, &tensors, {0, 16}); });
  CHECK(zero_rows.find("block_rows = 0") != std::string::npos);
  CHECK(zero_rows.find("allowed: >= 1") != std::string::npos);
  const std::string negative_cols = thrown_message([&] { backward_test::run(schedule, problem, &tensors, {16, -3}); });
  CHECK(negative_cols.find("block_cols = -3") != std::string::npos);
  CHECK_THROWS_AS(backward_test::run(schedule, problem, &tensors, {16, 16}, 2048), SramOverflow);
  const std::string overflow = thrown_message([&] { backward_test::run(schedule, problem, &tensors, {16, 16}, 2048); });
  CHECK(overflow.find("M = 2048 B") != std::string::npos);
  CHECK_THROWS_AS(backward_test::run<DataMemory>(schedule, problem, nullptr, {16, 16}), std::invalid_argument);
  const std::string no_tensors = thrown_message([&] { backward_test::run<DataMemory>(schedule, problem, nullptr, {16, 16}); });
  CHECK(no_tensors.find("tensors = null") != std::string::npos);
  CHECK(no_tensors.find("allowed only with a shape-only memory model") != std::string::npos);
}

TEST_CASE("FA1 backward with the paper's block sizes from M", "[backward]") {
  // fa1_paper_tiling: Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d), M in elements.
  Problem problem = base_problem(113, 203, 40);
  problem.mask.causal = true;
  const std::int64_t sram_bytes = 16 * 1024;  // 4096 fp32 elements: Bc = ceil(4096 / 160) = 26, Br = 26
  const BlockTiling tiling = fa1_paper_tiling(sram_bytes, problem.head_dim, problem.dtype);
  CHECK(tiling.block_cols == 26);
  CHECK(tiling.block_rows == 26);
  check_against_oracle(Schedule::fa1, problem, {tiling.block_rows, tiling.block_cols});
  // The rule ignores most of the backward's working set: an arena of exactly M overflows, and says
  // which tile did not fit.
  AttentionTensors tensors = backward_test::forward_inputs(problem, reference::fresh_seed());
  const std::string overflow = thrown_message(
      [&] { backward_test::run(Schedule::fa1, problem, &tensors, {tiling.block_rows, tiling.block_cols}, sram_bytes); });
  CHECK(overflow.find("SRAM overflow: tile") != std::string::npos);
  CHECK(overflow.find("M = 16384 B") != std::string::npos);
}

TEST_CASE("FA1 backward on the l and m that the FA1 forward leaves in HBM", "[backward]") {
  // Algorithm 4 consumes Algorithm 1's own statistics (not m = LSE, l = 1): run the FA1 forward
  // of 03_fa1_forward.hpp step by step with its HBM state in view, then the backward on it.
  const auto [seqlen_q, seqlen_k] = GENERATE(table<int, int>({{113, 203}, {50, 20}}));
  Problem problem = base_problem(seqlen_q, seqlen_k, 40);
  problem.heads_q = 4;
  problem.heads_kv = 2;
  problem.mask.causal = true;  // (50, 20): queries 0..29 see no key, l = 0 and m = -inf there
  problem.softcap = 6.0f;
  problem.dropout = {0.1f, reference::fresh_seed(), 4};
  const BlockTiling tiling{24, 40};
  const auto seed = reference::fresh_seed();
  AttentionTensors tensors = reference::random_inputs(problem, seed, /*with_backward=*/true);
  run_backward<DataMemory>(problem, &tensors, 0, [&](DataMemory& mem, const HeadProblem& head, const HeadTensors& x) {
    HbmScratch scratch(true);
    const Fa1HbmState state = fa1_hbm_state(scratch, head);
    DataMemory forward_memory(mem.config());
    for (int row_begin = 0; row_begin < head.seqlen_q; row_begin += tiling.block_rows) {
      fa1_initialize_block(forward_memory, state, {row_begin, std::min(tiling.block_rows, head.seqlen_q - row_begin)},
                           head.head_dim_v);
    }
    for (int col_begin = 0; col_begin < head.seqlen_k; col_begin += tiling.block_cols) {
      const Range cols{col_begin, std::min(tiling.block_cols, head.seqlen_k - col_begin)};
      Tile k = forward_memory.load(x.K, cols);
      Tile v = forward_memory.load(x.V, cols);
      for (int row_begin = 0; row_begin < head.seqlen_q; row_begin += tiling.block_rows) {
        const Range rows{row_begin, std::min(tiling.block_rows, head.seqlen_q - row_begin)};
        fa1_inner_step(forward_memory, head, x, state, k, v, rows, cols.end() == head.seqlen_k, kFa1Algorithm1Lines);
      }
    }
    fa1_backward(mem, head, tiling, x, Fa1SoftmaxStatistics{state.l, state.m});
  });
  const OracleResult oracle = oracle_attention(problem, tensors, &tensors.dO);
  const auto errors = backward_test::compare_gradients(tensors, oracle);
  const double tolerance = kFp32RelativeTolerance * std::max(1.0, backward_test::largest_gradient(oracle));
  INFO(reference::describe(problem) << ", seed " << seed << "\n" << errors.describe() << "\ntolerance " << tolerance);
  CHECK(reference::compare(tensors.O, oracle.O).max_error < 1e-4);
  CHECK_FALSE(errors.any_nan());
  CHECK(errors.max_error() <= tolerance);
}

namespace {
struct LineRecorder : TraceSink {
  std::vector<int> first_seen;  // the paper's lines in the order the schedule first reaches them
  void record(const TraceEvent& event) noexcept override {
    if (event.kind != EventKind::line) return;
    if (std::find(first_seen.begin(), first_seen.end(), event.line) == first_seen.end()) first_seen.push_back(event.line);
  }
};
}  // namespace

TEST_CASE("Backward schedules mark their algorithm's lines in the paper's order", "[backward]") {
  Problem problem = base_problem(70, 90, 16);
  problem.batch = 1;
  problem.heads_q = 1;
  problem.mask.causal = true;
  problem.softcap = 2.0f;
  problem.dropout = {0.1f, 1, 1};
  AttentionTensors tensors = backward_test::forward_inputs(problem, reference::fresh_seed());
  const HeadProblem head = head_problem(problem, 0, 0);
  const HeadTensors x = head_tensors(tensors, problem, 0, 0);
  LineRecorder recorder;
  DataMemory mem(MemoryConfig{problem.dtype, 0}, &recorder);
  std::vector<int> expected;
  SECTION("05 standard backward, FA1 Algorithm 3") {
    standard_backward_from_lse(mem, head, BlockTiling{32, 32}, x);
    expected = {1, 2, 3, 4, 5};
  }
  SECTION("06 FA1 backward, FA1 Algorithm 4") {
    fa1_backward_from_lse(mem, head, BlockTiling{32, 32}, x);
    expected = {1, 5, 7, 8, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 24, 26};
  }
  SECTION("07 FA2 backward, FA2 Algorithm 2") {
    fa2_backward(mem, head, BlockTiling{32, 32}, x);
    expected = {3, 4, 6, 7, 9, 10, 11, 12, 13, 14, 15, 16, 18, 20};
  }
  CHECK(recorder.first_seen == expected);
}
