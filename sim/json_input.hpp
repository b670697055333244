// JSON input files (machine presets, traces) read as untrusted input: a bounded read, a parse
// that says where it failed, and typed fields with range checks. Every error names the input,
// the place in it, the field, the value found and what is allowed.
//
//   const std::string text = read_input_file(path, kMaxBytes, "machine file " + path);
//   const nlohmann::json json = parse_json_input(text, "machine file " + path);
//   const JsonFields in("machine file " + path);
//   const std::int64_t sram = in.integer(json, "sram_bytes", "", 1, kMaxSram);
//
// nlohmann::json holds any JSON number as int64, uint64 or double; these checks stand between
// it and the program's types, so that 1e300 never becomes INT64_MIN, 0.5 never becomes 0 and a
// version 1.9 is never read as 1.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace flashlab {

// An input file that cannot be read or does not hold what is expected. Bad input: the CLI
// answers it with one line and exit status 2.
class JsonInputError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The whole file at `path`, at most max_bytes of it: a larger regular file is refused before it
// is read, a pipe or device once max_bytes have arrived. A directory or a file that cannot be
// opened is refused too. `source` names the input in errors ("trace file fa2.json").
std::string read_input_file(const std::string& path, std::int64_t max_bytes, const std::string& source);

// Parses JSON text. A syntax error, or a number no double can hold (1e999, which is valid JSON),
// is refused naming the byte and the field being read there ("events[12].bytes").
nlohmann::json parse_json_input(const std::string& text, const std::string& source);

// The exact integer a JSON number holds (1 and 1.0 alike), or nothing: not a number, not whole
// (0.5, 1.9) or outside int64 (1e300).
std::optional<std::int64_t> exact_integer(const nlohmann::json& value);

// Typed fields of one input. `where` is the place in it ("event 12", "problem.mask"; empty for
// the top of a flat file); messages read "<source>: <where>: field 'name' = value; allowed: ...".
class JsonFields {
 public:
  explicit JsonFields(std::string source) : source_(std::move(source)) {}

  const std::string& source() const { return source_; }
  [[noreturn]] void fail(const std::string& where, const std::string& what) const;

  // The field, or a refusal that names it as missing; `object` must be a JSON object.
  const nlohmann::json& field(const nlohmann::json& object, const char* name, const std::string& where) const;
  // An integer in [low, high]; note (optional) says what the bound is, e.g. "(M)".
  std::int64_t integer(const nlohmann::json& object, const char* name, const std::string& where, std::int64_t low,
                       std::int64_t high, const std::string& note = "") const;
  // A finite number > 0.
  double positive_number(const nlohmann::json& object, const char* name, const std::string& where) const;
  std::string text(const nlohmann::json& object, const char* name, const std::string& where) const;
  bool boolean(const nlohmann::json& object, const char* name, const std::string& where) const;
  // The field "version" of a format this build reads exactly one version of; `noun` names the
  // format in the refusal ("trace"), `advice` follows it.
  void version(const nlohmann::json& object, const std::string& where, const std::string& noun, int expected,
               const std::string& advice = "") const;

  // A value as a refusal shows it: its JSON, cut short when long.
  static std::string shown(const nlohmann::json& value);
  // The text of a refusal "field 'name' = value; allowed: ...".
  static std::string out_of_range(const char* name, const nlohmann::json& value, const std::string& allowed);
  // "an integer in low .. high" (or ">= low" when high is int64's maximum).
  static std::string integer_range(std::int64_t low, std::int64_t high);

 private:
  std::string source_;
};

}  // namespace flashlab
