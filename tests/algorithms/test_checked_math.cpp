// Checked arithmetic at the edges of int and int64 (2^31 - 1, 2^31, 2^62, products just over the
// limits), and every place a size product or a count is formed refusing to wrap: the problem's
// rows, varlen offsets, host tensors, tiles, the SRAM arena and the counters.
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "algorithms/00_oracle.hpp"
#include "algorithms/checked_math.hpp"
#include "algorithms/limits.hpp"
#include "algorithms/problem.hpp"
#include "algorithms/tensors.hpp"
#include "algorithms/tile_memory.hpp"
#include "catch.hpp"

using namespace flashlab;
using flashlab::testing::contains_text;

namespace {
constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();  // 2^31 - 1
constexpr std::int64_t k2To31 = std::int64_t{1} << 31;
constexpr std::int64_t k2To62 = std::int64_t{1} << 62;
}  // namespace

TEST_CASE("checked add and multiply refuse to leave int64, at the edges", "[checked]") {
  CHECK(checked_mul(kIntMax, 1, "q") == kIntMax);
  CHECK(checked_mul(k2To31, k2To31, "q") == k2To62);
  CHECK(checked_mul(kIntMax, kIntMax, "q") == kIntMax * kIntMax);
  CHECK(checked_add(k2To62, k2To62 - 1, "q") == kInt64Max);
  CHECK(checked_add(-kInt64Max, -1, "q") == std::numeric_limits<std::int64_t>::min());
  CHECK_THROWS_AS(checked_add(k2To62, k2To62, "q"), SizeOverflow);      // 2^63
  CHECK_THROWS_AS(checked_mul(k2To62, 2, "q"), SizeOverflow);           // 2^63
  CHECK_THROWS_AS(checked_mul(k2To31 + 1, k2To31 * 2, "q"), SizeOverflow);  // just over 2^63
  CHECK_THROWS_AS(checked_mul(-k2To62, 3, "q"), SizeOverflow);
  CHECK_THROWS_AS(checked_add(kInt64Max, 1, "q"), SizeOverflow);
  CHECK_THROWS_WITH(checked_mul(k2To62, 2, "matmul_flops"),
                    contains_text("matmul_flops = 4611686018427387904 x 2 is out of range") &&
                        contains_text("allowed: at most 9223372036854775807"));
  // A SizeOverflow is bad input: the command lines answer std::invalid_argument with exit 2.
  CHECK_THROWS_AS(checked_mul(k2To62, 2, "q"), std::invalid_argument);
  CHECK(saturating_add(kInt64Max, 1) == kInt64Max);
  CHECK(saturating_add(k2To62, 1) == k2To62 + 1);

  CHECK(checked_product("q", 1 << 20, 1 << 20, 1 << 22) == k2To62);
  CHECK_THROWS_AS(checked_product("q", 1 << 20, 1 << 20, 1 << 23), SizeOverflow);
  CHECK(checked_int(kIntMax, "q") == kIntMax);
  CHECK_THROWS_WITH(checked_int(k2To31, "rows"), contains_text("rows = 2147483648 is out of range") &&
                                                      contains_text("allowed: -2147483648..2147483647"));
  CHECK_THROWS_AS(checked_int(-k2To31 - 1, "q"), SizeOverflow);
  CHECK_THROWS_AS(checked_size(-1, "q"), SizeOverflow);
}

TEST_CASE("CheckedInt64 formulas read as written and refuse to wrap", "[checked]") {
  using Count = CheckedInt64;
  const Count n = k2To31;
  CHECK((n * n).value() == k2To62);
  CHECK((n * n + (n * n - 1)).value() == kInt64Max);
  CHECK_THROWS_AS(2 * n * n, SizeOverflow);
  CHECK_THROWS_AS(Count(std::numeric_limits<std::int64_t>::min()) - 1, SizeOverflow);
  CHECK(std::max(Count(3), Count(5)) == Count(5));
}

TEST_CASE("a problem's rows are int: batch x seqlen past 2^31 - 1 is refused, never wrapped", "[checked][problem]") {
  Problem p;
  p.batch = 2;
  p.seqlen_q = p.seqlen_k = 1 << 30;  // 2^31 rows
  CHECK_THROWS_AS(p.validate(), std::invalid_argument);
  CHECK_THROWS_WITH(p.validate(), contains_text("batch x seqlen_q = 2 x 1073741824 = 2147483648 rows") &&
                                      contains_text("allowed: at most 2147483647"));
  CHECK_THROWS_AS(p.total_rows_q(), SizeOverflow);  // even unvalidated: refused, not negative
  p.seqlen_q = (1 << 30) - 1;  // 2^31 - 2 rows of Q; K still too many
  CHECK_THROWS_WITH(p.validate(), contains_text("batch x seqlen_k"));
  p.seqlen_k = 3;
  CHECK_NOTHROW(p.validate());
  CHECK(p.total_rows_q() == kIntMax - 1);
  CHECK(p.first_row_q(1) == (1 << 30) - 1);
  p.batch = kMaxBatch;
  p.seqlen_q = p.seqlen_k = kMaxSequenceLength;  // 2^60 rows: each in range, the product not
  CHECK_THROWS_WITH(p.validate(), contains_text("batch x seqlen_q = 1073741824 x 1073741824"));
}

TEST_CASE("varlen offsets: a total past 2^31 - 1 and extreme offsets are refused without overflow", "[checked][problem]") {
  Problem p;
  set_varlen(p, {1 << 30, (1 << 30) - 1}, {1, 1});  // 2^31 - 1 rows: the most there can be
  CHECK_NOTHROW(p.validate());
  CHECK(p.total_rows_q() == kIntMax);
  CHECK_THROWS_WITH(set_varlen(p, {1 << 30, 1 << 30}, {1, 1}),
                    contains_text("total of seqlens_q = 2147483648") && contains_text("allowed: at most 2147483647"));
  CHECK_THROWS_WITH(set_varlen(p, {5, -3}, {1, 1}), contains_text("length -3; allowed: >= 1"));
  Problem q;
  q.batch = 2;
  q.seqlen_q = q.seqlen_k = 4;
  q.cu_seqlens_q = {0, 1, std::numeric_limits<int>::min()};  // INT_MIN - 1 wraps in int
  q.cu_seqlens_k = {0, 1, 2};
  CHECK_THROWS_WITH(q.validate(), contains_text("sequence 1 has length -2147483649; allowed: [1, seqlen_q = 4]"));
  q.cu_seqlens_q = {0, std::numeric_limits<int>::max(), 2};  // longer than seqlen_q: its rows would go uncomputed
  CHECK_THROWS_WITH(q.validate(), contains_text("sequence 0 has length 2147483647; allowed: [1, seqlen_q = 4]"));
}

TEST_CASE("host tensors: a size product that would wrap or a negative size is refused", "[checked][tensors]") {
  // 2^21 x 2^21 x 2^22 = 2^64 elements: wrapped, that is a buffer of 0 elements indexed up to 2^64.
  CHECK_THROWS_AS(HostTensor(TensorId::Q, DType::fp32, 1 << 21, 1 << 21, 1 << 22), SizeOverflow);
  CHECK_THROWS_WITH(HostTensor(TensorId::K, DType::fp32, 1 << 21, 1 << 21, 1 << 22), contains_text("elements of K"));
  CHECK_THROWS_AS(HostTensor(TensorId::Q, DType::fp32, -1, 1, 1), SizeOverflow);
  CHECK_THROWS_AS(OracleTensor(1 << 21, 1 << 21, 1 << 22), SizeOverflow);
  CHECK(HostTensor(TensorId::Q, DType::fp32, 3, 5, 7).values.size() == 105);
  HbmScratch scratch(true);
  CHECK_THROWS_AS(scratch.matrix(TensorId::S, DType::fp32, -2, 4), SizeOverflow);
}

TEST_CASE("tiles and counters refuse counts past int64 instead of wrapping", "[checked][tile_memory]") {
  ShapeMemory mem;  // unbounded SRAM: only the arithmetic stands in the way
  const int big = 1 << 30;
  const HbmMatrix q{TensorId::Q, DType::fp32, nullptr, big, 1 << 16, 1 << 16};
  const HbmMatrix k{TensorId::K, DType::fp32, nullptr, big, 1 << 16, 1 << 16};
  Tile q_tile = mem.load(q, {0, big});
  Tile k_tile = mem.load(k, {0, big});
  CHECK(mem.counters()[TensorId::Q].hbm_read_bytes == std::int64_t{1} << 48);
  // 2 x 2^30 x 2^30 x 2^16 = 2^77 FLOPs: the old count wrapped silently.
  CHECK_THROWS_WITH(mem.matmul_nt(TensorId::S, q_tile, k_tile), contains_text("matmul_flops"));
  // A tile of 2^31 - 1 x 2^31 - 1 fp32 elements is about 2^64 bytes.
  const HbmMatrix huge{TensorId::V, DType::fp32, nullptr, std::numeric_limits<int>::max(), std::numeric_limits<int>::max(),
                       std::numeric_limits<int>::max()};
  CHECK_THROWS_WITH(mem.load(huge, {0, std::numeric_limits<int>::max()}, {0, std::numeric_limits<int>::max()}),
                    contains_text("bytes of a tile"));

  Counters a, b;
  a.matmul_flops = kInt64Max - 1;
  b.matmul_flops = 2;
  CHECK_THROWS_WITH(a += b, contains_text("matmul_flops"));
  Counters c;
  c.tensor[static_cast<int>(TensorId::Q)].hbm_read_bytes = k2To62;
  c.tensor[static_cast<int>(TensorId::K)].hbm_read_bytes = k2To62;
  CHECK_THROWS_WITH(c.hbm_read_bytes(), contains_text("hbm_read_bytes"));
  c.tensor[static_cast<int>(TensorId::K)].hbm_read_bytes = 0;
  c.tensor[static_cast<int>(TensorId::O)].hbm_write_bytes = k2To62;
  CHECK_THROWS_WITH(c.hbm_bytes(), contains_text("hbm_bytes"));
}

TEST_CASE("the SRAM arena refuses an in-use count past int64", "[checked][tile_memory]") {
  ShapeMemory mem;
  const int big = 1 << 30;
  const HbmMatrix s{TensorId::S, DType::fp32, nullptr, big, big, big};
  Tile first = mem.load(s, {0, big}, {0, big});   // 2^62 bytes
  CHECK_THROWS_WITH(mem.load(s, {0, big}, {0, big}), contains_text("SRAM bytes in use"));  // 2^63
  CHECK(mem.sram_in_use_bytes() == k2To62);
}

TEST_CASE("the oracle's memory bound saturates instead of wrapping", "[checked][oracle]") {
  Problem p;
  p.seqlen_q = p.seqlen_k = 128;
  p.head_dim = 16;
  // O, LSE (128 x 17) and six 128 x 128 score matrices, in doubles.
  CHECK(oracle_bytes(p, false) == (128 * 17 + 6 * 128 * 128) * 8);
  p.seqlen_q = p.seqlen_k = kMaxSequenceLength;
  CHECK(oracle_bytes(p, true) == kInt64Max);  // 10 x 2^60 x 8 bytes
}
