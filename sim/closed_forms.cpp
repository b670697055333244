#include "closed_forms.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace flashlab::sim {

namespace {

constexpr std::int64_t kStatBytes = 4;  // m, l, LSE, D are fp32

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Problem sizes of one head, in the papers' letters.
struct Sizes {
  std::int64_t nq, nk, d, dv, e;  // e: element bytes of the dtype
  explicit Sizes(const Problem& p)
      : nq(p.seqlen_q), nk(p.seqlen_k), d(p.head_dim), dv(p.value_dim()), e(element_bytes(p.dtype)) {}
};

void add_read(Counters& c, TensorId id, std::int64_t elements, std::int64_t element_size, std::int64_t transfers) {
  TensorTraffic& t = c.tensor[static_cast<int>(id)];
  t.hbm_read_elements += elements;
  t.hbm_read_bytes += elements * element_size;
  c.loads += transfers;
}
void add_write(Counters& c, TensorId id, std::int64_t elements, std::int64_t element_size, std::int64_t transfers) {
  TensorTraffic& t = c.tensor[static_cast<int>(id)];
  t.hbm_write_elements += elements;
  t.hbm_write_bytes += elements * element_size;
  c.stores += transfers;
}

// ---------------------------------------------------------------------------------------------
// FA2 forward (FA2 Algorithm 1), one head. Per query block i (Tr = ceil(Nq / Br) of them):
// Q_i read once, O_i and LSE_i written once; per visited key block j: K_j and V_j read.
// Unmasked: K and V are read Tr times in full.
Counters fa2_forward_head(const Problem& p, const BlockSizes& b) {
  const Sizes s(p);
  const HeadProblem head = head_problem(p, 0, 0);
  Counters c;
  for (std::int64_t row = 0; row < s.nq; row += b.block_rows) {
    const std::int64_t rows = std::min<std::int64_t>(b.block_rows, s.nq - row);
    add_read(c, TensorId::Q, rows * s.d, s.e, 1);
    for (std::int64_t col = 0; col < s.nk; col += b.block_cols) {
      const std::int64_t cols = std::min<std::int64_t>(b.block_cols, s.nk - col);
      (void)head;
      add_read(c, TensorId::K, cols * s.d, s.e, 1);
      add_read(c, TensorId::V, cols * s.dv, s.e, 1);
      c.matmul_flops += 2 * rows * cols * (s.d + s.dv);
      c.exponentials += rows * cols + rows;  // P = exp(S - m), rescale exp(m_old - m_new)
    }
    c.exponentials += rows;  // log(l) for LSE
    add_write(c, TensorId::O, rows * s.dv, s.e, 1);
    add_write(c, TensorId::LSE, rows, kStatBytes, 1);
  }
  return c;
}

std::int64_t fa2_working_set(const Problem& p, const BlockSizes& b) {
  const Sizes s(p);
  const std::int64_t r = std::min<std::int64_t>(b.block_rows, s.nq), c = std::min<std::int64_t>(b.block_cols, s.nk);
  // Q_i, O_i, K_j, V_j, S_ij, P_ij; m, l, m_new, rescale, rowsum(P) (FA2 Algorithm 1, lines 4-10).
  return s.e * (r * s.d + r * s.dv + c * s.d + c * s.dv + 2 * r * c) + kStatBytes * 5 * r;
}

// The paper's rule for a tile side b from M in elements, capped by the paper's value and shrunk
// until the working set fits. make(b) builds the block sizes from b.
template <class Make>
BlockSizes largest_fitting(std::string_view schedule, const Problem& p, std::int64_t sram_bytes, std::int64_t paper_b,
                           Make make) {
  auto fits = [&](std::int64_t b) { return working_set_bytes(schedule, p, make(b)) <= sram_bytes; };
  if (!fits(1)) {
    throw std::invalid_argument("SRAM size M = " + std::to_string(sram_bytes) + " B is below the smallest working set of '" +
                                std::string(schedule) + "' (" + std::to_string(working_set_bytes(schedule, p, make(1))) +
                                " B with blocks of 1 row); allowed: M >= that");
  }
  std::int64_t low = 1, high = std::max<std::int64_t>(1, paper_b);
  while (low < high) {  // largest b in [1, paper_b] that fits
    const std::int64_t mid = low + (high - low + 1) / 2;
    if (fits(mid)) low = mid; else high = mid - 1;
  }
  return make(low);
}

}  // namespace

Counters closed_form(std::string_view schedule, const Problem& problem, const BlockSizes& blocks) {
  problem.validate();
  const std::int64_t heads = static_cast<std::int64_t>(problem.batch) * problem.heads_q;
  if (schedule == "fa2") return scaled(fa2_forward_head(problem, blocks), heads);
  throw std::invalid_argument("closed form for schedule '" + std::string(schedule) + "' is not written; allowed: fa2");
}

std::int64_t working_set_bytes(std::string_view schedule, const Problem& problem, const BlockSizes& blocks) {
  if (schedule == "fa2") return fa2_working_set(problem, blocks);
  throw std::invalid_argument("working set of schedule '" + std::string(schedule) + "' is not written; allowed: fa2");
}

BlockSizes derive_blocks(std::string_view schedule, const Problem& problem, std::int64_t sram_bytes) {
  const std::int64_t m_elements = sram_bytes / element_bytes(problem.dtype);
  const std::int64_t d = problem.head_dim;
  const std::int64_t paper = ceil_div(m_elements, 4 * d);  // ceil(M / 4d)
  auto clamp_int = [](std::int64_t v) { return static_cast<int>(std::min<std::int64_t>(v, 1 << 30)); };
  if (schedule == "fa2") {
    // FA2 swaps FA1's loops, so it swaps FA1's rule: Br = ceil(M / 4d), Bc = min(Br, d).
    return largest_fitting(schedule, problem, sram_bytes, paper, [&](std::int64_t b) {
      return BlockSizes{clamp_int(b), clamp_int(std::min(b, d))};
    });
  }
  throw std::invalid_argument("block-size rule for schedule '" + std::string(schedule) + "' is not written; allowed: fa2");
}

}  // namespace flashlab::sim
