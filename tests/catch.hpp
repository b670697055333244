// Catch2 2 (Debian, CI) and Catch2 3 (the GPU machine) behind one include.
#pragma once
#include <string>
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#define FLASHLAB_CATCH2_MAJOR 3
#else
#include <catch2/catch.hpp>
#define FLASHLAB_CATCH2_MAJOR 2
#endif

namespace flashlab::testing {

// A matcher for "the text contains this substring", for CHECK_THROWS_WITH and CHECK_THAT.
// Catch2 2 calls it Catch::Matchers::Contains; Catch2 3 renamed it ContainsSubstring and gave
// the name Contains to the range matcher (which does not compile on an exception's message).
inline auto contains_text(const std::string& substring) {
#if FLASHLAB_CATCH2_MAJOR == 3
  return Catch::Matchers::ContainsSubstring(substring);
#else
  return Catch::Matchers::Contains(substring);
#endif
}

}  // namespace flashlab::testing
