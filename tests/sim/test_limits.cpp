// The simulator's counts cannot wrap and its runs cannot run away: closed forms and counted runs
// past int64 are refused (never "equal" after both wrapped), runs past the work and memory limits
// of algorithms/limits.hpp are refused before any work, a trace's recorder is bounded and never
// throws, and the one decimal parser takes decimal numbers in range only.
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "algorithms/checked_math.hpp"
#include "algorithms/limits.hpp"
#include "catch.hpp"
#include "sim/closed_forms.hpp"
#include "sim/decimal.hpp"
#include "sim/report.hpp"
#include "sim/schedules.hpp"
#include "sim/sweep.hpp"
#include "sim/trace.hpp"

using namespace flashlab;
using namespace flashlab::sim;
using flashlab::testing::contains_text;

namespace {

// The reproducer: 384 x 128 heads of N = 2^20, d = 128 in 65536 x 65536 blocks; matmul
// FLOPs 2 N^2 (d + dv) x 49152 heads = 2^64.6.
Problem wrapping_problem() {
  Problem p;
  p.batch = 384;
  p.heads_q = p.heads_kv = 128;
  p.seqlen_q = p.seqlen_k = 1 << 20;
  p.head_dim = 128;
  p.dtype = DType::bf16;
  return p;
}

RunOptions shape_run(int block_rows, int block_cols, std::int64_t sram_bytes = 0) {
  RunOptions options;
  options.memory = MemoryKind::shape;
  options.sram_bytes = sram_bytes;
  options.blocks = {block_rows, block_cols};
  return options;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST_CASE("a run whose counts leave int64 is refused, and its closed form too", "[sim][limits][checked]") {
  const Problem problem = wrapping_problem();
  const RunOptions options = shape_run(65536, 65536);
  CHECK_THROWS_AS(run_schedule("fa2", problem, options), SizeOverflow);
  CHECK_THROWS_WITH(run_schedule("fa2", problem, options),
                    contains_text("fa2 (shape run) on batch 384, heads 128/128, N 1048576 x 1048576, d 128/128") &&
                        contains_text("matmul_flops") && contains_text("allowed: at most 9223372036854775807"));
  CHECK_THROWS_AS(closed_form("fa2", problem, options.blocks), SizeOverflow);
  // 2 N^2 (d + dv) = 2^49 FLOPs a head: 2^14 heads make 2^63, one head less fits.
  Problem edge = problem;
  edge.batch = edge.heads_q = edge.heads_kv = 128;
  CHECK_THROWS_WITH(run_schedule("fa2", edge, options), contains_text("matmul_flops"));
  Problem fits = problem;
  fits.batch = 3;
  fits.heads_q = fits.heads_kv = 5461;  // 16383 heads
  const RunResult run = run_schedule("fa2", fits, options);
  CHECK(run.counters.matmul_flops > 0);
  CHECK(run.counters.tensor == closed_form("fa2", fits, options.blocks).tensor);
  CHECK(run.counters.matmul_flops == closed_form("fa2", fits, options.blocks).matmul_flops);
}

TEST_CASE("counters scaled by a head count refuse to wrap", "[sim][limits][checked]") {
  Counters c;
  c.matmul_flops = std::int64_t{1} << 49;
  CHECK(scaled(c, 1 << 13).matmul_flops == std::int64_t{1} << 62);
  CHECK_THROWS_WITH(scaled(c, 1 << 14), contains_text("matmul_flops"));
  c.matmul_flops = 0;
  c.tensor[0].hbm_write_bytes = std::numeric_limits<std::int64_t>::max() / 3 + 1;
  CHECK_THROWS_WITH(scaled(c, 3), contains_text("hbm_write_bytes"));
}

TEST_CASE("closed forms of one head form their products in checked arithmetic", "[sim][limits][checked]") {
  Problem p;
  p.seqlen_q = p.seqlen_k = kMaxSequenceLength;
  p.head_dim = p.head_dim_v = kMaxHeadDim;
  // Square tiling: A V read ceil(dv / B) times, 2^16 x 2^60 elements; standard backward: 2^30 x 2^46.
  CHECK_THROWS_AS(closed_form("square_tiling", p, {1 << 20, 1 << 20}), SizeOverflow);
  CHECK_THROWS_AS(closed_form("standard_backward", p, {1, 1 << 30}), SizeOverflow);
  CHECK_THROWS_AS(working_set_bytes("standard", p, {1 << 30, 1 << 30}), SizeOverflow);
}

TEST_CASE("the cost of a run is known before it starts", "[sim][limits]") {
  Problem p;
  p.seqlen_q = p.seqlen_k = 256;
  p.head_dim = 16;
  CHECK(run_cost("fa2", p, shape_run(64, 64)).tile_steps == 5 * 5);  // 4 x 4 block pairs and the passes over rows or keys
  CHECK(tile_steps("square_tiling", p, 0, {64, 64}) == 4 * 4 * 2);
  p.batch = 8;
  p.heads_q = p.heads_kv = 4;
  CHECK(run_cost("fa2", p, shape_run(64, 64)).tile_steps == 25);  // shape runs run one head per class
  RunOptions data = shape_run(64, 64);
  data.memory = MemoryKind::data;
  const RunCost cost = run_cost("fa2", p, data);
  CHECK(cost.tile_steps == 25 * 32);
  CHECK(cost.multiply_adds == std::int64_t{256} * 256 * 32 * 32);
  // Q, K, V, O (d = 16) and LSE of 2048 rows x 4 heads in fp32, no scratch, the working set.
  CHECK(cost.data_bytes == 2048 * 4 * (16 * 4 + 1) * 4 + working_set_bytes("fa2", p, {64, 64}));
  CHECK(run_cost("fa2", p, data, /*caller_tensors=*/true).data_bytes == working_set_bytes("fa2", p, {64, 64}));
  CHECK(run_cost("standard", p, data).data_bytes > 2 * 256 * 256 * 4);  // S and P of a head
}

TEST_CASE("a shape run past the tile-step limit is refused before any work", "[sim][limits]") {
  Problem p;
  p.seqlen_q = p.seqlen_k = 1 << 24;
  p.dtype = DType::bf16;
  RunOptions options;
  options.sram_bytes = 64 * 1024;
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(run_schedule("fa2", p, options), contains_text("tile steps = ") &&
                                                         contains_text("allowed: at most " + std::to_string(kMaxTileSteps)));
  CHECK(seconds_since(start) < 5);
  // A degenerate tiling is refused the same way: square tiling of 1 x 1 tiles.
  p.seqlen_q = p.seqlen_k = 4096;
  p.head_dim = 128;
  CHECK_THROWS_WITH(run_schedule("square_tiling", p, shape_run(1, 1)), contains_text("tile steps"));
}

TEST_CASE("a data run past the memory or multiply-add limits is refused before it allocates", "[sim][limits]") {
  Problem p;
  p.batch = 384;
  p.heads_q = p.heads_kv = 128;
  p.seqlen_q = p.seqlen_k = 65536;  // 1.6 TB of tensors
  p.head_dim = 128;
  RunOptions options;
  options.memory = MemoryKind::data;
  options.sram_bytes = 228 * 1024;
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(run_schedule("fa2", p, options),
                    contains_text("fa2 (data run) on batch 384") && contains_text("host memory in bytes = ") &&
                        contains_text("allowed: at most " + std::to_string(kMaxDataBytes)));
  CHECK(seconds_since(start) < 5);
  // Standard attention's S and P of one head of N = 2^17: 128 GB of scratch.
  RunOptions blocks = options;
  blocks.sram_bytes = 0;
  blocks.blocks = {64, 64};
  Problem one = p;
  one.batch = one.heads_q = one.heads_kv = 1;
  one.seqlen_q = one.seqlen_k = 1 << 17;
  one.head_dim = 1;
  CHECK_THROWS_WITH(run_schedule("standard", one, blocks), contains_text("host memory in bytes"));
  // Many heads of a modest N: little memory at once, too many multiply-adds.
  Problem heads = p;
  heads.batch = 1;
  heads.heads_q = heads.heads_kv = 2048;
  heads.seqlen_q = heads.seqlen_k = 4096;
  heads.head_dim = 8;
  CHECK_THROWS_WITH(run_schedule("fa2", heads, options), contains_text("multiply-adds = "));
  // More than int64 bytes: refused against the limit, not as an overflow.
  Problem huge = p;
  huge.heads_q = huge.heads_kv = kMaxHeads;
  huge.seqlen_q = huge.seqlen_k = 1 << 22;
  huge.head_dim = kMaxHeadDim;  // 384 x 2^22 rows x 2^16 heads x 2^17 elements
  CHECK_THROWS_WITH(run_schedule("standard", huge, blocks), contains_text("host memory in bytes > 9223372036854775807"));
}

TEST_CASE("a dense batch's sequences count as one: O(heads), not O(batch)", "[sim][limits]") {
  Problem p;
  p.batch = kMaxBatch;
  p.seqlen_q = p.seqlen_k = 1;
  p.head_dim = 8;
  const auto start = std::chrono::steady_clock::now();
  const RunResult run = run_schedule("fa2", p, shape_run(1, 1));
  CHECK(run.heads_run == 1);
  CHECK(run.heads_total == kMaxBatch);
  CHECK(run.counters.tensor == closed_form("fa2", p, {1, 1}).tensor);
  CHECK(seconds_since(start) < 5);
}

TEST_CASE("sweeps and the experiment refuse a point past the limits before counting any", "[sim][limits]") {
  SweepGrid grid;
  grid.schedules = {"square_tiling"};
  grid.seqlens = {128, 16384};
  grid.head_dims = {128};
  grid.sram_bytes = {kMinSweepSramBytes};  // 1 x 1 tiles
  std::size_t counted = 0;
  CHECK_THROWS_WITH(run_sweep(grid, [&](std::size_t, std::size_t) { ++counted; }),
                    contains_text("sweep point M = 16 B") && contains_text("N 16384 x 16384") &&
                        contains_text("tile steps"));
  CHECK(counted == 0);  // the 128 point, which fits, was not counted first
  CHECK_NOTHROW(require_points_within_limits(grid, {{"square_tiling", "none", 128, 128, 16}}));
  // A block-sparse point is held to the limits before its pattern (one byte per tile) is built.
  grid.schedules = {"block_sparse"};
  grid.seqlens = {1 << 24};
  grid.head_dims = {1};
  grid.sram_bytes = {64};
  grid.masks = {"sparse:0.5"};
  CHECK_THROWS_WITH(run_sweep(grid), contains_text("tile steps"));
}

TEST_CASE("the trace recorder is bounded, refuses bounds past the limits and never throws", "[sim][limits][trace]") {
  static_assert(noexcept(std::declval<TraceRecorder&>().record(std::declval<const TraceEvent&>())));
  static_assert(noexcept(std::declval<TraceSink&>().record(std::declval<const TraceEvent&>())));
  CHECK_THROWS_WITH(TraceRecorder(kMaxTraceEvents + 1), contains_text("max_events = 2000001; allowed: 1..2000000"));
  CHECK_THROWS_AS(TraceRecorder(0), std::invalid_argument);
  CHECK_THROWS_WITH(TraceRecorder(10, kMaxTraceValueElements + 1), contains_text("value_elements_limit"));
  CHECK_THROWS_WITH(TraceRecorder(10, -1), contains_text("allowed: 0.."));

  // Values past the recorder's value bound: counted, reported by finish(), not stored.
  TraceRecorder recorder(100, 16, /*max_values=*/20);
  TraceEvent event;
  event.kind = EventKind::compute;
  event.tensor = TensorId::S;
  event.values.assign(16, 1.0f);
  recorder.record(event);
  CHECK_FALSE(recorder.overflowed());
  recorder.record(event);  // 32 values > 20
  CHECK(recorder.overflowed());
  CHECK(recorder.events().size() == 1);
  CHECK_THROWS_WITH(recorder.finish(TraceInfo{}), contains_text("more than 20 tile values"));
}

TEST_CASE("one decimal parser: digits only, in range, the range named", "[sim][decimal]") {
  CHECK(parse_decimal("0", "n", 0, 10) == 0);
  CHECK(parse_decimal("-1", "n", -1, 10) == -1);
  CHECK(parse_decimal("2147483647", "n", 0, std::numeric_limits<std::int64_t>::max()) == 2147483647);
  CHECK(parse_decimal("9223372036854775807", "n", 0, std::numeric_limits<std::int64_t>::max()) ==
        std::numeric_limits<std::int64_t>::max());
  CHECK(parse_decimal("-9223372036854775808", "n", std::numeric_limits<std::int64_t>::min(), 0) ==
        std::numeric_limits<std::int64_t>::min());
  for (const char* bad : {"010", "0x10", "0X10", "0b1", "+5", " 5", "5 ", "", "-", "1e3", "1.0", "١", "5k", "--5", "-010"}) {
    INFO(bad);
    CHECK_THROWS_WITH(parse_decimal(bad, "--batch", 1, 100),
                      contains_text("--batch = '" + std::string(bad) + "' is not a decimal number") &&
                          contains_text("allowed: 1..100"));
  }
  for (const char* far : {"101", "0", "-1", "2147483648", "9223372036854775808", "99999999999999999999999"}) {
    INFO(far);
    CHECK_THROWS_WITH(parse_decimal(far, "--batch", 1, 100), contains_text("is out of range; allowed: 1..100"));
  }
  CHECK(parse_decimal_unsigned("18446744073709551615", "--seed", 0, std::numeric_limits<std::uint64_t>::max()) ==
        std::numeric_limits<std::uint64_t>::max());
  for (const char* far : {"-1", "-0", "18446744073709551616"}) {
    INFO(far);
    CHECK_THROWS_WITH(parse_decimal_unsigned(far, "--seed", 0, std::numeric_limits<std::uint64_t>::max()),
                      contains_text("is out of range; allowed: 0..18446744073709551615"));
  }
  CHECK(parse_decimal_real("0.25", "S", 0, 1) == 0.25);
  CHECK(parse_decimal_real(".5", "S", 0, 1) == 0.5);
  CHECK(parse_decimal_real("1e-3", "S", 0, 1) == 1e-3);
  CHECK(parse_decimal_real("-0.5", "x", -1, 1) == -0.5);
  for (const char* bad : {"inf", "nan", "0x1p-2", "1.", ".", "e5", "1e", "00.5", "+0.5", "0.5 "}) {
    INFO(bad);
    CHECK_THROWS_WITH(parse_decimal_real(bad, "S", 0, 1, "0 < S <= 1"),
                      contains_text("is not a decimal number") && contains_text("allowed: 0 < S <= 1"));
  }
  CHECK_THROWS_WITH(parse_decimal_real("1e999", "S", 0, 1), contains_text("is out of range"));
  CHECK_THROWS_WITH(parse_decimal_real("1.5", "S", 0, 1), contains_text("is out of range"));
  CHECK(parse_decimal_as<int>("42", "n", 0, 100) == 42);
  CHECK(parse_decimal_as<std::size_t>("42", "n", 0, 100) == 42);
}

TEST_CASE("SRAM sizes: decimal digits, a suffix, at most kMaxSramBytes", "[sim][decimal]") {
  CHECK(parse_bytes("0") == 0);
  CHECK(parse_bytes("1048576M") == kMaxSramBytes);
  CHECK_THROWS_WITH(parse_bytes("1048577M", "--sram"), contains_text("--sram: size '1048577M' is out of range") &&
                                                            contains_text("allowed: a byte count in 0..1099511627776"));
  CHECK_THROWS_WITH(parse_bytes("999999999999999999999K"), contains_text("is out of range"));
  CHECK_THROWS_WITH(parse_bytes("064K"), contains_text("'064' is not a decimal number"));
  CHECK_THROWS_WITH(parse_bytes("-5K"), contains_text("size '-5K' is not understood"));
  CHECK_THROWS_WITH(parse_mask("window:010"), contains_text("window W = '010' is not a decimal number"));
  CHECK_THROWS_WITH(parse_mask("window:-1"), contains_text("is out of range; allowed: 0..1073741824"));
  CHECK_THROWS_WITH(parse_mask("sparse:0"), contains_text("allowed: 0 < S <= 1"));
  CHECK_THROWS_WITH(parse_mask("sparse:0x1p-2"), contains_text("is not a decimal number"));
}
