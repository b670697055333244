// Fuzz target: a machine preset file as `--machine <path>` reads it (sim/machines.cpp:
// find_machine), then what the commands compute from a preset: the roofline of some counters,
// the kernel tilings its shared memory runs, and the preset written back as JSON and read again.
//
// find_machine may refuse a file only with std::invalid_argument (exit 2 in the CLI); any other
// exception escapes and is a finding, as are crashes, sanitizer reports (a float cast out of
// range among them), hangs and memory past -rss_limit_mb.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/tilings.hpp"
#include "sim/machines.hpp"

using namespace flashlab;

namespace {

// The preset goes through the file loader itself: one file per process, rewritten per input.
const std::string& preset_path() {
  static const std::string path = [] {
    const char* directory = std::getenv("TMPDIR");
    return std::string(directory != nullptr ? directory : "/tmp") + "/flashlab_fuzz_machine_" +
           std::to_string(::getpid()) + ".json";
  }();
  return path;
}

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_machine: %s\n", what);
  std::abort();
}

void use(const sim::Machine& machine) {
  Counters counters;
  counters.matmul_flops = 1 << 20, counters.exponentials = 1 << 12, counters.other_flops = 1 << 14;
  counters.tensor[0].hbm_read_bytes = 1 << 16;
  const sim::Roofline roofline = sim::roofline(counters, machine);
  if (!(roofline.seconds >= 0)) fail("a negative or NaN roofline time from an accepted preset");
  // kernel-tiles --machine: the tilings for the preset's shared memory per block.
  const std::int64_t int_max = std::numeric_limits<int>::max();
  (void)kernels::tilings_for_shared_limit(static_cast<int>(std::min(machine.sram_bytes, int_max)));
  // An accepted preset, written back, is accepted again with the same values.
  const sim::Machine again = sim::machine_from_json(sim::to_json(machine), "round trip");
  if (sim::to_json(again) != sim::to_json(machine)) fail("an accepted preset does not survive a round trip");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  {
    std::ofstream file(preset_path(), std::ios::binary | std::ios::trunc);
    file.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  sim::Machine machine;
  try {
    machine = sim::find_machine(preset_path());
  } catch (const std::invalid_argument&) {
    return 0;  // refused, naming the file and the field
  }
  use(machine);
  return 0;
}
