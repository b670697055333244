#include "decimal.hpp"

#include <charconv>
#include <cstdio>
#include <stdexcept>
#include <system_error>

namespace flashlab::sim {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Digits from `at`, none of them a leading zero of a longer run; returns the end of the run.
std::size_t digit_run(std::string_view text, std::size_t at, bool& leading_zero) {
  std::size_t end = at;
  while (end < text.size() && is_digit(text[end])) ++end;
  leading_zero = end - at > 1 && text[at] == '0';
  return end;
}

// -?(0|[1-9][0-9]*)
bool well_formed_integer(std::string_view text) {
  const std::size_t start = !text.empty() && text[0] == '-' ? 1 : 0;
  bool leading_zero = false;
  const std::size_t end = digit_run(text, start, leading_zero);
  return end > start && end == text.size() && !leading_zero;
}

// -?(0|[1-9][0-9]*)?(\.[0-9]+)?([eE][-+]?[0-9]+)? with at least one digit before the exponent.
bool well_formed_real(std::string_view text) {
  std::size_t at = !text.empty() && text[0] == '-' ? 1 : 0;
  bool leading_zero = false;
  const std::size_t integer_end = digit_run(text, at, leading_zero);
  if (leading_zero) return false;
  bool any_digit = integer_end > at;
  at = integer_end;
  if (at < text.size() && text[at] == '.') {
    bool unused = false;
    const std::size_t fraction_end = digit_run(text, at + 1, unused);
    if (fraction_end == at + 1) return false;
    any_digit = true;
    at = fraction_end;
  }
  if (!any_digit) return false;
  if (at < text.size() && (text[at] == 'e' || text[at] == 'E')) {
    ++at;
    if (at < text.size() && (text[at] == '-' || text[at] == '+')) ++at;
    bool unused = false;
    const std::size_t exponent_end = digit_run(text, at, unused);
    if (exponent_end == at) return false;
    at = exponent_end;
  }
  return at == text.size();
}

[[noreturn]] void refuse(std::string_view text, std::string_view name, const char* problem, const std::string& allowed) {
  throw std::invalid_argument(std::string(name) + " = '" + std::string(text) + "' " + problem + "; allowed: " + allowed);
}

constexpr const char* kNotDecimal = "is not a decimal number (no '+', spaces, base prefix or leading zero)";
constexpr const char* kOutOfRange = "is out of range";

std::string real_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

}  // namespace

std::int64_t parse_decimal(std::string_view text, std::string_view name, std::int64_t low, std::int64_t high) {
  const std::string allowed = decimal_range(low, high);
  if (!well_formed_integer(text)) refuse(text, name, kNotDecimal, allowed);
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error == std::errc::result_out_of_range || value < low || value > high) refuse(text, name, kOutOfRange, allowed);
  if (error != std::errc() || end != text.data() + text.size()) refuse(text, name, kNotDecimal, allowed);
  return value;
}

std::uint64_t parse_decimal_unsigned(std::string_view text, std::string_view name, std::uint64_t low, std::uint64_t high) {
  const std::string allowed = decimal_range(low, high);
  if (!well_formed_integer(text)) refuse(text, name, kNotDecimal, allowed);
  if (text[0] == '-') refuse(text, name, kOutOfRange, allowed);  // a sign where none is allowed
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error == std::errc::result_out_of_range || value < low || value > high) refuse(text, name, kOutOfRange, allowed);
  if (error != std::errc() || end != text.data() + text.size()) refuse(text, name, kNotDecimal, allowed);
  return value;
}

double parse_decimal_real(std::string_view text, std::string_view name, double low, double high, std::string_view allowed) {
  const std::string range = allowed.empty() ? real_text(low) + ".." + real_text(high) : std::string(allowed);
  if (!well_formed_real(text)) refuse(text, name, kNotDecimal, range);
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value, std::chars_format::general);
  if (error == std::errc::result_out_of_range || !(value >= low && value <= high)) refuse(text, name, kOutOfRange, range);
  if (error != std::errc() || end != text.data() + text.size()) refuse(text, name, kNotDecimal, range);
  return value;
}

}  // namespace flashlab::sim
