// Checked integer arithmetic for sizes and counts. A product of dimensions, a tensor's size or a
// counter that leaves its type is refused with a SizeOverflow naming the quantity and the range,
// never wrapped: a wrapped count would go on to agree with a wrapped closed form. Every size
// product and counter of FlashLab is formed through these (host code only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

namespace flashlab {

// A size or count that does not fit its type. The input that made it that large is the
// caller's, so it is an invalid_argument: the command lines answer it with exit status 2.
class SizeOverflow : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

namespace checked_detail {

[[noreturn]] inline void refuse(const char* quantity, std::int64_t a, const char* operation, std::int64_t b,
                                const char* range) {
  throw SizeOverflow(std::string(quantity) + " = " + std::to_string(a) + " " + operation + " " + std::to_string(b) +
                     " is out of range; allowed: " + range);
}

inline constexpr const char* kInt64Range = "at most 9223372036854775807 (int64)";

}  // namespace checked_detail

// a + b and a * b in int64, or a SizeOverflow naming `quantity`.
inline std::int64_t checked_add(std::int64_t a, std::int64_t b, const char* quantity) {
  std::int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) [[unlikely]] {
    checked_detail::refuse(quantity, a, "+", b, checked_detail::kInt64Range);
  }
  return sum;
}

inline std::int64_t checked_mul(std::int64_t a, std::int64_t b, const char* quantity) {
  std::int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) [[unlikely]] {
    checked_detail::refuse(quantity, a, "x", b, checked_detail::kInt64Range);
  }
  return product;
}

// a + b, or the int64 maximum when it would leave int64: for upper bounds held to a limit,
// where "more than int64" is just "over the limit".
inline std::int64_t saturating_add(std::int64_t a, std::int64_t b) {
  std::int64_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? std::numeric_limits<std::int64_t>::max() : sum;
}

// counter += amount, checked: the simulator's counters.
inline void checked_accumulate(std::int64_t& counter, std::int64_t amount, const char* quantity) {
  counter = checked_add(counter, amount, quantity);
}

// The product of every factor, checked at each step ("rows x heads x dim").
template <class... Factors>
std::int64_t checked_product(const char* quantity, std::int64_t first, Factors... rest) {
  std::int64_t product = first;
  ((product = checked_mul(product, static_cast<std::int64_t>(rest), quantity)), ...);
  return product;
}

// An int64 whose + - * are checked, so that a formula of sizes (a closed form, a working set)
// reads as written and still cannot wrap. Mixes with plain integers; .value() leaves it.
class CheckedInt64 {
 public:
  constexpr CheckedInt64(std::int64_t value = 0) : value_(value) {}  // NOLINT: implicit on purpose
  constexpr std::int64_t value() const { return value_; }

  friend CheckedInt64 operator+(CheckedInt64 a, CheckedInt64 b) { return checked_add(a.value_, b.value_, kQuantity); }
  friend CheckedInt64 operator*(CheckedInt64 a, CheckedInt64 b) { return checked_mul(a.value_, b.value_, kQuantity); }
  friend CheckedInt64 operator-(CheckedInt64 a, CheckedInt64 b) {
    std::int64_t difference = 0;
    if (__builtin_sub_overflow(a.value_, b.value_, &difference)) [[unlikely]] {
      checked_detail::refuse(kQuantity, a.value_, "-", b.value_, checked_detail::kInt64Range);
    }
    return difference;
  }
  friend CheckedInt64 operator/(CheckedInt64 a, CheckedInt64 b) { return a.value_ / b.value_; }  // sizes: b > 0
  CheckedInt64& operator+=(CheckedInt64 other) { return *this = *this + other; }
  friend constexpr auto operator<=>(CheckedInt64, CheckedInt64) = default;
  friend constexpr bool operator==(CheckedInt64, CheckedInt64) = default;

 private:
  static constexpr const char* kQuantity = "a size or count";
  std::int64_t value_;
};

// A count narrowed to int (rows, lengths and block sizes are int): refused when it does not fit.
inline int checked_int(std::int64_t value, const char* quantity) {
  if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) [[unlikely]] {
    throw SizeOverflow(std::string(quantity) + " = " + std::to_string(value) +
                       " is out of range; allowed: -2147483648..2147483647 (int)");
  }
  return static_cast<int>(value);
}

// A non-negative element or byte count as a size_t (for allocation).
inline std::size_t checked_size(std::int64_t value, const char* quantity) {
  if (value < 0) [[unlikely]] {
    throw SizeOverflow(std::string(quantity) + " = " + std::to_string(value) + " is out of range; allowed: >= 0");
  }
  return static_cast<std::size_t>(value);
}

}  // namespace flashlab
