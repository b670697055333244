#include "json_input.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

namespace flashlab {

using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Reading

std::string read_input_file(const std::string& path, std::int64_t max_bytes, const std::string& source) {
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (std::filesystem::is_directory(status)) throw JsonInputError(source + " is a directory");
  if (std::filesystem::is_regular_file(status)) {
    const auto size = std::filesystem::file_size(path, error);
    if (!error && size > static_cast<std::uintmax_t>(max_bytes))
      throw JsonInputError(source + " holds " + std::to_string(size) + " bytes; allowed: at most " +
                           std::to_string(max_bytes) + " bytes");
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) throw JsonInputError("cannot open " + source + " (" + std::strerror(errno) + ")");
  // Read in chunks, so that a pipe or a device (/dev/zero) stops at the limit too.
  std::string text;
  std::vector<char> chunk(1 << 16);
  while (file) {
    file.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    text.append(chunk.data(), static_cast<std::size_t>(file.gcount()));
    if (static_cast<std::int64_t>(text.size()) > max_bytes)
      throw JsonInputError(source + " holds more than " + std::to_string(max_bytes) + " bytes; allowed: at most " +
                           std::to_string(max_bytes) + " bytes");
  }
  if (file.bad()) throw JsonInputError(source + " cannot be read");
  return text;
}

// ---------------------------------------------------------------------------------------------
// Parsing

namespace {

// Follows a parse to where it fails: the path of the value being read ("events[12].bytes").
// Used only after json::parse has failed, so a good file is parsed once.
class FailureLocator : public nlohmann::json_sax<json> {
 public:
  std::string path() const {
    std::string text;
    for (const Level& level : levels_) {
      if (level.array) {
        text += "[" + std::to_string(level.index) + "]";
      } else if (!level.key.empty()) {
        text += (text.empty() ? "" : ".") + level.key;
      }
    }
    return text;
  }
  std::size_t byte = 0;
  std::string token, reason;
  bool number_overflow = false;

  bool null() override { return element_done(); }
  bool boolean(bool) override { return element_done(); }
  bool number_integer(number_integer_t) override { return element_done(); }
  bool number_unsigned(number_unsigned_t) override { return element_done(); }
  bool number_float(number_float_t, const string_t&) override { return element_done(); }
  bool string(string_t&) override { return element_done(); }
  bool binary(binary_t&) override { return element_done(); }
  bool start_object(std::size_t) override {
    levels_.push_back({false, "", 0});
    return true;
  }
  bool key(string_t& name) override {
    levels_.back().key = name;
    return true;
  }
  bool end_object() override { return end_container(); }
  bool start_array(std::size_t) override {
    levels_.push_back({true, "", 0});
    return true;
  }
  bool end_array() override { return end_container(); }
  bool parse_error(std::size_t position, const std::string& last_token, const nlohmann::detail::exception& error) override {
    byte = position;
    token = last_token;
    reason = error.what();
    // nlohmann's messages start "[json.exception.parse_error.101] "; the id says nothing to a reader.
    if (const auto close = reason.find("] "); reason.starts_with("[json.exception.") && close != std::string::npos)
      reason.erase(0, close + 2);
    number_overflow = error.id == 406;
    return false;
  }

 private:
  struct Level {
    bool array;
    std::string key;    // object: the key being read
    std::size_t index;  // array: the element being read
  };
  bool element_done() {
    if (!levels_.empty() && levels_.back().array) ++levels_.back().index;
    return true;
  }
  bool end_container() {
    levels_.pop_back();
    return element_done();
  }
  std::vector<Level> levels_;
};

}  // namespace

json parse_json_input(const std::string& text, const std::string& source) {
  try {
    return json::parse(text);
  } catch (const json::exception&) {
    // Parse again to say where: nlohmann's exception names a byte, not a field.
  }
  FailureLocator locator;
  json::sax_parse(text, &locator);
  const std::string path = locator.path();
  if (locator.number_overflow)
    throw JsonInputError(source + ": " + (path.empty() ? "top level" : path) + ": the number " + locator.token +
                         " is out of range (no double holds it); allowed: finite numbers");
  throw JsonInputError(source + ": not valid JSON at byte " + std::to_string(locator.byte) +
                       (path.empty() ? "" : ", in " + path) + " (" + locator.reason + ")");
}

// ---------------------------------------------------------------------------------------------
// Typed fields

std::optional<std::int64_t> exact_integer(const json& value) {
  if (value.is_number_integer()) {
    if (value.is_number_unsigned() && value.get<std::uint64_t>() > std::numeric_limits<std::int64_t>::max())
      return std::nullopt;
    return value.get<std::int64_t>();
  }
  if (!value.is_number_float()) return std::nullopt;
  const double number = value.get<double>();
  // -2^63 and 2^63 are exact doubles: inside [-2^63, 2^63) the cast is defined.
  constexpr double kTwoTo63 = 9223372036854775808.0;
  if (!(number >= -kTwoTo63 && number < kTwoTo63) || number != std::trunc(number)) return std::nullopt;
  return static_cast<std::int64_t>(number);
}

void JsonFields::fail(const std::string& where, const std::string& what) const {
  throw JsonInputError(source_ + ": " + (where.empty() ? "" : where + ": ") + what);
}

const json& JsonFields::field(const json& object, const char* name, const std::string& where) const {
  if (!object.is_object()) fail(where, "expected a JSON object, found " + std::string(object.type_name()));
  const auto it = object.find(name);
  if (it == object.end()) fail(where, std::string("field '") + name + "' is missing");
  return *it;
}

std::string JsonFields::shown(const json& value) {
  constexpr std::size_t kShownChars = 60;  // a refusal stays one short line, whatever the value
  std::string text = value.dump();
  if (text.size() > kShownChars) text = text.substr(0, kShownChars - 3) + "...";
  return text;
}

std::string JsonFields::out_of_range(const char* name, const json& value, const std::string& allowed) {
  return std::string("field '") + name + "' = " + shown(value) + "; allowed: " + allowed;
}

std::string JsonFields::integer_range(std::int64_t low, std::int64_t high) {
  if (high == std::numeric_limits<std::int64_t>::max()) return "an integer >= " + std::to_string(low);
  return "an integer in " + std::to_string(low) + " .. " + std::to_string(high);
}

std::int64_t JsonFields::integer(const json& object, const char* name, const std::string& where, std::int64_t low,
                                 std::int64_t high, const std::string& note) const {
  const json& value = field(object, name, where);
  const std::optional<std::int64_t> number = exact_integer(value);
  if (!number || *number < low || *number > high)
    fail(where, out_of_range(name, value, integer_range(low, high) + (note.empty() ? "" : " " + note)));
  return *number;
}

double JsonFields::positive_number(const json& object, const char* name, const std::string& where) const {
  const json& value = field(object, name, where);
  if (!value.is_number() || !(value.get<double>() > 0) || !std::isfinite(value.get<double>()))
    fail(where, out_of_range(name, value, "> 0, finite"));
  return value.get<double>();
}

std::string JsonFields::text(const json& object, const char* name, const std::string& where) const {
  const json& value = field(object, name, where);
  if (!value.is_string()) fail(where, out_of_range(name, value, "a string"));
  return value.get<std::string>();
}

bool JsonFields::boolean(const json& object, const char* name, const std::string& where) const {
  const json& value = field(object, name, where);
  if (!value.is_boolean()) fail(where, out_of_range(name, value, "true or false"));
  return value.get<bool>();
}

void JsonFields::version(const json& object, const std::string& where, const std::string& noun, int expected,
                         const std::string& advice) const {
  const json& value = field(object, "version", where);
  if (exact_integer(value) != expected)
    fail(where, noun + " format version " + shown(value) + "; this build reads version " + std::to_string(expected) +
                    (advice.empty() ? "" : " (" + advice + ")"));
}

}  // namespace flashlab
