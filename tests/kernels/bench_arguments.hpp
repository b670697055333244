// Command-line numbers for the kernel bench programs (test_fa2_backward_bench, fa2_forward_bench),
// checked before any CUDA call: a bad one is one line on stderr naming it and exit status 2.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace flashlab::bench {

// An integer in [low, high] at the start of `text`, followed by a comma (in a list) or the string's
// end; `text` moves up to that. False where there is none.
inline bool parse_int(const char*& text, int low, int high, int& value) {
  char* end = nullptr;
  errno = 0;
  const long parsed = std::strtol(text, &end, 10);
  if (end == text || errno != 0 || parsed < low || parsed > high || (*end != 0 && *end != ',')) return false;
  value = static_cast<int>(parsed);
  text = end;
  return true;
}

// One integer in [low, high] and nothing else.
inline bool parse_one(const char* text, int low, int high, int& value) {
  return parse_int(text, low, high, value) && *text == 0;
}

// A comma-separated list of integers in [low, high], at least one, no empty entry.
inline bool parse_list(const char* text, int low, int high, std::vector<int>& values) {
  values.clear();
  for (;;) {
    int value = 0;
    if (!parse_int(text, low, high, value)) return false;
    values.push_back(value);
    if (*text == 0) return true;
    ++text;  // the comma
  }
}

// "input = text; allowed: ..." on stderr; returns the exit status 2.
inline int refuse(const char* input, const char* text, const char* allowed) {
  std::fprintf(stderr, "%s = %s; allowed: %s\n", input, text, allowed);
  return 2;
}

}  // namespace flashlab::bench
