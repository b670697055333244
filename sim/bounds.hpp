// The asymptotic IO bounds of the papers, in one place, as plain functions of the problem and M
// (everything in elements: N, d, M = SRAM bytes / element size), and the exponents a log-log fit
// of counted traffic should find.
//
//   standard attention (FA1 Theorem 2):            Theta(N d + N^2)
//   FlashAttention forward (FA1 Theorem 2) and
//   backward (FA1 Theorem 5), FA2 likewise:        Theta(N^2 d^2 / M)       for d <= M <= N d
//   block-sparse FlashAttention (FA1 Prop. 4):     Theta(N d + N^2 d^2 s / M), s = kept fraction
//   lower bound (FA1 Proposition 3):               no o(N^2 d^2 / M) algorithm for all M in [d, N d]
//   lower bound (Saha and Ye, Theorem 3.1):        Theta(min(N^2 d / sqrt(M), N^2 d^2 / M)),
//                                                  the two meet at M = d^2
//   memory-efficient (Rabe-Staats, square chunks): Theta(N^2 d / min(sqrt(M), M / d)), our count
//   square tiling (Saha-Ye Algorithm 1):           Theta(N^2 d / sqrt(M) + N^2)
// With seqlen_q != seqlen_k, N^2 reads Nq Nk and N d reads (Nq + Nk) d.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "algorithms/problem.hpp"

namespace flashlab::sim {

struct BoundInputs {
  double nq, nk, d, m;  // m: SRAM in elements
  double sparsity = 1;  // kept fraction of blocks (block-sparse)
  double dv = 0;        // value head dim (0: d)
  double value_dim() const { return dv > 0 ? dv : d; }
};
BoundInputs bound_inputs(const Problem& problem, std::int64_t sram_bytes, double sparsity = 1);

double standard_bound(const BoundInputs& x);        // N d + N^2
double flash_bound(const BoundInputs& x);           // N^2 d^2 / M
double block_sparse_bound(const BoundInputs& x);    // N d + N^2 d^2 s / M
double saha_ye_lower_bound(const BoundInputs& x);   // min(N^2 d / sqrt(M), N^2 d^2 / M)
double memory_efficient_bound(const BoundInputs& x);  // N^2 d / min(sqrt(M), M / d)
double square_tiling_bound(const BoundInputs& x);   // N^2 d / sqrt(M) + N^2
// The compulsory traffic of any exact algorithm: Q, K, V read once, O written once,
// Nq d + Nk (d + dv) + Nq dv. No count goes below it, whatever M.
double compulsory_traffic(const BoundInputs& x);

// The bound a schedule's count is held against (same units: elements), its formula and source.
struct Bound {
  std::string formula;  // "N^2 d^2 / M"
  std::string source;   // "FA1 Theorem 2"
  double elements = 0;
  std::string warning;  // set when M is outside the range the bound is proved for; else empty
};
Bound schedule_bound(std::string_view schedule, const Problem& problem, std::int64_t sram_bytes, double sparsity = 1);
// The lower bound every exact algorithm obeys (Saha and Ye Theorem 3.1, FA1 Proposition 3 for
// M >= d^2), clamped below by the compulsory traffic (which it undercuts once M approaches N d:
// N^2 d^2 / M = N d at M = N d, less beyond).
Bound lower_bound(const Problem& problem, std::int64_t sram_bytes);
// The FlashAttention bounds (FA1 Theorems 2 and 5, Proposition 3) hold for d <= M <= N d (M in
// elements, N = max(Nq, Nk)): a sentence saying where M lies when outside, else empty. Set as
// Bound::warning by schedule_bound for those schedules and by lower_bound.
std::string theorem_range_warning(const Problem& problem, std::int64_t sram_bytes);

// The exponents of traffic in N, M and d the theory predicts for a schedule in the regime of the
// point (M and d decide between M < d^2 and M >= d^2).
struct Exponents {
  double n = 0, m = 0, d = 0;
};
Exponents theory_exponents(std::string_view schedule, double m_elements, double d);
// Per regime, for the registry entries: standard attention (N^2), the FlashAttention family
// (N^2 d^2 / M), memory-efficient square chunks, and Saha-Ye square tiling.
Exponents standard_exponents(double m_elements, double d);
Exponents flash_exponents(double m_elements, double d);
Exponents memory_efficient_exponents(double m_elements, double d);
Exponents square_tiling_exponents(double m_elements, double d);

}  // namespace flashlab::sim
