// Fuzz target: the flashlab command line (sim/cli/main.cpp) on argument vectors, in the mode
// that runs every check of a command's input and stops where its work would begin
// (cli::Mode::checks_only: nothing is computed at length and no file is written).
//
// Input: one argument per line ("run\n--seqlen\n4096\n"); "flashlab" is prepended. The exit
// status must be 0 (accepted), 1 (a command's own check failed) or 2 (bad input, one line on
// stderr); 3 (an internal error, an exception nobody named) is a finding, as are crashes,
// sanitizer reports, hangs and memory past -rss_limit_mb.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <streambuf>
#include <string>
#include <vector>

#include "sim/cli/cli.hpp"

namespace {

// Swallows what the program prints, so the fuzzer's own output stays readable; ASan and UBSan
// write to the stderr file descriptor directly and are unaffected. FLASHLAB_FUZZ_VERBOSE=1
// keeps the output (to see why an input was refused).
class NullBuffer : public std::streambuf {
 protected:
  int overflow(int character) override { return character; }
};

bool verbose() {
  static const bool value = std::getenv("FLASHLAB_FUZZ_VERBOSE") != nullptr;
  return value;
}

std::vector<std::string> arguments_of(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> arguments = {"flashlab"};
  std::string current;
  for (std::size_t i = 0; i < size; ++i) {
    const char character = static_cast<char>(data[i]);
    if (character == '\n') {
      arguments.push_back(current);
      current.clear();
    } else {
      current += character;
    }
  }
  if (!current.empty()) arguments.push_back(current);
  return arguments;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> arguments = arguments_of(data, size);
  std::vector<char*> argv;
  for (std::string& argument : arguments) argv.push_back(argument.data());
  argv.push_back(nullptr);

  static NullBuffer null_buffer;
  std::streambuf* const out = std::cout.rdbuf();
  std::streambuf* const err = std::cerr.rdbuf();
  if (!verbose()) std::cout.rdbuf(&null_buffer), std::cerr.rdbuf(&null_buffer);
  const int status = flashlab::cli::run(static_cast<int>(arguments.size()), argv.data(), flashlab::cli::Mode::checks_only);
  std::cout.rdbuf(out), std::cerr.rdbuf(err);

  if (status < 0 || status > 2) {
    std::fprintf(stderr, "fuzz_cli: exit status %d (an internal error); run with FLASHLAB_FUZZ_VERBOSE=1 to see it\n", status);
    std::abort();
  }
  return 0;
}
