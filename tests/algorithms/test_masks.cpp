// The masks against their definition, written out as pictures: which key each query sees for
// causal masks aligned to either corner, sliding windows and their combination. The oracle and
// every schedule share HeadProblem's mask rules, so comparing them with each other cannot find a
// mistake in those rules (an off-by-one in the corner alignment moves the oracle along with the
// schedules); these pictures are the independent ground truth. The block-level view
// (HeadProblem::coverage, visible_key_range), with which tiled schedules skip blocks, is held to
// the element-level rule by brute force, and so are the forms of MaskRule that only the GPU
// kernels call (a row's key interval, a key block's visible queries, the full-block test).
#include <algorithm>
#include <string>
#include <vector>

#include "algorithms/00_oracle.hpp"
#include "catch.hpp"
#include "reference/reference_check.hpp"

using namespace flashlab;

namespace {

struct MaskPicture {
  const char* name;
  int seqlen_q, seqlen_k;
  Mask mask;
  std::vector<std::string> rows;  // rows[i][j] == '1': query i sees key j
};

Mask causal(CausalAlignment alignment) {
  Mask mask;
  mask.causal = true;
  mask.alignment = alignment;
  return mask;
}

Mask window(int left, int right, CausalAlignment alignment = CausalAlignment::bottom_right, bool is_causal = false) {
  Mask mask;
  mask.causal = is_causal;
  mask.alignment = alignment;
  mask.window_left = left;
  mask.window_right = right;
  return mask;
}

// Each picture worked out by hand from the flash-attention convention: bottom-right alignment
// puts query i on key i + seqlen_k - seqlen_q, top-left on key i; causal sees keys up to the
// diagonal, a window (left, right) keys diagonal - left .. diagonal + right.
const std::vector<MaskPicture>& pictures() {
  static const std::vector<MaskPicture> all = {
      {"causal bottom-right, 3 x 5", 3, 5, causal(CausalAlignment::bottom_right), {"11100", "11110", "11111"}},
      {"causal top-left, 3 x 5", 3, 5, causal(CausalAlignment::top_left), {"10000", "11000", "11100"}},
      {"causal bottom-right, 5 x 3 (rows 0, 1 see nothing)", 5, 3, causal(CausalAlignment::bottom_right),
       {"000", "000", "100", "110", "111"}},
      {"causal top-left, 5 x 3", 5, 3, causal(CausalAlignment::top_left), {"100", "110", "111", "111", "111"}},
      {"causal bottom-right, 4 x 1", 4, 1, causal(CausalAlignment::bottom_right), {"0", "0", "0", "1"}},
      {"window (1, 0), 4 x 4", 4, 4, window(1, 0), {"1000", "1100", "0110", "0011"}},
      {"window (0, 2), 3 x 5, bottom-right", 3, 5, window(0, 2), {"00111", "00011", "00001"}},
      {"window (1, 1), 3 x 5, top-left", 3, 5, window(1, 1, CausalAlignment::top_left),
       {"11000", "11100", "01110"}},
      {"window (-1, 1), 3 x 5, top-left", 3, 5, window(-1, 1, CausalAlignment::top_left),
       {"11000", "11100", "11110"}},
      {"window (0, -1), 4 x 3, bottom-right", 4, 3, window(0, -1), {"111", "111", "011", "001"}},
      {"causal + window (1, -1), 5 x 5", 5, 5, window(1, -1, CausalAlignment::bottom_right, true),
       {"10000", "11000", "01100", "00110", "00011"}},
      {"window (0, 0), 6 x 3, bottom-right (rows 0..2 see nothing)", 6, 3, window(0, 0),
       {"000", "000", "000", "100", "010", "001"}},
  };
  return all;
}

HeadProblem head_for(const MaskPicture& picture) {
  Problem problem;
  problem.seqlen_q = picture.seqlen_q;
  problem.seqlen_k = picture.seqlen_k;
  problem.head_dim = 8;
  problem.mask = picture.mask;
  problem.validate();
  return head_problem(problem, 0, 0);
}

// Masks whose block-level views are held to the element-level rule.
std::vector<std::pair<std::string, Mask>> block_test_masks() {
  return {
      {"causal bottom-right", causal(CausalAlignment::bottom_right)},
      {"causal top-left", causal(CausalAlignment::top_left)},
      {"window (3, 2)", window(3, 2)},
      {"window (0, -1) top-left", window(0, -1, CausalAlignment::top_left)},
      {"window (-1, 0)", window(-1, 0)},
      {"causal + window (4, -1)", window(4, -1, CausalAlignment::bottom_right, true)},
      {"no mask", Mask{}},
  };
}

}  // namespace

TEST_CASE("masks: key_visible draws the hand-made pictures", "[masks]") {
  for (const MaskPicture& picture : pictures()) {
    INFO(picture.name);
    REQUIRE(static_cast<int>(picture.rows.size()) == picture.seqlen_q);
    const HeadProblem head = head_for(picture);
    for (int i = 0; i < picture.seqlen_q; ++i) {
      std::string drawn;
      for (int j = 0; j < picture.seqlen_k; ++j) drawn += head.key_visible(i, j) ? '1' : '0';
      INFO("query " << i);
      CHECK(drawn == picture.rows[i]);
    }
  }
}

TEST_CASE("masks: the oracle's probabilities are zero exactly where the pictures hide a key", "[masks]") {
  for (const MaskPicture& picture : pictures()) {
    INFO(picture.name);
    Problem problem;
    problem.seqlen_q = picture.seqlen_q;
    problem.seqlen_k = picture.seqlen_k;
    problem.head_dim = 8;
    problem.mask = picture.mask;
    const auto seed = reference::fresh_seed();
    INFO("seed " << seed);
    const AttentionTensors tensors = reference::random_inputs(problem, seed, false);
    const OracleResult oracle = oracle_attention(problem, tensors, nullptr, OracleOptions{true});
    REQUIRE(oracle.P.size() == 1);
    for (int i = 0; i < picture.seqlen_q; ++i) {
      std::string drawn;
      for (int j = 0; j < picture.seqlen_k; ++j)
        drawn += oracle.P[0][static_cast<std::size_t>(i) * picture.seqlen_k + j] > 0 ? '1' : '0';
      INFO("query " << i);
      CHECK(drawn == picture.rows[i]);
      const bool sees_nothing = picture.rows[i].find('1') == std::string::npos;
      CHECK((oracle.LSE.at(i, 0, 0) == -INFINITY) == sees_nothing);
    }
  }
}

TEST_CASE("masks: block coverage and visible key ranges agree with key_visible", "[masks]") {
  // Odd sizes, every alignment, windows on either side: each block's coverage must be empty,
  // full or partial exactly as its elements are, and the visible key range of a row block must
  // contain every visible key (tiled schedules skip what these say is empty).
  const auto [seqlen_q, seqlen_k] = GENERATE(table<int, int>({{13, 29}, {29, 13}, {17, 17}, {9, 1}, {1, 9}}));
  for (const auto& [name, mask] : block_test_masks()) {
    Problem problem;
    problem.seqlen_q = seqlen_q, problem.seqlen_k = seqlen_k, problem.head_dim = 8, problem.mask = mask;
    const HeadProblem head = head_problem(problem, 0, 0);
    for (const int block : {1, 4, 5}) {
      for (int r0 = 0; r0 < seqlen_q; r0 += block) {
        const int r1 = std::min(seqlen_q, r0 + block);
        const auto [first, last] = head.visible_key_range(r0, r1);
        for (int c0 = 0; c0 < seqlen_k; c0 += block) {
          const int c1 = std::min(seqlen_k, c0 + block);
          int visible = 0;
          for (int i = r0; i < r1; ++i)
            for (int j = c0; j < c1; ++j) {
              if (!head.key_visible(i, j)) continue;
              ++visible;
              INFO(name << ", " << seqlen_q << " x " << seqlen_k << ": key " << j << " of query " << i
                        << " outside the visible range [" << first << ", " << last << ")");
              CHECK((j >= first && j < last));
            }
          const auto expected = visible == 0 ? HeadProblem::BlockCoverage::empty
                                : visible == (r1 - r0) * (c1 - c0) ? HeadProblem::BlockCoverage::full
                                                                   : HeadProblem::BlockCoverage::partial;
          INFO(name << ", " << seqlen_q << " x " << seqlen_k << ", block rows [" << r0 << ", " << r1 << ") keys [" << c0
                    << ", " << c1 << "): " << visible << " visible");
          CHECK(head.coverage(r0, r1, c0, c1) == expected);
        }
      }
    }
  }
}

TEST_CASE("masks: the kernels' forms of the mask rule agree with key_visible", "[masks]") {
  const auto [seqlen_q, seqlen_k] = GENERATE(table<int, int>({{13, 29}, {29, 13}, {17, 17}, {9, 1}, {1, 9}}));
  for (const auto& [name, mask] : block_test_masks()) {
    Problem problem;
    problem.seqlen_q = seqlen_q, problem.seqlen_k = seqlen_k, problem.head_dim = 8, problem.mask = mask;
    const HeadProblem head = head_problem(problem, 0, 0);
    const MaskRule rule = head.mask_rule();
    INFO(name << ", " << seqlen_q << " x " << seqlen_k);
    // One interval per row (the FA2 forward's masked tiles).
    for (int i = 0; i < seqlen_q; ++i) {
      const KeyInterval keys = rule.row_keys(i);
      for (int j = 0; j < seqlen_k; ++j) {
        INFO("query " << i << ", key " << j << ", interval [" << keys.low << ", " << keys.high << "]");
        CHECK(head.key_visible(i, j) == (j >= keys.low && j <= keys.high));
      }
    }
    // One interval per key (the FA3 backward's masked tiles, keys as rows), keys past seqlen_k too.
    for (int j = 0; j < seqlen_k + 3; ++j) {
      const QueryInterval queries = rule.col_queries(j);
      for (int i = 0; i < seqlen_q; ++i) {
        INFO("key " << j << ", query " << i << ", interval [" << queries.low << ", " << queries.high << "]");
        CHECK((j < seqlen_k && head.key_visible(i, j)) == (i >= queries.low && i <= queries.high));
      }
    }
    for (const int block : {1, 4, 5}) {
      // The queries a key block is seen by (the backward's query loop).
      for (int c0 = 0; c0 < seqlen_k; c0 += block) {
        const int c1 = std::min(seqlen_k, c0 + block);
        const IndexRange queries = rule.visible_queries(c0, c1);
        for (int i = 0; i < seqlen_q; ++i)
          for (int j = c0; j < c1; ++j) {
            if (!head.key_visible(i, j)) continue;
            INFO("key block [" << c0 << ", " << c1 << "): query " << i << " outside [" << queries.first << ", "
                               << queries.last << ")");
            CHECK((i >= queries.first && i < queries.last));
          }
      }
      // Full blocks (no element-wise mask), also for key blocks running past the keys.
      for (int r0 = 0; r0 < seqlen_q; r0 += block) {
        const int r1 = std::min(seqlen_q, r0 + block);
        for (int c0 = 0; c0 < seqlen_k; c0 += block) {
          bool all = true, any = false;
          for (int i = r0; i < r1; ++i)
            for (int j = c0; j < c0 + block; ++j) {
              const bool visible = j < seqlen_k && head.key_visible(i, j);
              all = all && visible;
              any = any || visible;
            }
          if (!any) continue;  // the kernels never visit such a block
          INFO("rows [" << r0 << ", " << r1 << ") keys [" << c0 << ", " << c0 + block << ")");
          CHECK(rule.block_full(r0, r1 - 1, c0, c0 + block) == all);
        }
      }
    }
  }
}
