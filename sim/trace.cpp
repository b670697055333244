#include "trace.hpp"

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

namespace flashlab {

using nlohmann::json;

bool TraceInfo::operator==(const TraceInfo& other) const {
  return schedule == other.schedule && seqlen_q == other.seqlen_q && seqlen_k == other.seqlen_k &&
         head_dim == other.head_dim && head_dim_v == other.head_dim_v && dtype == other.dtype &&
         mask.causal == other.mask.causal && mask.alignment == other.mask.alignment &&
         mask.window_left == other.mask.window_left && mask.window_right == other.mask.window_right &&
         sram_capacity_bytes == other.sram_capacity_bytes && block_rows == other.block_rows &&
         block_cols == other.block_cols;
}

// ---------------------------------------------------------------------------------------------
// The recorder

TraceRecorder::TraceRecorder(std::size_t max_events, std::int64_t value_elements_limit, std::int64_t max_values)
    : max_events_(max_events), max_values_(max_values) {
  if (max_events < 1 || max_events > static_cast<std::size_t>(kMaxTraceEvents)) {
    throw std::invalid_argument("trace: max_events = " + std::to_string(max_events) + "; allowed: 1.." +
                                std::to_string(kMaxTraceEvents));
  }
  if (value_elements_limit < 0 || value_elements_limit > kMaxTraceValueElements) {
    throw std::invalid_argument("trace: value_elements_limit = " + std::to_string(value_elements_limit) + "; allowed: 0.." +
                                std::to_string(kMaxTraceValueElements));
  }
  if (max_values < 0 || max_values > kMaxTraceValues) {
    throw std::invalid_argument("trace: max_values = " + std::to_string(max_values) + "; allowed: 0.." +
                                std::to_string(kMaxTraceValues));
  }
  this->value_elements_limit = value_elements_limit;
}

void TraceRecorder::record(const TraceEvent& event) noexcept {
  ++seen_events_;
  if (overflowed()) return;  // counted, reported by finish()
  // Only score and probability tiles keep values: they are what the visualizer shows on hover.
  const bool keeps_values = event.tensor == TensorId::S || event.tensor == TensorId::P;
  const auto values = static_cast<std::int64_t>(event.row_max.size() + event.row_sum.size() + event.rescale.size() +
                                                (keeps_values ? event.values.size() : 0));
  stored_values_ += values;  // bounded by max_values_ + one event's values: no overflow
  if (overflowed()) return;
  try {
    RecordedEvent stored;
    stored.kind = event.kind;
    stored.tensor = event.tensor;
    stored.rows = event.rows;
    stored.cols = event.cols;
    stored.op = event.op ? event.op : "";
    stored.line = event.line;
    stored.sram_bytes = event.sram_bytes;
    stored.bytes = event.bytes;
    stored.row_max = event.row_max;
    stored.row_sum = event.row_sum;
    stored.rescale = event.rescale;
    if (keeps_values) stored.values = event.values;
    events_.push_back(std::move(stored));
  } catch (const std::exception&) {  // out of memory: noted, reported by finish(), never thrown from here
    out_of_memory_ = true;
  }
}

Trace TraceRecorder::finish(TraceInfo info) {
  const std::string what = "trace of " + (info.schedule.empty() ? std::string("the schedule") : info.schedule);
  const std::string advice = "; record a smaller problem (or larger blocks), or count it without a trace";
  if (seen_events_ > max_events_) {
    throw TraceOverflow(what + " has " + std::to_string(seen_events_) + " events, over the recorder's bound of " +
                        std::to_string(max_events_) + " events" + advice);
  }
  if (stored_values_ > max_values_) {
    throw TraceOverflow(what + " keeps more than " + std::to_string(max_values_) +
                        " tile values and softmax statistics, the recorder's bound" + advice +
                        " (or keep fewer values: --value-elements)");
  }
  if (out_of_memory_) {
    throw TraceOverflow(what + ": out of memory after " + std::to_string(events_.size()) + " events" + advice);
  }
  return Trace{std::move(info), std::move(events_)};
}

// ---------------------------------------------------------------------------------------------
// Names

TensorId tensor_from_string(const std::string& name) {
  for (int i = 0; i < kTensorCount; ++i) {
    if (name == to_string(static_cast<TensorId>(i))) return static_cast<TensorId>(i);
  }
  throw std::invalid_argument("tensor '" + name + "' is unknown; allowed: Q, K, V, O, LSE, dO, dQ, dK, dV, D, S, P, dS, dP, "
                              "m, l, O_partial, LSE_partial, A, X, Y");
}

EventKind event_kind_from_string(const std::string& name) {
  for (EventKind kind : {EventKind::load, EventKind::store, EventKind::compute, EventKind::free,
                         EventKind::softmax_update, EventKind::line}) {
    if (name == to_string(kind)) return kind;
  }
  throw std::invalid_argument("event kind '" + name + "' is unknown; allowed: load, store, compute, free, "
                              "softmax_update, line");
}

// ---------------------------------------------------------------------------------------------
// JSON

namespace {

json float_to_json(float value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return value;
}

json floats_to_json(const std::vector<float>& values) {
  json array = json::array();
  for (float v : values) array.push_back(float_to_json(v));
  return array;
}

json event_to_json(const RecordedEvent& e) {
  json j;
  j["kind"] = to_string(e.kind);
  if (e.kind == EventKind::line) {
    j["line"] = e.line;
    j["sram"] = e.sram_bytes;
    return j;
  }
  j["tensor"] = to_string(e.tensor);
  j["rows"] = {e.rows.begin, e.rows.size};
  j["cols"] = {e.cols.begin, e.cols.size};
  if (!e.op.empty()) j["op"] = e.op;
  j["sram"] = e.sram_bytes;
  j["bytes"] = e.bytes;
  if (!e.row_max.empty()) j["row_max"] = floats_to_json(e.row_max);
  if (!e.row_sum.empty()) j["row_sum"] = floats_to_json(e.row_sum);
  if (!e.rescale.empty()) j["rescale"] = floats_to_json(e.rescale);
  if (!e.values.empty()) j["values"] = floats_to_json(e.values);
  return j;
}

const char* alignment_name(CausalAlignment alignment) {
  return alignment == CausalAlignment::top_left ? "top_left" : "bottom_right";
}

// Reading: every failure names the input, the place in it and what was expected.
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw TraceFormatError(source_ + ": " + where + ": " + what);
  }
  const json& field(const json& object, const char* name, const std::string& where) const {
    if (!object.is_object()) fail(where, "expected a JSON object");
    auto it = object.find(name);
    if (it == object.end()) fail(where, std::string("missing field '") + name + "'");
    return *it;
  }
  std::int64_t integer(const json& object, const char* name, const std::string& where) const {
    const json& value = field(object, name, where);
    if (!value.is_number_integer()) fail(where, std::string("field '") + name + "' must be an integer");
    return value.get<std::int64_t>();
  }
  int small_integer(const json& object, const char* name, const std::string& where) const {
    const std::int64_t value = integer(object, name, where);
    if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max())
      fail(where, std::string("field '") + name + "' = " + std::to_string(value) + " is out of range");
    return static_cast<int>(value);
  }
  std::string text(const json& object, const char* name, const std::string& where) const {
    const json& value = field(object, name, where);
    if (!value.is_string()) fail(where, std::string("field '") + name + "' must be a string");
    return value.get<std::string>();
  }
  bool boolean(const json& object, const char* name, const std::string& where) const {
    const json& value = field(object, name, where);
    if (!value.is_boolean()) fail(where, std::string("field '") + name + "' must be true or false");
    return value.get<bool>();
  }
  Range range(const json& object, const char* name, const std::string& where) const {
    const json& value = field(object, name, where);
    if (!value.is_array() || value.size() != 2 || !value[0].is_number_integer() || !value[1].is_number_integer())
      fail(where, std::string("field '") + name + "' must be [begin, size]");
    const std::int64_t begin = value[0].get<std::int64_t>(), size = value[1].get<std::int64_t>();
    if (begin < 0 || size < 0 || begin + size > std::numeric_limits<int>::max())
      fail(where, std::string("field '") + name + "' = [" + std::to_string(begin) + ", " + std::to_string(size) +
                      "]; allowed: begin >= 0, size >= 0");
    return {static_cast<int>(begin), static_cast<int>(size)};
  }
  std::vector<float> floats(const json& object, const char* name, const std::string& where) const {
    std::vector<float> result;
    auto it = object.find(name);
    if (it == object.end()) return result;
    if (!it->is_array()) fail(where, std::string("field '") + name + "' must be an array of numbers");
    result.reserve(it->size());
    for (const json& v : *it) {
      if (v.is_number()) {
        result.push_back(v.get<float>());
      } else if (v == "-inf") {
        result.push_back(-std::numeric_limits<float>::infinity());
      } else if (v == "inf") {
        result.push_back(std::numeric_limits<float>::infinity());
      } else if (v == "nan") {
        result.push_back(std::numeric_limits<float>::quiet_NaN());
      } else {
        fail(where, std::string("field '") + name + "' holds " + v.dump() + "; allowed: numbers, \"inf\", \"-inf\", \"nan\"");
      }
    }
    return result;
  }
  template <class Convert>
  auto named(const json& object, const char* name, const std::string& where, Convert convert) const {
    const std::string value = text(object, name, where);
    try {
      return convert(value);
    } catch (const std::invalid_argument& error) {
      fail(where, error.what());
    }
  }

 private:
  std::string source_;
};

RecordedEvent event_from_json(const Reader& in, const json& j, const std::string& where) {
  RecordedEvent e;
  e.kind = in.named(j, "kind", where, event_kind_from_string);
  e.sram_bytes = in.integer(j, "sram", where);
  if (e.kind == EventKind::line) {
    e.line = in.small_integer(j, "line", where);
    return e;
  }
  e.tensor = in.named(j, "tensor", where, tensor_from_string);
  e.rows = in.range(j, "rows", where);
  e.cols = in.range(j, "cols", where);
  if (j.contains("op")) e.op = in.text(j, "op", where);
  e.bytes = in.integer(j, "bytes", where);
  e.row_max = in.floats(j, "row_max", where);
  e.row_sum = in.floats(j, "row_sum", where);
  e.rescale = in.floats(j, "rescale", where);
  e.values = in.floats(j, "values", where);
  if (!e.values.empty() && static_cast<std::int64_t>(e.values.size()) != e.elements())
    in.fail(where, "'values' holds " + std::to_string(e.values.size()) + " numbers for a " + std::to_string(e.rows.size) +
                       " x " + std::to_string(e.cols.size) + " tile");
  for (const auto* stats : {&e.row_max, &e.row_sum, &e.rescale}) {
    if (!stats->empty() && static_cast<int>(stats->size()) != e.rows.size)
      in.fail(where, "softmax statistics hold " + std::to_string(stats->size()) + " rows for a block of " +
                         std::to_string(e.rows.size) + " rows");
  }
  return e;
}

}  // namespace

std::string trace_to_json_text(const Trace& trace, int indent) {
  const TraceInfo& info = trace.info;
  json j;
  j["format"] = kTraceFormatName;
  j["version"] = kTraceFormatVersion;
  j["schedule"] = info.schedule;
  j["problem"] = {{"seqlen_q", info.seqlen_q},
                  {"seqlen_k", info.seqlen_k},
                  {"head_dim", info.head_dim},
                  {"head_dim_v", info.head_dim_v},
                  {"dtype", to_string(info.dtype)},
                  {"mask",
                   {{"causal", info.mask.causal},
                    {"alignment", alignment_name(info.mask.alignment)},
                    {"window_left", info.mask.window_left},
                    {"window_right", info.mask.window_right}}}};
  j["sram_capacity_bytes"] = info.sram_capacity_bytes;
  j["block_rows"] = info.block_rows;
  j["block_cols"] = info.block_cols;
  json events = json::array();
  for (const RecordedEvent& e : trace.events) events.push_back(event_to_json(e));
  j["events"] = std::move(events);
  return j.dump(indent);
}

Trace trace_from_json_text(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& error) {
    throw TraceFormatError(source + ": not valid JSON (" + error.what() + ")");
  }
  const Reader in(source);
  if (!j.is_object() || !j.contains("format") || j["format"] != kTraceFormatName)
    in.fail("top level", std::string("not a FlashLab trace (expected \"format\": \"") + kTraceFormatName + "\")");
  const std::int64_t version = in.integer(j, "version", "top level");
  if (version != kTraceFormatVersion)
    in.fail("top level", "trace format version " + std::to_string(version) + "; this build reads version " +
                             std::to_string(kTraceFormatVersion) + " (record the trace again with this build)");

  Trace trace;
  TraceInfo& info = trace.info;
  info.schedule = in.text(j, "schedule", "top level");
  const json& problem = in.field(j, "problem", "top level");
  info.seqlen_q = in.small_integer(problem, "seqlen_q", "problem");
  info.seqlen_k = in.small_integer(problem, "seqlen_k", "problem");
  info.head_dim = in.small_integer(problem, "head_dim", "problem");
  info.head_dim_v = in.small_integer(problem, "head_dim_v", "problem");
  if (info.seqlen_q < 1 || info.seqlen_k < 1 || info.head_dim < 1 || info.head_dim_v < 1)
    in.fail("problem", "seqlen_q, seqlen_k, head_dim and head_dim_v must be >= 1");
  info.dtype = in.named(problem, "dtype", "problem", dtype_from_string);
  const json& mask = in.field(problem, "mask", "problem");
  info.mask.causal = in.boolean(mask, "causal", "problem.mask");
  const std::string alignment = in.text(mask, "alignment", "problem.mask");
  if (alignment != "top_left" && alignment != "bottom_right")
    in.fail("problem.mask", "alignment '" + alignment + "'; allowed: top_left, bottom_right");
  info.mask.alignment = alignment == "top_left" ? CausalAlignment::top_left : CausalAlignment::bottom_right;
  info.mask.window_left = in.small_integer(mask, "window_left", "problem.mask");
  info.mask.window_right = in.small_integer(mask, "window_right", "problem.mask");
  info.sram_capacity_bytes = in.integer(j, "sram_capacity_bytes", "top level");
  info.block_rows = in.small_integer(j, "block_rows", "top level");
  info.block_cols = in.small_integer(j, "block_cols", "top level");

  const json& events = in.field(j, "events", "top level");
  if (!events.is_array()) in.fail("top level", "field 'events' must be an array");
  trace.events.reserve(events.size());
  for (std::size_t i = 0; i < events.size(); ++i)
    trace.events.push_back(event_from_json(in, events[i], "event " + std::to_string(i)));
  return trace;
}

void save_trace(const std::string& path, const Trace& trace) {
  std::ofstream file(path);
  if (!file) throw std::runtime_error("cannot write trace file " + path);
  file << trace_to_json_text(trace) << '\n';
  if (!file) throw std::runtime_error("writing trace file " + path + " failed");
}

Trace load_trace(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw std::runtime_error("cannot open trace file " + path);
  std::ostringstream text;
  text << file.rdbuf();
  return trace_from_json_text(text.str(), "trace file " + path);
}

TraceInfo trace_info(const std::string& schedule, const Problem& problem, std::int64_t sram_capacity_bytes,
                     int block_rows, int block_cols) {
  TraceInfo info;
  info.schedule = schedule;
  info.seqlen_q = problem.seqlen_q;
  info.seqlen_k = problem.seqlen_k;
  info.head_dim = problem.head_dim;
  info.head_dim_v = problem.value_dim();
  info.dtype = problem.dtype;
  info.mask = problem.mask;
  info.sram_capacity_bytes = sram_capacity_bytes;
  info.block_rows = block_rows;
  info.block_cols = block_cols;
  return info;
}

}  // namespace flashlab
