// The flashlab command line as a function (sim/cli/main.cpp), so that a harness can run it in
// the same process: fuzz/fuzz_cli.cpp feeds it argument vectors built from fuzzer input.
#pragma once

namespace flashlab::cli {

// run: the whole command. checks_only: everything a command does with its input (parsing,
// validation, machine presets looked up, output paths checked) and nothing after: it returns 0
// where the work would begin, before any output is written.
enum class Mode { run, checks_only };

// The flashlab program: returns its exit status (0 done, 1 a check failed, 2 bad input, 3 an
// internal error).
int run(int argc, char** argv, Mode mode = Mode::run);

}  // namespace flashlab::cli
