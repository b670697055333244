// The FA3 rung's tile orders (kernels/03_fa3_sm90/tile_order.hpp) on the CPU: every order is a
// permutation of the (m_block, head, batch) tiles; the forward's causal order is heaviest first
// inside each section of (head, batch) pairs, the backward's takes the key blocks from the first up
// (from the last down when deterministic), in sections under a causal mask or in deterministic mode
// and one pair a section otherwise; a section holds what the L2 budget holds. The divisions
// by multiply-high (kernels/common/fixed_divisor.hpp) against `/` and `%`.
#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "kernels/03_fa3_sm90/tile_order.hpp"

using flashlab::kernels::FixedDivisor;
using flashlab::kernels::fa3::backward_tile_order;
using flashlab::kernels::fa3::l2_section_pairs;
using flashlab::kernels::fa3::tile_order;
using flashlab::kernels::fa3::TileCoordinates;
using flashlab::kernels::fa3::TileOrder;

namespace {

int pair_of(const TileOrder& order, int tile) {
  const auto c = order.coordinates(tile);
  return c.batch * order.heads_q + c.head;
}

// The plain order at the given tiles: a pair's `m_blocks` blocks one after another, its `heads`
// heads next, then the sequences.
void check_plain_order(const TileOrder& order, int m_blocks, int heads, const std::vector<int>& tiles) {
  for (const int tile : tiles) {
    INFO("tile " << tile);
    const auto c = order.coordinates(tile);
    CHECK(c.m_block == tile % m_blocks);
    CHECK(c.head == tile / m_blocks % heads);
    CHECK(c.batch == tile / (m_blocks * heads));
  }
}

// The order's rule by `/` and `%` (the tile_order.hpp comment's words, written out).
TileCoordinates by_plain_division(const TileOrder& order, int tile) {
  int m_block = 0, pair = 0;
  if (order.heaviest_first) {
    const int pairs = order.heads_q * order.batch, section_tiles = order.section_pairs * order.m_blocks;
    const int section = tile / section_tiles, within = tile % section_tiles;
    const int first_pair = section * order.section_pairs;
    const int pairs_here = std::min(order.section_pairs, pairs - first_pair);
    m_block = order.ascending ? within / pairs_here : order.m_blocks - 1 - within / pairs_here;
    pair = first_pair + within % pairs_here;
  } else {
    m_block = tile % order.m_blocks, pair = tile / order.m_blocks;
  }
  return {m_block, pair % order.heads_q, pair / order.heads_q};
}

}  // namespace

TEST_CASE("fixed divisor: the quotient and remainder of / and %", "[fa3_tile_order]") {
  const auto check = [](int d, int n) {
    const FixedDivisor f = FixedDivisor::of(d);
    const int q = f.quotient(n);
    INFO("n " << n << " / d " << d);
    REQUIRE(q == n / d);
    REQUIRE(f.remainder(n, q) == n % d);
  };
  for (int d = 1; d <= 1200; ++d)
    for (int n = 0; n <= 3 * d + 2000; ++n) check(d, n);
  // Large n and d, the multiples' neighbours and the ends of the range.
  constexpr int kMax = 2147483647;
  std::mt19937 random(20261205);
  std::uniform_int_distribution<int> any(1, kMax);
  for (int trial = 0; trial < 20000; ++trial) {
    const int d = trial % 2 ? any(random) : 1 + any(random) % 70000;
    const int n = any(random), q = n / d;
    check(d, n);
    check(d, q * d);
    if (q * d > 0) check(d, q * d - 1);
    if (kMax - d >= q * d) check(d, q * d + d - 1);
  }
  for (const int d : {1, 2, 3, 7, 1 << 15, (1 << 16) + 1, 1 << 30, (1 << 30) + 1, kMax - 1, kMax})
    for (const int n : {0, 1, d - 1, d, kMax - 1, kMax}) check(d, n);
}

TEST_CASE("fa3 tile order: every tile exactly once, in range", "[fa3_tile_order]") {
  for (const auto& [heaviest_first, ascending] : {std::pair{0, 0}, std::pair{1, 0}, std::pair{1, 1}})
    for (const int m_blocks : {1, 3, 16})
      for (const int heads_q : {1, 5})
        for (const int batch : {1, 3})
          for (const int section_pairs : {1, 2, 4, 7, 1000}) {
            const TileOrder order = tile_order(m_blocks, heads_q, batch, heaviest_first, section_pairs, ascending);
            std::set<std::tuple<int, int, int>> seen;
            for (int tile = 0; tile < order.tiles(); ++tile) {
              const auto c = order.coordinates(tile), plain = by_plain_division(order, tile);
              REQUIRE(c.m_block == plain.m_block);
              REQUIRE(c.head == plain.head);
              REQUIRE(c.batch == plain.batch);
              REQUIRE(c.m_block >= 0);
              REQUIRE(c.m_block < m_blocks);
              REQUIRE(c.head >= 0);
              REQUIRE(c.head < heads_q);
              REQUIRE(c.batch >= 0);
              REQUIRE(c.batch < batch);
              seen.insert({c.m_block, c.head, c.batch});
            }
            CHECK(static_cast<int>(seen.size()) == order.tiles());
          }
}

TEST_CASE("fa3 tile order: without a mask, one head's query blocks are neighbours", "[fa3_tile_order]") {
  const TileOrder order = tile_order(4, 3, 2, 0, 1);
  std::vector<int> every(order.tiles());
  for (int tile = 0; tile < order.tiles(); ++tile) every[tile] = tile;
  check_plain_order(order, 4, 3, every);
}

TEST_CASE("fa3 tile order: causal, heaviest first within each section", "[fa3_tile_order]") {
  // 5 heads x 2 sequences = 10 pairs in sections of 4, 4 and 2; 3 query blocks each.
  const TileOrder order = tile_order(3, 5, 2, 1, 4);
  int tile = 0;
  for (const auto& [first_pair, pairs_here] : {std::pair{0, 4}, std::pair{4, 4}, std::pair{8, 2}}) {
    for (int m_block = 2; m_block >= 0; --m_block)
      for (int i = 0; i < pairs_here; ++i, ++tile) {
        CHECK(order.coordinates(tile).m_block == m_block);
        CHECK(pair_of(order, tile) == first_pair + i);
      }
  }
  CHECK(tile == order.tiles());
}

TEST_CASE("fa3 tile order: a section holds the K and V the L2 budget holds", "[fa3_tile_order]") {
  // seqlen_k 2048, d 128, 2-byte elements: K and V of one head are 1 MiB.
  CHECK(l2_section_pairs(2048, 128, 1, 2, 32ll << 20, 128) == 32);
  CHECK(l2_section_pairs(2048, 128, 4, 2, 32ll << 20, 512) == 128);  // 4 query heads per K/V head
  CHECK(l2_section_pairs(16384, 128, 1, 2, 32ll << 20, 16) == 4);
  CHECK(l2_section_pairs(1 << 20, 256, 1, 2, 32ll << 20, 16) == 1);  // larger than the budget: one pair
  CHECK(l2_section_pairs(2048, 128, 1, 2, 1ll << 60, 128) == 128);   // at most every pair
}

TEST_CASE("fa3 tile order: the largest sections of the largest launches stay in range", "[fa3_tile_order]") {
  // 2^31 - 1 tiles at most (the host refuses more): a section of every pair is the whole launch.
  const int pairs = 1 << 14, m_blocks = (1 << 17) - 1;
  const TileOrder order = tile_order(m_blocks, 1 << 7, 1 << 7, 1, l2_section_pairs(128, 64, 1, 2, 1ll << 60, pairs));
  REQUIRE(order.section_pairs == pairs);
  const int last = order.tiles() - 1;
  CHECK(order.coordinates(0).m_block == m_blocks - 1);
  CHECK(order.coordinates(last).m_block == 0);
  CHECK(order.coordinates(last).head == (1 << 7) - 1);
  CHECK(order.coordinates(last).batch == (1 << 7) - 1);
}

TEST_CASE("fa3 backward order: key blocks from the first up within each section", "[fa3_tile_order]") {
  // The same 10 pairs and sections as above, 3 key blocks each; deterministic: from the last down.
  for (const bool deterministic : {false, true}) {
    const TileOrder order = tile_order(3, 5, 2, 1, 4, deterministic ? 0 : 1);
    int tile = 0;
    for (const auto& [first_pair, pairs_here] : {std::pair{0, 4}, std::pair{4, 4}, std::pair{8, 2}}) {
      for (int step = 0; step < 3; ++step)
        for (int i = 0; i < pairs_here; ++i, ++tile) {
          CHECK(order.coordinates(tile).m_block == (deterministic ? 2 - step : step));
          CHECK(pair_of(order, tile) == first_pair + i);
        }
    }
    CHECK(tile == order.tiles());
  }
}

TEST_CASE("fa3 backward order: under a causal mask a section holds the Q, dO and dQ accumulator the L2 budget holds",
          "[fa3_tile_order]") {
  // d 128, 2-byte Q and dO, fp32 accumulator: 8 bytes per element; 16 MiB budget, 16 KV heads.
  const auto order = [](int seqlen, int heads_q, int heads_kv, bool deterministic) {
    return backward_tile_order(seqlen, seqlen, 128, heads_q, heads_kv, 8, true, deterministic, 128, 16ll << 20);
  };
  CHECK(order(2048, 16, 16, false).section_pairs == 8);   // 2 MiB a pair
  CHECK(order(16384, 16, 16, false).section_pairs == 1);  // 16 MiB a pair: the plain (key blocks fastest) order
  CHECK(order(2048, 64, 16, false).section_pairs == 2);   // 4 query heads per KV head: 8 MiB a pair
  CHECK(order(2048, 16, 16, false).m_blocks == 16);
  CHECK(order(2048, 16, 16, false).heads_q == 16);  // the pairs are (KV head, batch)
  CHECK(order(2048, 16, 16, false).ascending == 1);
  CHECK(order(2048, 16, 16, true).ascending == 0);
  // One pair a section is the plain order: key blocks fastest, then KV heads, then sequences.
  const TileOrder plain = order(16384, 16, 16, false);
  check_plain_order(plain, 128, 16, {0, 1, 127, 128, 129, 2047, 2048, plain.tiles() - 1});
}

TEST_CASE("fa3 backward order: without a causal mask, a pair's key blocks one after another at any size",
          "[fa3_tile_order]") {
  // The budget that gives 8 pairs a section under a causal mask (above) gives one without it.
  const TileOrder order = backward_tile_order(2048, 2048, 128, 16, 16, 8, false, false, 128, 16ll << 20);
  CHECK(order.section_pairs == 1);
  check_plain_order(order, 16, 16, {0, 1, 15, 16, 17, 255, 256, order.tiles() - 1});
}

TEST_CASE("fa3 backward order: the deterministic mode keeps the sections without a mask, the pairs fastest",
          "[fa3_tile_order]") {
  // Its dQ turns pass from key block to key block: the blocks that start together hold the same
  // turn of different pairs. 8 pairs a section at this budget, key blocks from the last down.
  const TileOrder order = backward_tile_order(2048, 2048, 128, 16, 16, 8, false, true, 128, 16ll << 20);
  CHECK(order.section_pairs == 8);
  for (const int tile : {0, 1, 7, 8, 9, 127, 128, 129, order.tiles() - 1}) {
    const auto c = order.coordinates(tile);
    const int section = tile / 128, pair = 8 * section + tile % 8;
    CHECK(c.m_block == 15 - tile % 128 / 8);
    CHECK(c.head == pair % 16);
    CHECK(c.batch == pair / 16);
  }
}
