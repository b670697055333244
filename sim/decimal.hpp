// The one parser of numbers given as text (command-line options, the comma lists of a sweep, the
// number in a mask or an SRAM size): decimal only, with a range.
//
// Accepted: an optional '-', then "0" or a nonzero digit followed by digits; reals may add a
// fraction and an exponent ("0.25", ".5", "1e-3"). Refused: '+', spaces, base prefixes (0x10),
// leading zeros (010, which C would read as octal), inf and nan, and every value outside
// [low, high], including those beyond the type (2^64). A refusal is a std::invalid_argument
// naming the input and the allowed range: "--batch = 2147483648 is out of range; allowed:
// 1..1073741824".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace flashlab::sim {

std::int64_t parse_decimal(std::string_view text, std::string_view name, std::int64_t low, std::int64_t high);
std::uint64_t parse_decimal_unsigned(std::string_view text, std::string_view name, std::uint64_t low, std::uint64_t high);
// allowed: how the range reads in a refusal; empty: "low..high".
double parse_decimal_real(std::string_view text, std::string_view name, double low, double high,
                          std::string_view allowed = {});

// The parser for the type of a target variable (int, std::size_t, std::uint64_t, double, ...).
template <class Number>
Number parse_decimal_as(std::string_view text, std::string_view name, Number low, Number high) {
  if constexpr (std::is_floating_point_v<Number>) {
    return static_cast<Number>(parse_decimal_real(text, name, low, high));
  } else if constexpr (std::is_unsigned_v<Number>) {
    return static_cast<Number>(parse_decimal_unsigned(text, name, low, high));
  } else {
    return static_cast<Number>(parse_decimal(text, name, low, high));
  }
}

// "1..1073741824": an integer range as refusals and help texts write it.
template <class Integer>
std::string decimal_range(Integer low, Integer high) {
  static_assert(std::is_integral_v<Integer>);
  return std::to_string(low) + ".." + std::to_string(high);
}

}  // namespace flashlab::sim
