// A trace file is untrusted input: hand-made hostile traces, one per kind of defect, are refused
// by the loader with a message naming the file, the place, the field and what is allowed, before
// anything (the replay, the closed form, the score grid) uses them. Traces recorded by every
// schedule still load.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "catch.hpp"
#include "recorded_run.hpp"

using namespace flashlab;
using nlohmann::json;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The loader's message for a trace text, or "(accepted)".
std::string refusal_of(const std::string& text) {
  try {
    trace_from_json_text(text, "trace file t.json");
  } catch (const TraceFormatError& error) {
    return error.what();
  }
  return "(accepted)";
}

// A small consistent trace (N = 16, d = 16, 8 x 8 blocks): a line mark, a Q load, an S tile,
// a softmax update with its statistics and the free of S. Events 0 .. 4.
json base_trace() {
  Trace trace;
  trace.info.schedule = "fa2";
  trace.info.seqlen_q = trace.info.seqlen_k = 16;
  trace.info.head_dim = trace.info.head_dim_v = 16;
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
  RecordedEvent score;
  score.kind = EventKind::compute;
  score.tensor = TensorId::S;
  score.op = "matmul";
  score.rows = {0, 8};
  score.cols = {0, 8};
  score.bytes = 8 * 8 * 4;
  score.sram_bytes = load.bytes + score.bytes;
  RecordedEvent update;
  update.kind = EventKind::softmax_update;
  update.tensor = TensorId::m;
  update.rows = {0, 8};
  update.cols = {0, 1};
  update.sram_bytes = score.sram_bytes;
  update.row_max.assign(8, 0.5f);
  update.row_sum.assign(8, 2.0f);
  update.rescale.assign(8, 1.0f);
  RecordedEvent free_score = score;
  free_score.kind = EventKind::free;
  free_score.op.clear();
  free_score.sram_bytes = load.bytes;
  trace.events = {line, load, score, update, free_score};
  return json::parse(trace_to_json_text(trace));
}

std::string text_of(const json& j) { return j.dump(); }

// The text with one JSON value spelled out by hand (for numbers a json value cannot hold, 1e999).
std::string with_raw_value(const json& j, const json::json_pointer& pointer, const std::string& raw) {
  json marked = j;
  marked[pointer] = "@RAW@";
  std::string text = marked.dump();
  const auto at = text.find("\"@RAW@\"");
  REQUIRE(at != std::string::npos);
  return text.replace(at, 7, raw);
}

}  // namespace

TEST_CASE("the hostile traces' base trace is accepted", "[viz][trace][hostile]") {
  CHECK(refusal_of(text_of(base_trace())) == "(accepted)");
}

TEST_CASE("block sizes out of range are refused by name", "[viz][trace][hostile]") {
  for (const char* field : {"block_rows", "block_cols"}) {
    for (std::int64_t value : {std::int64_t{0}, std::int64_t{-8}, std::int64_t{1} << 40}) {
      json j = base_trace();
      j[field] = value;
      const std::string message = refusal_of(text_of(j));
      INFO(message);
      CHECK(contains(message, "t.json"));
      CHECK(contains(message, std::string("field '") + field + "' = " + std::to_string(value)));
      CHECK(contains(message, "allowed: an integer in 1 .. 2147483647"));
    }
  }
}

TEST_CASE("tile ranges past the header's shape, or overflowing, are refused", "[viz][trace][hostile]") {
  struct Case {
    std::size_t event;
    const char* field;
    json range;
    const char* allowed;
  };
  const std::int64_t int64_max = std::numeric_limits<std::int64_t>::max();
  const Case cases[] = {
      {2, "rows", {0, 64}, "allowed: begin >= 0, size >= 0, begin + size <= 16 (the 16 rows of S)"},
      {2, "cols", {8, 9}, "allowed: begin >= 0, size >= 0, begin + size <= 16 (the 16 columns of S)"},
      {1, "cols", {0, 17}, "(the 16 columns of Q)"},
      {2, "rows", {int64_max, 1}, "begin + size <= 16"},
      {2, "rows", {1, int64_max}, "begin + size <= 16"},
      {2, "rows", {2147483647, 2147483647}, "begin + size <= 16"},
      {2, "rows", {-1, 2}, "begin >= 0"},
      {2, "rows", {0, 0.5}, "begin >= 0"},
  };
  for (const Case& c : cases) {
    json j = base_trace();
    j["events"][c.event][c.field] = c.range;
    const std::string message = refusal_of(text_of(j));
    INFO(message);
    CHECK(contains(message, "t.json: event " + std::to_string(c.event) + ": field '" + c.field + "' = " + c.range.dump()));
    CHECK(contains(message, c.allowed));
  }
}

TEST_CASE("a softmax update without all its statistics is refused", "[viz][trace][hostile]") {
  for (const char* missing : {"row_max", "row_sum", "rescale"}) {
    json j = base_trace();
    j["events"][3].erase(missing);
    const std::string message = refusal_of(text_of(j));
    INFO(message);
    CHECK(contains(message, "t.json: event 3: field '" + std::string(missing) + "' is missing"));
    CHECK(contains(message, "allowed: row_max, row_sum and rescale together"));
  }
  // Statistics on one update and not on another: the softmax panel reads them across updates.
  json j = base_trace();
  json shape_only = j["events"][3];
  for (const char* name : {"row_max", "row_sum", "rescale"}) shape_only.erase(name);
  j["events"].push_back(shape_only);
  const std::string message = refusal_of(text_of(j));
  INFO(message);
  CHECK(contains(message, "t.json: event 5: a softmax update without statistics"));
  // Statistics sized for another block.
  j = base_trace();
  j["events"][3]["row_sum"].push_back(1.0);
  CHECK(contains(refusal_of(text_of(j)), "event 3: field 'row_sum' holds 9 rows for a block of 8 rows"));
}

TEST_CASE("header sizes outside the problem's range are refused", "[viz][trace][hostile]") {
  for (std::int64_t seqlen : {std::int64_t{2147483647}, std::int64_t{2147483648}, std::int64_t{0}}) {
    json j = base_trace();
    j["problem"]["seqlen_q"] = seqlen;
    const std::string message = refusal_of(text_of(j));
    INFO(message);
    CHECK(contains(message, "t.json: problem: "));
    CHECK(contains(message, "seqlen_q"));
    CHECK(contains(message, "allowed"));
  }
  json j = base_trace();
  j["problem"]["head_dim"] = 1e300;
  CHECK(contains(refusal_of(text_of(j)), "field 'head_dim' = 1e+300; allowed: an integer in"));
}

TEST_CASE("byte counts: negative, past M, or more than the tile holds are refused", "[viz][trace][hostile]") {
  json j = base_trace();
  j["events"][1]["sram"] = -1;
  CHECK(contains(refusal_of(text_of(j)), "event 1: field 'sram' = -1; allowed: an integer >= 0"));
  j = base_trace();
  j["sram_capacity_bytes"] = 600;
  CHECK(contains(refusal_of(text_of(j)), "event 2: field 'sram' = 768; allowed: an integer in 0 .. 600 (M)"));
  j = base_trace();
  j["events"][1]["bytes"] = std::int64_t{1} << 62;
  CHECK(contains(refusal_of(text_of(j)), "event 1: field 'bytes' = 4611686018427387904; allowed: an integer in 0 .. 512"));
  j = base_trace();
  j["events"][1]["bytes"] = 0.5;
  CHECK(contains(refusal_of(text_of(j)), "event 1: field 'bytes' = 0.5; allowed: an integer in 0 .. 512"));
}

TEST_CASE("JSON numbers no field can hold are refused naming the field", "[viz][trace][hostile][json]") {
  const json j = base_trace();
  // 1e999 is valid JSON syntax, but no double holds it: the parser's out_of_range.
  std::string message = refusal_of(with_raw_value(j, "/events/1/sram"_json_pointer, "1e999"));
  INFO(message);
  CHECK(contains(message, "t.json: events[1].sram: the number 1e999 is out of range"));
  message = refusal_of(with_raw_value(j, "/block_rows"_json_pointer, "-1e999"));
  CHECK(contains(message, "t.json: block_rows: the number -1e999 is out of range"));
  // A float field holding a number past float's range, and a string that is no number.
  json k = j;
  k["events"][3]["row_max"][0] = 1e300;
  CHECK(contains(refusal_of(text_of(k)), "event 3: field 'row_max' holds 1e+300; allowed: numbers within float's range"));
  k = j;
  k["events"][3]["row_sum"][2] = "many";
  CHECK(contains(refusal_of(text_of(k)), "event 3: field 'row_sum' holds \"many\""));
  // Non-integers where integers are required.
  k = j;
  k["events"][0]["line"] = 4.5;
  CHECK(contains(refusal_of(text_of(k)), "event 0: field 'line' = 4.5; allowed: an integer in 0 .."));
  k = j;
  k["version"] = 1.9;
  message = refusal_of(text_of(k));
  CHECK(contains(message, "trace format version 1.9; this build reads version 1"));
  k["version"] = 1.0;  // the same number as 1
  CHECK(refusal_of(text_of(k)) == "(accepted)");
}

TEST_CASE("a trace file larger than the loader reads is refused before reading it", "[viz][trace][hostile]") {
  const std::string path = "test_viz_oversized_trace.json";
  {
    std::ofstream file(path);
    file << text_of(base_trace());
  }
  std::filesystem::resize_file(path, kMaxTraceFileBytes + 1);  // sparse: costs no disk
  std::string message = "(accepted)";
  try {
    load_trace(path);
  } catch (const std::exception& error) {
    message = error.what();
  }
  std::filesystem::remove(path);
  INFO(message);
  CHECK(contains(message, "trace file " + path));
  CHECK(contains(message, "allowed: at most " + std::to_string(kMaxTraceFileBytes) + " bytes"));
}

TEST_CASE("more events than a trace may hold are refused", "[viz][trace][hostile]") {
  Trace trace = trace_from_json_text(text_of(base_trace()));
  RecordedEvent line = trace.events[0];
  trace.events.resize(kMaxTraceEvents + 1, line);
  try {
    validate_trace(trace, "trace file t.json");
    FAIL("accepted");
  } catch (const TraceFormatError& error) {
    const std::string message = error.what();
    INFO(message);
    CHECK(contains(message, "t.json: events: " + std::to_string(kMaxTraceEvents + 1) + " events; allowed: at most " +
                                std::to_string(kMaxTraceEvents)));
  }
}

TEST_CASE("ring steps outside a ring's trace or its devices are refused", "[viz][trace][hostile]") {
  json step = {{"kind", "ring_step"}, {"step", 1}, {"device", 0}, {"block", 3}, {"sram", 0}};
  json j = base_trace();
  j["events"].push_back(step);
  std::string message = refusal_of(text_of(j));
  CHECK(contains(message, "t.json: event 5: a ring_step event in a trace without devices"));
  j["devices"] = 4;
  CHECK(refusal_of(text_of(j)) == "(accepted)");
  for (const char* field : {"step", "device", "block"}) {
    json bad = j;
    bad["events"][5][field] = 4;
    message = refusal_of(text_of(bad));
    INFO(message);
    CHECK(contains(message, std::string("event 5: field '") + field + "' = 4; allowed: an integer in 0 .. 3 (the ring's devices)"));
  }
  j["devices"] = 0;
  CHECK(contains(refusal_of(text_of(j)), "field 'devices' = 0; allowed: an integer in 1 .. 1024"));
}

TEST_CASE("traces recorded by every schedule pass the loader's checks", "[viz][trace][hostile]") {
  const Problem problem = test::small_problem(37, 70, 24, viz::MaskChoice::causal);
  for (const std::string& schedule : viz::schedule_names()) {
    INFO(schedule);
    const test::RecordedRun run = test::record_run(schedule, problem, {16, 8});
    CHECK_NOTHROW(validate_trace(run.trace, schedule));
    CHECK(trace_from_json_text(trace_to_json_text(run.trace)) == run.trace);
  }
}
