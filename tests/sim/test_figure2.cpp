// FA1 Figure 2 as reproduced (flashlab figure2): every number of the table held to a formula
// written here from the algorithms (per head, N = 1024, d = 64, fp16, 64 x 16 heads), with the
// blocks each row states, and the standard baseline's blocks to the rule that derives them.
#include <cstdint>
#include <sstream>
#include <string>

#include "catch.hpp"
#include "sim/experiment.hpp"
#include "sim/machines.hpp"

using namespace flashlab;
using namespace flashlab::sim;

namespace {

constexpr std::int64_t N = 1024, d = 64, e = 2, heads = 64 * 16;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

struct Row {
  std::int64_t forward, backward;
  std::int64_t forward_rows, forward_cols, backward_rows, backward_cols;
  std::string assumes;
};

Row row_of(const nlohmann::json& row) {
  std::string assumes;
  for (const auto& line : row["assumes"]) assumes += line.get<std::string>() + "\n";
  return {row["forward_hbm_bytes"].get<std::int64_t>(), row["backward_hbm_bytes"].get<std::int64_t>(),
          row["forward_blocks"]["block_rows"].get<std::int64_t>(), row["forward_blocks"]["block_cols"].get<std::int64_t>(),
          row["backward_blocks"]["block_rows"].get<std::int64_t>(), row["backward_blocks"]["block_cols"].get<std::int64_t>(),
          assumes};
}

}  // namespace

TEST_CASE("Figure 2: each reproduced number is the count its stated assumptions give", "[sim][figure2]") {
  using flashlab::testing::contains_text;
  const Machine a100 = find_machine("a100");
  std::ostringstream text;
  const nlohmann::json rows = run_figure2(a100, text);
  REQUIRE(rows.size() == 3);
  const std::int64_t M = a100.sram_bytes;  // 166 912 B

  SECTION("standard attention: d x d row blocks, 14 N x N passes, Q, K, V, dO re-read per block") {
    const Row r = row_of(rows[0]);
    // The fitting rule's d x d blocks, whose three tiles (e.g. Q_i, K_j, S_ij) fit M with room.
    CHECK(M == 166912);
    CHECK(r.forward_rows == d);
    CHECK(r.forward_cols == d);
    CHECK(r.backward_rows == d);
    CHECK(r.backward_cols == d);
    CHECK(3 * e * d * d <= M);
    // Forward (Tr = 16 query blocks, 16 key blocks per row): Q, O once, K, V Tr times; S written
    // once and read twice (the row's max and sum, then P), P written and read once; LSE in fp32.
    const std::int64_t T = ceil_div(N, d);
    CHECK(r.forward == heads * (e * (2 + 2 * T) * N * d + 5 * e * N * N + 4 * N));  // 15.31 GB
    // Backward (Tr = Tc = 16): 9 N x N passes (P read three times, dP written once and read
    // twice, dS written once and read twice); dO Tc + 1 times, V and K Tr times, Q Tc times; dQ,
    // dK, dV written once.
    CHECK(r.backward == heads * e * (9 * N * N + (2 * T + 2 * T + 4) * N * d));  // 28.45 GB
    CHECK(r.forward == 15305015296LL);
    CHECK_THAT(r.assumes, contains_text("64 x 64 forward, 64 x 64 backward") && contains_text("14 N x N passes"));
  }

  SECTION("FA1: the running O and dQ in fp32 in HBM, once per key block") {
    const Row r = row_of(rows[1]);
    CHECK(r.forward_rows == 64);
    CHECK(r.forward_cols == 257);
    CHECK(r.backward_rows == 64);
    CHECK(r.backward_cols == 122);
    const std::int64_t Tc = ceil_div(N, r.forward_cols);  // 4
    // Q Tc times, K, V once (e); O: fp32 zeros, Tc fp32 reads, Tc - 1 fp32 writes and the last in
    // e; l, m: Tc reads and Tc + 1 writes each; LSE once.
    CHECK(r.forward == heads * (e * (Tc + 2) * N * d + (4 + 4 * Tc + 4 * (Tc - 1) + e) * N * d + 4 * N * (4 * Tc + 3)));
    const std::int64_t Tcb = ceil_div(N, r.backward_cols);  // 9
    // dQ zeroed (fp32), converted (fp32 read, e write); dK, dV zeroed and written (e); K, V once;
    // per key block Q, O, dO read (e), dQ read and written (fp32), l, m read.
    CHECK(r.backward == heads * ((4 + 4 + e) * N * d + 2 * 2 * e * N * d + 2 * e * N * d + (3 * e + 8) * Tcb * N * d + 8 * Tcb * N));
    CHECK_THAT(r.assumes, contains_text("64 x 257 forward, 64 x 122 backward") && contains_text("fp32 in HBM"));
  }

  SECTION("FA2: K and V once per query block, dQ read-modify-write in fp32") {
    const Row r = row_of(rows[2]);
    const std::int64_t Tr = ceil_div(N, r.forward_rows);  // 282 rows: 4
    CHECK(r.forward == heads * (e * (2 + 2 * Tr) * N * d + 4 * N));
    const std::int64_t Tc = ceil_div(N, r.backward_cols);  // 130 keys: 8
    // dQ zeroed, converted; dO, O read and D written once; dK, dV written, K, V read once; per
    // key block Q, dO read (e), dQ read and written (fp32), LSE, D read.
    CHECK(r.backward == heads * ((4 + 4 + e) * N * d + 2 * e * N * d + 4 * N + 2 * e * N * d + 2 * e * N * d +
                                 (2 * e + 8) * Tc * N * d + 8 * Tc * N));
    CHECK_THAT(r.assumes, contains_text(std::to_string(r.forward_rows) + " x " + std::to_string(r.forward_cols) + " forward"));
  }

  for (const auto& row : rows) {  // totals are the sums; every row says it counts without a cache
    CHECK(row["total_hbm_bytes"].get<std::int64_t>() ==
          row["forward_hbm_bytes"].get<std::int64_t>() + row["backward_hbm_bytes"].get<std::int64_t>());
    CHECK_THAT(row_of(row).assumes, contains_text("no L2 or other cache"));
  }
  CHECK_THAT(text.str(), contains_text("standard attention assumes:"));
}
