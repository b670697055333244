// Numeric command-line options read by the one decimal parser (sim/decimal.hpp) instead of
// CLI11's own conversion, which reads 010 as octal and 0x10 as hex and wraps -1 into an
// unsigned. Every option states its range, and a refusal names the option and the range.
#pragma once

#include <CLI/CLI.hpp>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "sim/decimal.hpp"

namespace flashlab::sim {

// The long name of an option ("--seqlen" of "--seqlen,-n"), for refusals.
inline std::string long_option_name(const std::string& names) {
  const std::size_t start = names.find("--");
  const std::string name = start == std::string::npos ? names : names.substr(start);
  return name.substr(0, name.find(','));
}

template <class Integer>
CLI::Option* add_decimal_option(CLI::App& app, const std::string& names, Integer& target, const std::string& description,
                                Integer low, Integer high) {
  static_assert(std::is_integral_v<Integer>);
  const std::string name = long_option_name(names);
  auto parse = [&target, name, low, high](const CLI::results_t& results) {
    try {
      target = parse_decimal_as<Integer>(results.back(), name, low, high);
    } catch (const std::invalid_argument& error) {
      throw CLI::ValidationError(error.what());  // a parse error: one line, exit status 2
    }
    return true;
  };
  CLI::Option* option = app.add_option(names, CLI::callback_t(parse), description);
  // The range is the type's name, so that help and CLI11's own refusals (a missing value) say it.
  option->type_name("INT (allowed: " + decimal_range(low, high) + ")");
  option->expected(1)->multi_option_policy(CLI::MultiOptionPolicy::Throw);
  return option;
}

}  // namespace flashlab::sim
