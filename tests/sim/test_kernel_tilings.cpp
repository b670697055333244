// The GPU kernels' tilings as the simulator and the notebooks read them (kernels/tilings.hpp):
// the exported list against the tile shapes worked out by hand from the kernels' rules (the
// kernels take theirs from the same constexpr, and static_assert that their shared-memory
// layout fills exactly the exported bytes), and the launchers' pick for a device's shared memory.
#include <string>
#include <tuple>
#include <vector>

#include "catch.hpp"
#include "kernels/03_fa3_sm90/backward_tiling.hpp"
#include "kernels/common/constants.hpp"
#include "kernels/tilings.hpp"

using flashlab::kernels::KernelTiling;
using flashlab::kernels::kAmpereSharedBytes;
using flashlab::kernels::kHopperSharedBytes;
using flashlab::kernels::kTuringSharedBytes;

namespace {

using Row = std::tuple<std::string, std::string, int, int, int, int, int, int, int>;

Row row(const KernelTiling& t) {
  return {t.generation, t.direction, t.head_dim, t.shared_budget, t.block_rows, t.block_cols, t.warps, t.stages,
          t.shared_bytes};
}

// Shared bytes: forward (B_r + 2 stages B_c) (d + 8) 2; backward K, V, two stages of Q and dO,
// P and dS, two stages of the LSE and D rows, plus the sm_90 dQ staging tile B_r d 4 where
// everything fits 227 KB.
const std::vector<Row>& expected_tilings() {
  static const std::vector<Row> rows = {
      {"fa1", "forward", 64, kTuringSharedBytes, 64, 64, 4, 1, 192 * 72 * 2},
      {"fa1", "forward", 128, kTuringSharedBytes, 64, 64, 4, 1, 192 * 136 * 2},
      {"fa2", "forward", 32, kHopperSharedBytes, 128, 128, 4, 3, (128 + 768) * 40 * 2},
      {"fa2", "forward", 32, kAmpereSharedBytes, 128, 128, 4, 3, (128 + 768) * 40 * 2},
      {"fa2", "forward", 64, kHopperSharedBytes, 128, 128, 4, 2, (128 + 512) * 72 * 2},
      {"fa2", "forward", 64, kAmpereSharedBytes, 128, 128, 4, 2, (128 + 512) * 72 * 2},
      {"fa2", "forward", 96, kHopperSharedBytes, 128, 64, 4, 2, (128 + 256) * 104 * 2},
      {"fa2", "forward", 96, kAmpereSharedBytes, 128, 64, 4, 2, (128 + 256) * 104 * 2},
      {"fa2", "forward", 128, kHopperSharedBytes, 128, 64, 4, 2, (128 + 256) * 136 * 2},
      {"fa2", "forward", 128, kAmpereSharedBytes, 128, 64, 4, 2, (128 + 256) * 136 * 2},
      {"fa2", "forward", 160, kHopperSharedBytes, 128, 64, 8, 2, (128 + 256) * 168 * 2},
      {"fa2", "forward", 160, kAmpereSharedBytes, 128, 64, 8, 2, (128 + 256) * 168 * 2},
      {"fa2", "forward", 192, kHopperSharedBytes, 128, 64, 8, 2, (128 + 256) * 200 * 2},
      {"fa2", "forward", 192, kAmpereSharedBytes, 128, 64, 8, 2, (128 + 256) * 200 * 2},
      {"fa2", "forward", 224, kHopperSharedBytes, 128, 64, 8, 2, (128 + 256) * 232 * 2},
      {"fa2", "forward", 224, kAmpereSharedBytes, 64, 32, 4, 2, (64 + 128) * 232 * 2},
      {"fa2", "forward", 256, kHopperSharedBytes, 128, 64, 8, 2, (128 + 256) * 264 * 2},
      {"fa2", "forward", 256, kAmpereSharedBytes, 64, 32, 4, 2, (64 + 128) * 264 * 2},
      {"fa2", "backward", 32, kHopperSharedBytes, 64, 128, 8, 2, 76800 + 64 * 32 * 4},
      {"fa2", "backward", 32, kAmpereSharedBytes, 64, 128, 8, 2, 76800},
      {"fa2", "backward", 64, kHopperSharedBytes, 128, 128, 8, 2, 182272 + 128 * 64 * 4},
      {"fa2", "backward", 96, kHopperSharedBytes, 64, 128, 8, 2, 142336 + 64 * 96 * 4},
      {"fa2", "backward", 96, kAmpereSharedBytes, 64, 128, 8, 2, 142336},
      {"fa2", "backward", 128, kHopperSharedBytes, 64, 128, 8, 2, 175104 + 64 * 128 * 4},
      {"fa2", "backward", 192, kHopperSharedBytes, 64, 64, 8, 2, 173056 + 64 * 192 * 4},
      {"fa2", "backward", 256, kHopperSharedBytes, 64, 64, 8, 2, 222208},  // no room for the staging tile
      // FA3: 64 query rows per consumer warpgroup plus a producer warpgroup; Q (and O, unless it
      // fits only over Q) as 64-column panels of 128-byte rows, two stages of K and V, 2 KB for
      // the barriers and the 1024-byte alignment.
      {"fa3", "forward", 64, kHopperSharedBytes, 192, 128, 16, 2, 2 * 192 * 128 + 4 * 128 * 128 + 2048},
      {"fa3", "forward", 96, kHopperSharedBytes, 128, 128, 12, 2, 2 * 128 * 256 + 4 * 128 * 256 + 2048},
      {"fa3", "forward", 128, kHopperSharedBytes, 128, 128, 12, 2, 2 * 128 * 256 + 4 * 128 * 256 + 2048},
      {"fa3", "forward", 192, kHopperSharedBytes, 128, 112, 12, 2, 128 * 384 + 4 * 112 * 384 + 2048},  // O over Q
      {"fa3", "forward", 256, kHopperSharedBytes, 128, 80, 12, 2, 128 * 512 + 4 * 80 * 512 + 2048},    // O over Q
      // The FA3 backward: K and V, two stages of Q and dO, two dS^T buffers (128 keys x query
      // block), two fp32 dQ slices (64 x 64; at d 128 80 query rows x 64 columns), two stages of
      // LSE and D rows (each on 128 bytes: 96 floats for 80 rows), the barriers (160), the
      // persistent walk's published key blocks (256) and the alignment (1024).
      {"fa3", "backward", 64, kHopperSharedBytes, 128, 128, 12, 2,
       2 * 128 * 128 + 4 * 128 * 128 + 2 * 128 * 256 + 2 * 64 * 64 * 4 + 2 * 2 * 128 * 4 + 1440},
      {"fa3", "backward", 128, kHopperSharedBytes, 80, 128, 12, 2,
       2 * 128 * 256 + 4 * 80 * 256 + 2 * 128 * 160 + 2 * 80 * 64 * 4 + 2 * 2 * 96 * 4 + 1440},
      // d 128's masked variant: 64-row query blocks.
      {"fa3", "backward", 128, kHopperSharedBytes, 64, 128, 12, 2,
       2 * 128 * 256 + 4 * 64 * 256 + 2 * 128 * 128 + 2 * 64 * 64 * 4 + 2 * 2 * 64 * 4 + 1440},
      // d 256 splits the head dim: 64 keys, two buffers of P and dS (64 x 64 each), no dQ staging.
      {"fa3", "backward", 256, kHopperSharedBytes, 64, 64, 12, 2,
       2 * 64 * 512 + 4 * 64 * 512 + 2 * 2 * 64 * 128 + 2 * 2 * 64 * 4 + 1440},
  };
  return rows;
}

std::vector<Row> rows_of(const std::vector<KernelTiling>& tilings) {
  std::vector<Row> rows;
  for (const KernelTiling& t : tilings) rows.push_back(row(t));
  return rows;
}

}  // namespace

TEST_CASE("kernel tilings: the exported list is the tiles the kernels compile with", "[sim][kernel_tilings]") {
  const std::vector<KernelTiling> tilings = flashlab::kernels::dispatched_tilings();
  CHECK(rows_of(tilings) == expected_tilings());
  for (const KernelTiling& t : tilings) {
    INFO(t.generation << " " << t.direction << " d " << t.head_dim << " budget " << t.shared_budget);
    CHECK(t.shared_bytes <= t.shared_budget);
    // The backward's sm_90 variant and the Hopper rung run only where a Hopper's budget is allowed.
    const bool budget_bound = t.direction == "backward" || t.generation == "fa3";
    CHECK(t.min_shared_limit == (budget_bound ? t.shared_budget : t.shared_bytes));
    CHECK(t.block_rows % 16 == 0);  // whole m16 row tiles
    CHECK(t.block_cols % 16 == 0);
  }
}

TEST_CASE("kernel tilings: a device runs the tiling of the widest budget that fits", "[sim][kernel_tilings]") {
  auto find = [](const std::vector<KernelTiling>& tilings, const std::string& generation, const std::string& direction,
                 int head_dim) {
    std::vector<Row> found;
    for (const KernelTiling& t : tilings) {
      if (t.generation == generation && t.direction == direction && t.head_dim == head_dim) found.push_back(row(t));
    }
    return found;
  };
  const auto hopper = flashlab::kernels::tilings_for_shared_limit(kHopperSharedBytes);
  CHECK(hopper.size() == 2 + 8 + 6 + 5 + 4);
  CHECK(find(hopper, "fa2", "forward", 128) ==
        std::vector<Row>{{"fa2", "forward", 128, kHopperSharedBytes, 128, 64, 4, 2, 104448}});
  CHECK(find(hopper, "fa2", "forward", 256) ==
        std::vector<Row>{{"fa2", "forward", 256, kHopperSharedBytes, 128, 64, 8, 2, 202752}});
  const auto ampere = flashlab::kernels::tilings_for_shared_limit(kAmpereSharedBytes);
  // d 192's 8-warp tiling (150 KB) fits an A100 too; d 224 and 256 fall back to 4 warps.
  CHECK(find(ampere, "fa2", "forward", 192) ==
        std::vector<Row>{{"fa2", "forward", 192, kHopperSharedBytes, 128, 64, 8, 2, 153600}});
  CHECK(find(ampere, "fa2", "forward", 256) ==
        std::vector<Row>{{"fa2", "forward", 256, kAmpereSharedBytes, 64, 32, 4, 2, 101376}});
  CHECK(find(ampere, "fa2", "backward", 128).empty());  // refused: 171 KB without the staging tile
  CHECK(find(ampere, "fa3", "forward", 64).empty());     // the Hopper rung, even where its tiles would fit
  // The sm_80 backward, without the sm_90 staging tile that would fit 163 KB too.
  CHECK(find(ampere, "fa2", "backward", 96) ==
        std::vector<Row>{{"fa2", "backward", 96, kAmpereSharedBytes, 64, 128, 8, 2, 142336}});
  // Turing's 64 KB: the FA1 rung only.
  const auto turing = flashlab::kernels::tilings_for_shared_limit(kTuringSharedBytes);
  CHECK(rows_of(turing) == std::vector<Row>(expected_tilings().begin(), expected_tilings().begin() + 2));
}

TEST_CASE("kernel tilings: the FA3 backward's d 128 takes its masked variant where a mask leaves short walks",
          "[sim][kernel_tilings]") {
  using flashlab::kernels::takes_masked_variant;
  int masked_rows = 0;
  for (const KernelTiling& t : flashlab::kernels::dispatched_tilings()) {
    if (!t.masked_variant) continue;
    ++masked_rows;
    CHECK(row(t) == Row{"fa3", "backward", 128, kHopperSharedBytes, 64, 128, 12, 2, t.shared_bytes});
  }
  CHECK(masked_rows == 1);
  // (generation, direction, padded head dim, causal, window_left, window_right, seqlen_q)
  CHECK_FALSE(takes_masked_variant("fa3", "backward", 128, false, -1, -1, 2048));  // no mask: 80 rows
  CHECK(takes_masked_variant("fa3", "backward", 128, true, -1, -1, 2048));         // causal, short walks
  CHECK(takes_masked_variant("fa3", "backward", 128, true, -1, -1, 8191));
  CHECK_FALSE(takes_masked_variant("fa3", "backward", 128, true, -1, -1, 8192));   // causal, long walks
  CHECK(takes_masked_variant("fa3", "backward", 128, false, -1, 0, 2048));         // a right bound is a diagonal
  CHECK_FALSE(takes_masked_variant("fa3", "backward", 128, false, -1, 0, 8192));
  CHECK(takes_masked_variant("fa3", "backward", 128, false, 100, -1, 16384));      // a window's left bound
  CHECK_FALSE(takes_masked_variant("fa3", "backward", 64, true, -1, -1, 2048));    // d 64 and 256: one tiling
  CHECK_FALSE(takes_masked_variant("fa3", "backward", 256, false, 100, -1, 2048));
  CHECK_FALSE(takes_masked_variant("fa3", "forward", 128, true, -1, -1, 2048));
  CHECK_FALSE(takes_masked_variant("fa2", "backward", 128, true, -1, -1, 2048));
  // The launcher's dispatch reaches the instance of the pair it is given, and only listed ones.
  auto query_rows = [](int head_dim, bool masked_variant) {
    int rows = 0;
    const bool visited = flashlab::kernels::fa3::visit_backward_instance(
        head_dim, masked_variant,
        [&]<int kHeadDim, bool kMaskedVariant>() { rows = flashlab::kernels::fa3::BackwardTiling<kHeadDim, kMaskedVariant>::kBlockM; });
    return visited ? rows : -1;
  };
  CHECK(query_rows(128, false) == 80);
  CHECK(query_rows(128, true) == 64);
  CHECK(query_rows(64, false) == 128);
  CHECK(query_rows(256, false) == 64);
  CHECK(query_rows(64, true) == -1);   // no masked variant at d 64
  CHECK(query_rows(96, false) == -1);  // not a padded head dim
}
