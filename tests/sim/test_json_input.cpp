// JSON input as untrusted input: the machine-preset loader and the typed-field helper both
// loaders use (sim/json_input.hpp). Numbers no field can hold (1e999, 1e300 for an integer),
// non-integers where integers are required (0.5) and versions like 1.9 are refused naming the
// file, the field and what is allowed; the trace loader's side is in tests/viz.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "catch.hpp"
#include "sim/json_input.hpp"
#include "sim/machines.hpp"

using namespace flashlab;
using namespace flashlab::sim;
using flashlab::testing::contains_text;

namespace {

// A preset file with one value spelled out by hand (JSON that no json value can hold: 1e999).
std::string write_preset(const std::string& name, const std::string& field, const std::string& raw_value) {
  nlohmann::json preset = to_json(default_machine());
  preset[field] = "@RAW@";
  std::string text = preset.dump();
  text.replace(text.find("\"@RAW@\""), 7, raw_value);
  std::ofstream(name) << text;
  return name;
}

std::string refusal_of_preset(const std::string& field, const std::string& raw_value) {
  const std::string path = write_preset("test_json_input_preset.json", field, raw_value);
  std::string message = "(accepted)";
  try {
    find_machine(path);
  } catch (const std::invalid_argument& error) {
    message = error.what();
  }
  std::remove(path.c_str());
  return message;
}

}  // namespace

TEST_CASE("a preset's numbers that do not fit their field are refused by name", "[sim][machines][json]") {
  struct Case {
    const char* field;
    const char* raw;
    const char* expected;
  };
  const Case cases[] = {
      {"sram_bytes", "1e999", "test_json_input_preset.json: sram_bytes: the number 1e999 is out of range"},
      {"hbm_bytes_per_second", "-1e999", "hbm_bytes_per_second: the number -1e999 is out of range"},
      {"sram_bytes", "1e300", "field 'sram_bytes' = 1e+300; allowed: an integer in 1 .. 1073741824"},
      {"sram_bytes", "0.5", "field 'sram_bytes' = 0.5; allowed: an integer in 1 .. 1073741824"},
      {"sram_bytes", "232448.5", "field 'sram_bytes' = 232448.5; allowed: an integer in 1"},
      {"sram_bytes", "18446744073709551615", "field 'sram_bytes' = 18446744073709551615; allowed: an integer in 1"},
      {"sram_bytes", "-9223372036854775808", "field 'sram_bytes' = -9223372036854775808; allowed: an integer in 1"},
      {"sram_bytes", "\"228K\"", "field 'sram_bytes' = \"228K\"; allowed: an integer in 1"},
      {"version", "1.9", "machine preset format version 1.9; this build reads version 1"},
      {"version", "2", "machine preset format version 2; this build reads version 1"},
      {"version", "\"1\"", "machine preset format version \"1\"; this build reads version 1"},
      {"exp_per_second", "0", "field 'exp_per_second' = 0; allowed: > 0, finite"},
      {"name", "7", "field 'name' = 7; allowed: a string"},
  };
  for (const Case& c : cases) {
    const std::string message = refusal_of_preset(c.field, c.raw);
    INFO(c.field << " = " << c.raw << ": " << message);
    CHECK(message.find("machine file test_json_input_preset.json") != std::string::npos);
    CHECK(message.find(c.expected) != std::string::npos);
  }
  // Whole numbers written as floats are the same numbers.
  CHECK(refusal_of_preset("sram_bytes", "2.32448e5") == "(accepted)");
  CHECK(refusal_of_preset("version", "1.0") == "(accepted)");
}

TEST_CASE("a preset file that is no JSON, too large, or a directory is refused by name", "[sim][machines][json]") {
  const std::string path = "test_json_input_broken.json";
  std::ofstream(path) << "{\"format\": \"flashlab-machine\", \"version\": 1, \"key\": }";
  CHECK_THROWS_WITH(find_machine(path), contains_text("machine file " + path + ": not valid JSON at byte") &&
                                            contains_text("in key"));
  std::filesystem::resize_file(path, (1 << 20) + 1);
  CHECK_THROWS_WITH(find_machine(path), contains_text("machine file " + path + " holds 1048577 bytes; allowed: at most"));
  std::remove(path.c_str());
  std::filesystem::create_directory("test_json_input_dir.json");
  CHECK_THROWS_WITH(find_machine("test_json_input_dir.json"), contains_text("test_json_input_dir.json is a directory"));
  std::filesystem::remove("test_json_input_dir.json");
}

TEST_CASE("exact_integer: whole numbers of any JSON spelling, nothing else", "[sim][json]") {
  using nlohmann::json;
  CHECK(exact_integer(json(7)) == 7);
  CHECK(exact_integer(json(7.0)) == 7);
  CHECK(exact_integer(json(-9223372036854775807LL - 1)) == std::numeric_limits<std::int64_t>::min());
  CHECK(exact_integer(json(-9223372036854775808.0)) == std::numeric_limits<std::int64_t>::min());
  CHECK_FALSE(exact_integer(json(9223372036854775808.0)));  // 2^63: one past int64
  CHECK_FALSE(exact_integer(json(18446744073709551615ULL)));
  CHECK_FALSE(exact_integer(json(0.5)));
  CHECK_FALSE(exact_integer(json(1e300)));
  CHECK_FALSE(exact_integer(json(std::numeric_limits<double>::infinity())));
  CHECK_FALSE(exact_integer(json(std::numeric_limits<double>::quiet_NaN())));
  CHECK_FALSE(exact_integer(json("7")));
  CHECK_FALSE(exact_integer(json(true)));
}

TEST_CASE("JsonFields: each refusal names the input, the place, the field and the range", "[sim][json]") {
  const JsonFields in("input x.json");
  const nlohmann::json object = nlohmann::json::parse(R"({"n": 12, "big": 1e300, "half": 0.5, "word": "w", "yes": true})");
  CHECK(in.integer(object, "n", "header", 1, 16) == 12);
  CHECK_THROWS_WITH(in.integer(object, "n", "header", 1, 8),
                    contains_text("input x.json: header: field 'n' = 12; allowed: an integer in 1 .. 8"));
  CHECK_THROWS_WITH(in.integer(object, "big", "", 0, std::numeric_limits<std::int64_t>::max()),
                    contains_text("input x.json: field 'big' = 1e+300; allowed: an integer >= 0"));
  CHECK_THROWS_WITH(in.integer(object, "half", "", 0, 1, "(M)"), contains_text("allowed: an integer in 0 .. 1 (M)"));
  CHECK_THROWS_WITH(in.integer(object, "missing", "event 3", 0, 1), contains_text("event 3: field 'missing' is missing"));
  CHECK_THROWS_WITH(in.text(object, "n", ""), contains_text("field 'n' = 12; allowed: a string"));
  CHECK_THROWS_WITH(in.boolean(object, "word", ""), contains_text("field 'word' = \"w\"; allowed: true or false"));
  CHECK(in.boolean(object, "yes", ""));
  CHECK_THROWS_AS(in.integer(object, "n", "", 0, 1), JsonInputError);
  // A long value is cut short: a refusal stays one line of reasonable length.
  const nlohmann::json long_value = {{"v", std::string(10'000, 'a')}};
  try {
    in.integer(long_value, "v", "", 0, 1);
    FAIL("accepted");
  } catch (const JsonInputError& error) {
    CHECK(std::string(error.what()).size() < 200);
  }
}

TEST_CASE("parse_json_input names the field where parsing stopped", "[sim][json]") {
  CHECK(parse_json_input(R"({"a": [1, 2]})", "t")["a"][1] == 2);
  CHECK_THROWS_WITH(parse_json_input(R"({"a": {"b": [0, 1, 1e999]}})", "t"),
                    contains_text("t: a.b[2]: the number 1e999 is out of range"));
  CHECK_THROWS_WITH(parse_json_input(R"({"a": [{"x": 1}, {"y": tru}]})", "t"),
                    contains_text("t: not valid JSON at byte") && contains_text("in a[1].y"));
  CHECK_THROWS_WITH(parse_json_input("", "t"), contains_text("t: not valid JSON at byte"));
  CHECK_THROWS_AS(parse_json_input("[1e999]", "t"), JsonInputError);
}
