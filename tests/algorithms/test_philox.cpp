// Philox4x32-10 (algorithms/philox.hpp) against the known-answer vectors published with the
// Random123 library (Salmon, Moraes, Dror and Shaw 2011), and the dropout decisions built on it.
// The oracle, every schedule and the kernels share this generator, so comparing them with each
// other cannot show that it is Philox; these vectors can.
#include <array>
#include <cmath>
#include <cstdint>
#include <set>

#include "algorithms/philox.hpp"
#include "algorithms/problem.hpp"
#include "catch.hpp"
#include "reference/reference_check.hpp"

using namespace flashlab;

TEST_CASE("Philox4x32-10 reproduces Random123's known answers", "[philox]") {
  struct KnownAnswer {
    std::array<std::uint32_t, 4> counter;
    std::array<std::uint32_t, 2> key;  // key[0] is the low word of our 64-bit key
    std::array<std::uint32_t, 4> expected;
  };
  const KnownAnswer answers[] = {
      {{0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u}, {0x00000000u, 0x00000000u},
       {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const KnownAnswer& answer : answers) {
    const std::uint64_t key = std::uint64_t{answer.key[1]} << 32 | answer.key[0];
    const PhiloxOutput got =
        philox4x32_10(key, answer.counter[0], answer.counter[1], answer.counter[2], answer.counter[3]);
    INFO("counter " << std::hex << answer.counter[0] << " " << answer.counter[1] << " " << answer.counter[2] << " "
                    << answer.counter[3] << ", key " << key);
    for (int w = 0; w < 4; ++w) CHECK(got.word[w] == answer.expected[w]);
  }
}

TEST_CASE("dropout decisions: uniform from 0 to 1, the kept share is 1 - p, (seed, offset) replays them",
          "[philox][dropout]") {
  const std::uint64_t seed = reference::fresh_seed();
  INFO("seed " << seed);
  Problem problem;
  problem.batch = 2, problem.heads_q = 3, problem.heads_kv = 3, problem.seqlen_q = 100, problem.seqlen_k = 130;
  problem.dropout = {0.3f, seed, 17};
  long long kept = 0, total = 0, differs_with_offset = 0;
  std::set<float> distinct;
  for (int b = 0; b < problem.batch; ++b) {
    for (int h = 0; h < problem.heads_q; ++h) {
      const HeadProblem head = head_problem(problem, b, h);
      for (int i = 0; i < problem.seqlen_q; ++i) {
        for (int j = 0; j < problem.seqlen_k; ++j) {
          const float u = dropout_uniform(seed, 17, b, h, i, j);
          REQUIRE(u >= 0.0f);
          REQUIRE(u < 1.0f);
          CHECK(head.dropout_keeps(i, j) == (u >= 0.3f));
          CHECK(dropout_uniform(seed, 17, b, h, i, j) == u);  // replayed from (seed, offset)
          differs_with_offset += dropout_uniform(seed, 18, b, h, i, j) != u;
          distinct.insert(u);
          kept += u >= 0.3f;
          ++total;
        }
      }
    }
  }
  // 78000 Bernoulli(0.7) draws: the standard deviation of the share is 0.0016; 0.01 is 6 of them.
  const double share = static_cast<double>(kept) / static_cast<double>(total);
  INFO("kept share " << share << " of " << total);
  CHECK(std::abs(share - 0.7) < 0.01);
  CHECK(static_cast<double>(differs_with_offset) > 0.99 * static_cast<double>(total));
  CHECK(static_cast<double>(distinct.size()) > 0.95 * static_cast<double>(total));
}
