// Sweeps counted on several threads equal the serial sweep point for point, in the same order;
// the progress callback and the progress lines behave as sim/sweep.hpp and sim/progress.hpp say.
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"
#include "sim/progress.hpp"
#include "sim/sweep.hpp"

using namespace flashlab;
using namespace flashlab::sim;
using flashlab::testing::contains_text;

namespace {

SweepGrid mixed_grid() {
  SweepGrid grid;
  grid.schedules = {"standard", "fa1", "fa2", "square_tiling", "block_sparse"};
  grid.seqlens = {129, 513};
  grid.head_dims = {64, 128};
  grid.sram_bytes = {1024, 96 * 1024};  // 1 KiB: some points do not fit
  grid.masks = {"none", "causal", "sparse:0.5"};
  return grid;
}

// The JSON without the per-point wall times, the only field that may differ between runs.
nlohmann::json without_seconds(nlohmann::json json) {
  for (nlohmann::json& point : json["points"]) point.erase("seconds");
  return json;
}

}  // namespace

TEST_CASE("a sweep on 1, 2, 3 and 7 threads gives the serial result in the serial order", "[sim][sweep]") {
  const SweepGrid grid = mixed_grid();
  const std::vector<SweepPoint> serial = run_sweep(grid);
  REQUIRE(serial.size() == grid_points(grid).size());
  REQUIRE(std::any_of(serial.begin(), serial.end(), [](const SweepPoint& p) { return !p.fits; }));
  const nlohmann::json serial_json = without_seconds(sweep_to_json(grid, serial, fit_sweep(serial), nullptr, "c"));
  const std::string serial_csv = sweep_to_csv(serial, nullptr);
  for (int jobs : {1, 2, 3, 7}) {
    const std::vector<SweepPoint> parallel = run_sweep(grid, {}, jobs);
    REQUIRE(parallel.size() == serial.size());
    for (std::size_t i = 0; i < serial.size(); ++i) {
      INFO("jobs " << jobs << ", point " << i);
      CHECK(parallel[i].schedule == serial[i].schedule);
      CHECK(parallel[i].seqlen == serial[i].seqlen);
      CHECK(parallel[i].sram_bytes == serial[i].sram_bytes);
      CHECK(parallel[i].mask == serial[i].mask);
      CHECK(parallel[i].fits == serial[i].fits);
      CHECK(parallel[i].counters.tensor == serial[i].counters.tensor);
    }
    CHECK(without_seconds(sweep_to_json(grid, parallel, fit_sweep(parallel), nullptr, "c")) == serial_json);
    CHECK(sweep_to_csv(parallel, nullptr) == serial_csv);
  }
}

TEST_CASE("parallel progress: one call per point, done rising by one, from one thread at a time", "[sim][sweep]") {
  const SweepGrid grid = mixed_grid();
  std::vector<std::size_t> calls;  // unguarded on purpose: the callback is serialised by run_sweep
  run_sweep(grid, [&](std::size_t done, std::size_t total) {
    CHECK(total == grid_points(grid).size());
    calls.push_back(done);
  }, 4);
  REQUIRE(calls.size() == grid_points(grid).size());
  for (std::size_t i = 0; i < calls.size(); ++i) CHECK(calls[i] == i + 1);
}

TEST_CASE("a sweep refuses --jobs out of range, naming the range", "[sim][sweep]") {
  const SweepGrid grid = mixed_grid();
  CHECK_THROWS_WITH(run_sweep(grid, {}, 0), contains_text("--jobs = 0 is out of range; allowed: 1..256"));
  CHECK_THROWS_WITH(run_sweep(grid, {}, kMaxSweepJobs + 1), contains_text("--jobs = 257"));
  CHECK_NOTHROW(require_valid_jobs(kMaxSweepJobs));
}

TEST_CASE("a failing point stops a parallel count, and the failure reported is the first in grid order", "[sim][sweep]") {
  SweepGrid grid;
  grid.schedules = {"square_tiling"};
  grid.head_dims = {128};
  grid.sram_bytes = {16};  // 1 x 1 tiles: N = 16384 and 32768 are past the tile-step limit
  grid.seqlens = {128};
  // Not held to the limits first (count_points alone): the two large points throw while counting.
  const std::vector<PointSpec> specs{{"square_tiling", "none", 64, 128, 16},  {"square_tiling", "none", 128, 128, 16},
                                     {"square_tiling", "none", 16384, 128, 16}, {"square_tiling", "none", 96, 128, 16},
                                     {"square_tiling", "none", 32768, 128, 16}, {"square_tiling", "none", 32, 128, 16}};
  for (int jobs : {1, 2, 6}) {
    INFO("jobs " << jobs);
    CHECK_THROWS_WITH(count_points(grid, specs, jobs), contains_text("N 16384 x 16384"));
  }
}

TEST_CASE("progress lines: elapsed time and ETA, and off a terminal one line per whole percent", "[sim][sweep]") {
  CHECK(progress_text("sweep", 0, 8, 0) == "sweep: 0/8 points (0%), elapsed 0.00 s, ETA ?");
  CHECK(progress_text("sweep", 2, 8, 1.5) == "sweep: 2/8 points (25%), elapsed 1.50 s, ETA 4.50 s");
  CHECK(progress_text("sweep", 8, 8, 12.25) == "sweep: 8/8 points (100%), elapsed 12.2 s, ETA 0.00 s");

  std::ostringstream few;  // fewer points than 100: a line per point
  ProgressLine small(few, "sweep", false);
  for (std::size_t done = 1; done <= 7; ++done) small.update(done, 7, static_cast<double>(done));
  const std::string per_point = few.str();
  CHECK(std::count(per_point.begin(), per_point.end(), '\n') == 7);
  CHECK(per_point.find('\r') == std::string::npos);
  CHECK_THAT(per_point, contains_text("sweep: 7/7 points (100%), elapsed 7.00 s, ETA 0.00 s\n"));

  std::ostringstream many;  // 1000 points: a line per whole percent, 0% (the first point) to 100%
  ProgressLine large(many, "sweep", false);
  for (std::size_t done = 1; done <= 1000; ++done) large.update(done, 1000, 0.001 * static_cast<double>(done));
  const std::string text = many.str();
  CHECK(std::count(text.begin(), text.end(), '\n') == 101);
  CHECK_THAT(text, contains_text("sweep: 1/1000 points (0%)") && contains_text("sweep: 10/1000 points (1%)") && contains_text("sweep: 1000/1000 points (100%)"));

  std::ostringstream terminal;  // a terminal: one line rewritten, ended once
  ProgressLine live(terminal, "sweep", true);
  for (std::size_t done = 1; done <= 5; ++done) live.update(done, 5, 1.0);
  const std::string rewritten = terminal.str();
  CHECK(std::count(rewritten.begin(), rewritten.end(), '\r') == 5);
  CHECK(std::count(rewritten.begin(), rewritten.end(), '\n') == 1);
}
