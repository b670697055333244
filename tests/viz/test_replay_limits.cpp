// The visualizer's limits (viz/limits.hpp): a trace the loader accepts can still be too much work
// for a frame; check_replayable refuses it by name before anything is allocated or drawn, and
// every recorded trace passes.
#include <cstdio>
#include <fstream>

#include "catch.hpp"
#include "recorded_run.hpp"
#include "viz/replay.hpp"

using namespace flashlab;
using namespace flashlab::viz;
using flashlab::testing::contains_text;

namespace {

// N x N, blocks b x b, no events yet.
Trace empty_trace(int seqlen, int block) {
  Trace trace;
  trace.info.schedule = "fa2";
  trace.info.seqlen_q = trace.info.seqlen_k = seqlen;
  trace.info.head_dim = trace.info.head_dim_v = 16;
  trace.info.block_rows = trace.info.block_cols = block;
  return trace;
}

RecordedEvent score_tile(int row, int col, int size, std::int64_t sram_before) {
  RecordedEvent e;
  e.kind = EventKind::compute;
  e.tensor = TensorId::S;
  e.op = "matmul";
  e.rows = {row, size};
  e.cols = {col, size};
  e.bytes = std::int64_t{size} * size * 4;
  e.sram_bytes = sram_before + e.bytes;
  return e;
}

}  // namespace

TEST_CASE("sequences longer than the visualizer replays are refused", "[viz][limits]") {
  const Trace trace = empty_trace(kMaxReplaySeqlen + 1, 1024);
  REQUIRE_NOTHROW(validate_trace(trace));  // a valid trace, only too long to draw
  CHECK_THROWS_WITH(check_replayable(trace, "trace file t.json"),
                    contains_text("trace file t.json: problem: seqlen_q = 65537; allowed: 1 .. 65536"));
  CHECK_NOTHROW(check_replayable(empty_trace(kMaxReplaySeqlen, 1024), "t"));
}

TEST_CASE("more block pairs than the closed form may walk are refused", "[viz][limits]") {
  // 4097 x 4097 blocks of 15 rows: just over 2^24 pairs.
  const Trace over = empty_trace(4097 * 15, 15);
  CHECK_THROWS_WITH(check_replayable(over, "t"),
                    contains_text("4097 x 4097 = 16785409 block pairs; allowed: at most 16777216"));
  CHECK_NOTHROW(check_replayable(empty_trace(4096 * 15, 15), "t"));
}

TEST_CASE("more tiles live in SRAM than a schedule holds are refused", "[viz][limits]") {
  Trace trace = empty_trace(4096, 64);
  for (std::size_t i = 0; i <= kMaxLiveTiles; ++i)
    trace.events.push_back(score_tile(0, 0, 1, static_cast<std::int64_t>(i) * 4));
  REQUIRE_NOTHROW(validate_trace(trace));
  CHECK_THROWS_WITH(check_replayable(trace, "t"),
                    contains_text("t: event 64: 65 tiles live in SRAM at once; allowed: at most 64"));
  trace.events.pop_back();
  CHECK_NOTHROW(check_replayable(trace, "t"));
}

TEST_CASE("a score grid finer than the app records is refused before it is allocated", "[viz][limits]") {
  // One-score tiles on the diagonal: 2 edges each, so 2 * 512 + 1 cells along each side.
  Trace trace = empty_trace(4096, 64);
  for (int i = 0; i < 512; ++i) {
    trace.events.push_back(score_tile(2 * i + 1, 2 * i + 1, 1, 0));
    RecordedEvent freed = trace.events.back();
    freed.kind = EventKind::free;
    freed.op.clear();
    freed.sram_bytes = 0;
    trace.events.push_back(freed);
  }
  CHECK_THROWS_WITH(build_score_grid(trace), contains_text("1025 x 1025 = 1050625 cells") &&
                                                 contains_text("allowed: at most 1048576"));
  CHECK_THROWS_WITH(check_replayable(trace, "t"), contains_text("t: the score grid would have 1025 x 1025"));
  trace.events.resize(trace.events.size() - 2);
  CHECK(build_score_grid(trace).row_cells() == 1023);
}

TEST_CASE("a replayed file's refusals name the file; recorded traces pass", "[viz][limits]") {
  const std::string path = "test_viz_replay_limits.json";
  save_trace(path, empty_trace(kMaxReplaySeqlen + 1, 1024));
  CHECK_THROWS_WITH(load_replay_trace(path), contains_text("trace file " + path + ": problem: seqlen_q = 65537"));
  std::remove(path.c_str());
  CHECK_THROWS_WITH(load_replay_trace("no/such/trace.json"), contains_text("cannot open trace file no/such/trace.json"));

  for (const std::string& schedule : schedule_names()) {
    INFO(schedule);
    const test::RecordedRun run = test::record_run(schedule, test::small_problem(64, 96, 16, MaskChoice::causal), {8, 8});
    CHECK_NOTHROW(check_replayable(run.trace, schedule));
  }
  // The app's own finest recording: N = 1024 in 1 x 1 blocks under a window, one cell per score.
  RecordRequest request;
  request.schedule = "fa2";
  request.seqlen_q = request.seqlen_k = kMaxAnimatedSeqlen;
  request.head_dim = 8;
  request.mask = MaskChoice::window;
  request.window = 0;
  request.block_rows = request.block_cols = 1;
  const Recording recording = record_trace(request);
  CHECK(build_score_grid(recording.trace).row_cells() == kMaxAnimatedSeqlen);
}
