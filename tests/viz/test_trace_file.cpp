// The recorder's bound and the trace file: round trip, and clear errors for bad files.
#include <cmath>
#include <cstdio>
#include <fstream>

#include "catch.hpp"
#include "recorded_run.hpp"

using namespace flashlab;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string format_error_of(const std::string& text) {
  try {
    trace_from_json_text(text, "trace file t.json");
  } catch (const TraceFormatError& error) {
    return error.what();
  }
  return "(no error)";
}

// A valid trace's JSON with one substitution, for the error cases.
std::string valid_text() {
  Trace trace;
  trace.info.schedule = "fa2";
  trace.info.seqlen_q = trace.info.seqlen_k = 8;  // the Q tile below lies inside the problem
  trace.info.block_rows = trace.info.block_cols = 8;
  RecordedEvent line;
  line.kind = EventKind::line;
  line.line = 4;
  RecordedEvent load;
  load.kind = EventKind::load;
  load.tensor = TensorId::Q;
  load.rows = {0, 8};
  load.cols = {0, 16};
  load.bytes = 8 * 16 * 4;
  load.sram_bytes = load.bytes;
  trace.events = {line, load};
  return trace_to_json_text(trace);
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

}  // namespace

TEST_CASE("a recorded trace survives the JSON round trip, -inf included", "[viz][trace]") {
  // A sliding window hides keys inside tiles, so recorded S values hold -inf.
  const Problem problem = test::small_problem(45, 77, 24, viz::MaskChoice::window, 9);
  const test::RecordedRun run = test::record_run("fa2", problem, {16, 24});
  INFO("seed " << run.seed);
  bool has_minus_infinity = false;
  for (const RecordedEvent& e : run.trace.events)
    for (float v : e.values) has_minus_infinity |= std::isinf(v) && v < 0;
  CHECK(has_minus_infinity);

  const Trace back = trace_from_json_text(trace_to_json_text(run.trace));
  CHECK(back.info == run.trace.info);
  REQUIRE(back.events.size() == run.trace.events.size());
  for (std::size_t i = 0; i < back.events.size(); ++i) {
    INFO("event " << i);
    CHECK(back.events[i] == run.trace.events[i]);
  }

  const std::string path = "test_viz_round_trip.json";
  save_trace(path, run.trace);
  CHECK(load_trace(path) == run.trace);
  std::remove(path.c_str());
}

TEST_CASE("the recorder says when a run exceeds its bound instead of truncating", "[viz][trace]") {
  const Problem problem = test::small_problem(40, 40, 16, viz::MaskChoice::none);
  TraceRecorder unbounded;
  TraceRecorder bounded(25);
  for (TraceRecorder* recorder : {&unbounded, &bounded}) {
    sim::RunOptions options;
    options.memory = sim::MemoryKind::data;
    options.blocks = {8, 8};
    options.trace = recorder;
    sim::run_schedule("fa2", problem, options);
  }
  REQUIRE(unbounded.seen_events() > 25);
  CHECK_FALSE(unbounded.overflowed());
  CHECK(bounded.overflowed());
  CHECK(bounded.seen_events() == unbounded.seen_events());
  CHECK(bounded.events().size() == 25);
  TraceInfo info;
  info.schedule = "fa2";
  try {
    bounded.finish(info);
    FAIL("finish() returned a partial trace");
  } catch (const TraceOverflow& error) {
    const std::string message = error.what();
    INFO(message);
    CHECK(contains(message, std::to_string(unbounded.seen_events()) + " events"));
    CHECK(contains(message, "bound of 25"));
  }
}

TEST_CASE("a malformed or foreign trace file gives an error naming the problem", "[viz][trace]") {
  CHECK(trace_from_json_text(valid_text()).events.size() == 2);

  CHECK(contains(format_error_of("{\"format\": \"flashlab-trace\", "), "t.json: not valid JSON"));
  CHECK(contains(format_error_of("[1, 2, 3]"), "not a FlashLab trace"));
  CHECK(contains(format_error_of("{\"format\": \"chrome-trace\"}"), "not a FlashLab trace"));

  const std::string other_version = format_error_of(replaced(valid_text(), "\"version\":1", "\"version\":2"));
  INFO(other_version);
  CHECK(contains(other_version, "version 2"));
  CHECK(contains(other_version, "reads version 1"));

  const std::string unknown_tensor = format_error_of(replaced(valid_text(), "\"tensor\":\"Q\"", "\"tensor\":\"Z\""));
  CHECK(contains(unknown_tensor, "event 1"));
  CHECK(contains(unknown_tensor, "tensor 'Z' is unknown"));

  const std::string missing = format_error_of(replaced(valid_text(), "\"bytes\":512,", ""));
  CHECK(contains(missing, "event 1: field 'bytes' is missing"));

  const std::string bad_range = format_error_of(replaced(valid_text(), "\"rows\":[0,8]", "\"rows\":[0,-8]"));
  CHECK(contains(bad_range, "event 1: field 'rows'"));

  const std::string bad_kind = format_error_of(replaced(valid_text(), "\"kind\":\"load\"", "\"kind\":\"teleport\""));
  CHECK(contains(bad_kind, "event kind 'teleport' is unknown"));

  const std::string bad_dtype = format_error_of(replaced(valid_text(), "\"dtype\":\"fp32\"", "\"dtype\":\"fp8\""));
  CHECK(contains(bad_dtype, "problem:"));

  std::string missing_file = "(no error)";
  try {
    load_trace("no/such/trace.json");
  } catch (const TraceFormatError& error) {
    missing_file = error.what();
  }
  CHECK(contains(missing_file, "cannot open trace file no/such/trace.json"));
}
