#include "trace.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "output_file.hpp"

namespace flashlab {

using nlohmann::json;

bool TraceInfo::operator==(const TraceInfo& other) const {
  return schedule == other.schedule && seqlen_q == other.seqlen_q && seqlen_k == other.seqlen_k &&
         head_dim == other.head_dim && head_dim_v == other.head_dim_v && dtype == other.dtype &&
         mask.causal == other.mask.causal && mask.alignment == other.mask.alignment &&
         mask.window_left == other.mask.window_left && mask.window_right == other.mask.window_right &&
         sram_capacity_bytes == other.sram_capacity_bytes && block_rows == other.block_rows &&
         block_cols == other.block_cols && devices == other.devices;
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
    stored.step = event.step, stored.device = event.device, stored.block = event.block;
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
                              "m, l, O_partial, LSE_partial, A, X, Y, page_table");
}

EventKind event_kind_from_string(const std::string& name) {
  for (EventKind kind : {EventKind::load, EventKind::store, EventKind::compute, EventKind::free,
                         EventKind::softmax_update, EventKind::line, EventKind::ring_step}) {
    if (name == to_string(kind)) return kind;
  }
  throw std::invalid_argument("event kind '" + name + "' is unknown; allowed: load, store, compute, free, "
                              "softmax_update, line, ring_step");
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
  if (e.kind == EventKind::ring_step) {
    j["step"] = e.step, j["device"] = e.device, j["block"] = e.block;
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

constexpr int kIntMin = std::numeric_limits<int>::min();
constexpr int kIntMax = std::numeric_limits<int>::max();

// The rows or columns of a tensor, for one head of the header's problem: what its tiles lie in.
struct Extent {
  std::int64_t size = 0;
  std::string what;  // "the 16 rows of S"
};

// Statistics have a column per KV chunk where a schedule keeps several (split KV,
// memory-efficient), and there are at most as many chunks as keys; O_partial stacks one block of
// rows per chunk. The softmax lab's X and Y are never traced; they get the score matrix's shape.
Extent row_extent(TensorId id, const TraceInfo& info) {
  std::int64_t rows = info.seqlen_q;
  if (id == TensorId::K || id == TensorId::V || id == TensorId::dK || id == TensorId::dV) rows = info.seqlen_k;
  if (id == TensorId::O_partial) rows = std::min<std::int64_t>(std::int64_t{info.seqlen_q} * info.seqlen_k, kIntMax);
  return {rows, "the " + std::to_string(rows) + " rows of " + to_string(id)};
}

Extent col_extent(TensorId id, const TraceInfo& info) {
  std::int64_t cols = info.seqlen_k;
  switch (id) {
    case TensorId::Q: case TensorId::K: case TensorId::dQ: case TensorId::dK: cols = info.head_dim; break;
    case TensorId::V: case TensorId::O: case TensorId::dV: case TensorId::dO: case TensorId::O_partial:
      cols = info.head_dim_v;
      break;
    case TensorId::LSE: case TensorId::D: cols = 1; break;
    default: break;  // S, P, dS, dP, A, the statistics' chunks, X, Y
  }
  return {cols, "the " + std::to_string(cols) + " columns of " + to_string(id)};
}

std::string range_allowed(const Extent& extent) {
  return "begin >= 0, size >= 0, begin + size <= " + std::to_string(extent.size) + " (" + extent.what + ")";
}

// The SRAM in use never exceeds M when M is bounded.
std::int64_t sram_limit(const TraceInfo& info) {
  return info.sram_capacity_bytes > 0 ? info.sram_capacity_bytes : std::numeric_limits<std::int64_t>::max();
}
std::string sram_note(const TraceInfo& info) { return info.sram_capacity_bytes > 0 ? "(M)" : ""; }
std::string sram_allowed(const TraceInfo& info) {
  return JsonFields::integer_range(0, sram_limit(info)) + (info.sram_capacity_bytes > 0 ? " " + sram_note(info) : "");
}

std::string bytes_note() { return "(" + std::to_string(kMaxTraceElementBytes) + " bytes per element of the tile)"; }

json range_json(Range r) { return json::array({r.begin, r.size}); }

// Tiles lie inside their tensor. In int64: begin + size of two ints cannot overflow there.
void check_ranges(const JsonFields& in, const RecordedEvent& e, const TraceInfo& info, const std::string& where) {
  for (const auto& [name, range, extent] : {std::tuple{"rows", e.rows, row_extent(e.tensor, info)},
                                            std::tuple{"cols", e.cols, col_extent(e.tensor, info)}}) {
    if (range.begin < 0 || range.size < 0 || std::int64_t{range.begin} + range.size > extent.size)
      in.fail(where, JsonFields::out_of_range(name, range_json(range), range_allowed(extent)));
  }
}

// Reading: a file is converted into a Trace with every number checked to fit its field, then
// validate_trace checks the trace against its header. Every refusal names the input, the place
// in it ("event 12"), the field and what is allowed.
class Reader : public JsonFields {
 public:
  using JsonFields::JsonFields;

  int small_integer(const json& object, const char* name, const std::string& where, int low = kIntMin) const {
    return static_cast<int>(integer(object, name, where, low, kIntMax));
  }
  // [begin, size], each fitting an int (validate_trace checks the tensor's bounds).
  Range range(const json& object, const char* name, const std::string& where, const Extent& extent) const {
    const json& value = field(object, name, where);
    std::optional<std::int64_t> begin, size;
    if (value.is_array() && value.size() == 2) begin = exact_integer(value[0]), size = exact_integer(value[1]);
    if (!begin || !size || *begin < 0 || *size < 0 || *begin > kIntMax || *size > kIntMax)
      fail(where, out_of_range(name, value, range_allowed(extent)));
    return {static_cast<int>(*begin), static_cast<int>(*size)};
  }
  // Absent: empty. Numbers within float's range, or the strings of the non-finite floats.
  std::vector<float> floats(const json& object, const char* name, const std::string& where) const {
    std::vector<float> result;
    auto it = object.find(name);
    if (it == object.end()) return result;
    if (!it->is_array()) fail(where, out_of_range(name, *it, "an array of numbers"));
    result.reserve(it->size());
    for (const json& v : *it) {
      if (v.is_number() && std::fabs(v.get<double>()) <= std::numeric_limits<float>::max()) {
        result.push_back(v.get<float>());
      } else if (v == "-inf") {
        result.push_back(-std::numeric_limits<float>::infinity());
      } else if (v == "inf") {
        result.push_back(std::numeric_limits<float>::infinity());
      } else if (v == "nan") {
        result.push_back(std::numeric_limits<float>::quiet_NaN());
      } else {
        fail(where, std::string("field '") + name + "' holds " + shown(v) +
                        "; allowed: numbers within float's range (|x| <= 3.4e38), \"inf\", \"-inf\", \"nan\"");
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
};

RecordedEvent event_from_json(const Reader& in, const json& j, const TraceInfo& info, const std::string& where) {
  RecordedEvent e;
  e.kind = in.named(j, "kind", where, event_kind_from_string);
  e.sram_bytes = in.integer(j, "sram", where, 0, sram_limit(info), sram_note(info));
  if (e.kind == EventKind::line) {
    e.line = in.small_integer(j, "line", where, 0);
    return e;
  }
  if (e.kind == EventKind::ring_step) {  // the ranges are checked against the header's devices
    e.step = in.small_integer(j, "step", where);
    e.device = in.small_integer(j, "device", where);
    e.block = in.small_integer(j, "block", where);
    return e;
  }
  e.tensor = in.named(j, "tensor", where, tensor_from_string);
  e.rows = in.range(j, "rows", where, row_extent(e.tensor, info));
  e.cols = in.range(j, "cols", where, col_extent(e.tensor, info));
  check_ranges(in, e, info, where);  // the tile's size is now bounded by the header's
  if (j.contains("op")) e.op = in.text(j, "op", where);
  e.bytes = in.integer(j, "bytes", where, 0, e.elements() * kMaxTraceElementBytes, bytes_note());
  e.row_max = in.floats(j, "row_max", where);
  e.row_sum = in.floats(j, "row_sum", where);
  e.rescale = in.floats(j, "rescale", where);
  e.values = in.floats(j, "values", where);
  return e;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Checking a trace against its header

namespace {

void check_event(const JsonFields& in, const RecordedEvent& e, const TraceInfo& info, const std::string& where) {
  if (e.sram_bytes < 0 || e.sram_bytes > sram_limit(info))
    in.fail(where, JsonFields::out_of_range("sram", e.sram_bytes, sram_allowed(info)));
  if (e.kind == EventKind::line) {
    if (e.line < 0) in.fail(where, JsonFields::out_of_range("line", e.line, JsonFields::integer_range(0, kIntMax)));
    return;
  }
  if (e.kind == EventKind::ring_step) {
    if (info.devices < 1) in.fail(where, "a ring_step event in a trace without devices; allowed: ring steps in a ring's trace only");
    for (const auto& [name, value] : {std::pair{"step", e.step}, std::pair{"device", e.device}, std::pair{"block", e.block}}) {
      if (value < 0 || value >= info.devices)
        in.fail(where, JsonFields::out_of_range(name, value, JsonFields::integer_range(0, info.devices - 1) + " (the ring's devices)"));
    }
    return;
  }
  check_ranges(in, e, info, where);
  const std::int64_t most_bytes = e.elements() * kMaxTraceElementBytes;
  if (e.bytes < 0 || e.bytes > most_bytes)
    in.fail(where, JsonFields::out_of_range("bytes", e.bytes, JsonFields::integer_range(0, most_bytes) + " " + bytes_note()));
  if (!e.values.empty() && static_cast<std::int64_t>(e.values.size()) != e.elements())
    in.fail(where, "field 'values' holds " + std::to_string(e.values.size()) + " numbers for a " +
                       std::to_string(e.rows.size) + " x " + std::to_string(e.cols.size) + " tile");
  const std::pair<const char*, const std::vector<float>*> statistics[] = {
      {"row_max", &e.row_max}, {"row_sum", &e.row_sum}, {"rescale", &e.rescale}};
  const bool any = !e.row_max.empty() || !e.row_sum.empty() || !e.rescale.empty();
  if (any && e.kind != EventKind::softmax_update)
    in.fail(where, std::string("a ") + to_string(e.kind) + " event holds softmax statistics; allowed: softmax updates only");
  for (const auto& [name, values] : statistics) {
    if (!any) break;
    if (values->empty() && e.rows.size > 0)
      in.fail(where, std::string("field '") + name +
                         "' is missing; allowed: row_max, row_sum and rescale together (data runs), or none");
    if (static_cast<int>(values->size()) != e.rows.size)
      in.fail(where, std::string("field '") + name + "' holds " + std::to_string(values->size()) +
                         " rows for a block of " + std::to_string(e.rows.size) + " rows");
  }
}

// The loader's refusals are TraceFormatErrors, whichever check made them.
template <class Read>
auto as_format_error(Read read) {
  try {
    return read();
  } catch (const TraceFormatError&) {
    throw;
  } catch (const JsonInputError& error) {
    throw TraceFormatError(error.what());
  }
}

void check_trace(const Trace& trace, const std::string& source) {
  const JsonFields in(source);
  const TraceInfo& info = trace.info;
  try {
    trace_problem(info).validate();
  } catch (const std::invalid_argument& error) {
    in.fail("problem", error.what());
  }
  for (const auto& [name, value] : {std::pair{"block_rows", info.block_rows}, std::pair{"block_cols", info.block_cols}}) {
    if (value < 1) in.fail("top level", JsonFields::out_of_range(name, value, JsonFields::integer_range(1, kIntMax)));
  }
  if (info.devices < 0 || info.devices > kMaxRingDevices)
    in.fail("top level", JsonFields::out_of_range("devices", info.devices, JsonFields::integer_range(0, kMaxRingDevices)));
  if (info.sram_capacity_bytes < 0)
    in.fail("top level", JsonFields::out_of_range("sram_capacity_bytes", info.sram_capacity_bytes,
                                                  JsonFields::integer_range(0, std::numeric_limits<std::int64_t>::max())));
  if (trace.events.size() > static_cast<std::size_t>(kMaxTraceEvents))
    in.fail("events", std::to_string(trace.events.size()) + " events; allowed: at most " + std::to_string(kMaxTraceEvents));
  // The softmax panel reads the statistics of every update of a block: all carry them or none.
  const RecordedEvent* first_update = nullptr;
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    const RecordedEvent& e = trace.events[i];
    const std::string where = "event " + std::to_string(i);
    check_event(in, e, info, where);
    if (e.kind != EventKind::softmax_update || e.rows.size == 0) continue;
    if (!first_update) {
      first_update = &e;
    } else if (first_update->row_max.empty() != e.row_max.empty()) {
      in.fail(where, std::string("a softmax update ") + (e.row_max.empty() ? "without" : "with") +
                         " statistics after one " + (e.row_max.empty() ? "with" : "without") +
                         "; allowed: statistics on every softmax update (data runs) or on none");
    }
  }
}

}  // namespace

void validate_trace(const Trace& trace, const std::string& source) {
  as_format_error([&] { check_trace(trace, source); });
}

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
  if (info.devices > 0) j["devices"] = info.devices;
  json events = json::array();
  for (const RecordedEvent& e : trace.events) events.push_back(event_to_json(e));
  j["events"] = std::move(events);
  return j.dump(indent);
}

Trace trace_from_json_text(const std::string& text, const std::string& source) {
  return as_format_error([&] {
    const json j = parse_json_input(text, source);
    const Reader in(source);
    if (!j.is_object() || !j.contains("format") || j["format"] != kTraceFormatName)
      in.fail("top level", std::string("not a FlashLab trace (expected \"format\": \"") + kTraceFormatName + "\")");
    in.version(j, "top level", "trace", kTraceFormatVersion, "record the trace again with this build");

    Trace trace;
    TraceInfo& info = trace.info;
    info.schedule = in.text(j, "schedule", "top level");
    const json& problem = in.field(j, "problem", "top level");
    info.seqlen_q = in.small_integer(problem, "seqlen_q", "problem", 1);
    info.seqlen_k = in.small_integer(problem, "seqlen_k", "problem", 1);
    info.head_dim = in.small_integer(problem, "head_dim", "problem", 1);
    info.head_dim_v = in.small_integer(problem, "head_dim_v", "problem", 1);
    info.dtype = in.named(problem, "dtype", "problem", dtype_from_string);
    const json& mask = in.field(problem, "mask", "problem");
    info.mask.causal = in.boolean(mask, "causal", "problem.mask");
    const std::string alignment = in.text(mask, "alignment", "problem.mask");
    if (alignment != "top_left" && alignment != "bottom_right")
      in.fail("problem.mask", "alignment '" + alignment + "'; allowed: top_left, bottom_right");
    info.mask.alignment = alignment == "top_left" ? CausalAlignment::top_left : CausalAlignment::bottom_right;
    info.mask.window_left = in.small_integer(mask, "window_left", "problem.mask");
    info.mask.window_right = in.small_integer(mask, "window_right", "problem.mask");
    info.sram_capacity_bytes = in.integer(j, "sram_capacity_bytes", "top level", 0, std::numeric_limits<std::int64_t>::max());
    info.block_rows = in.small_integer(j, "block_rows", "top level", 1);
    info.block_cols = in.small_integer(j, "block_cols", "top level", 1);
    if (j.contains("devices")) info.devices = static_cast<int>(in.integer(j, "devices", "top level", 1, kMaxRingDevices));

    const json& events = in.field(j, "events", "top level");
    if (!events.is_array()) in.fail("top level", JsonFields::out_of_range("events", events, "an array of events"));
    if (events.size() > static_cast<std::size_t>(kMaxTraceEvents))
      in.fail("events", std::to_string(events.size()) + " events; allowed: at most " + std::to_string(kMaxTraceEvents));
    trace.events.reserve(events.size());
    for (std::size_t i = 0; i < events.size(); ++i)
      trace.events.push_back(event_from_json(in, events[i], info, "event " + std::to_string(i)));
    check_trace(trace, source);
    return trace;
  });
}

void save_trace(const std::string& path, const Trace& trace) { write_output_file(path, trace_to_json_text(trace) + "\n"); }

Trace load_trace(const std::string& path) {
  const std::string source = "trace file " + path;
  const std::string text = as_format_error([&] { return read_input_file(path, kMaxTraceFileBytes, source); });
  return trace_from_json_text(text, source);
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

Problem trace_problem(const TraceInfo& info) {
  Problem problem;
  problem.seqlen_q = info.seqlen_q;
  problem.seqlen_k = info.seqlen_k;
  problem.head_dim = info.head_dim;
  problem.head_dim_v = info.head_dim_v;
  problem.dtype = info.dtype;
  problem.mask = info.mask;
  return problem;
}

}  // namespace flashlab
