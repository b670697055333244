#include "bounds.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "schedules.hpp"

namespace flashlab::sim {

BoundInputs bound_inputs(const Problem& p, std::int64_t sram_bytes, double sparsity) {
  return {static_cast<double>(p.seqlen_q), static_cast<double>(p.seqlen_k), static_cast<double>(p.head_dim),
          sram_elements_exact(sram_bytes, p.dtype), sparsity, static_cast<double>(p.value_dim())};
}

double standard_bound(const BoundInputs& x) { return (x.nq + x.nk) * x.d + x.nq * x.nk; }
double flash_bound(const BoundInputs& x) { return x.nq * x.nk * x.d * x.d / x.m; }
double block_sparse_bound(const BoundInputs& x) { return (x.nq + x.nk) * x.d + x.nq * x.nk * x.d * x.d * x.sparsity / x.m; }
double saha_ye_lower_bound(const BoundInputs& x) {
  return std::min(x.nq * x.nk * x.d / std::sqrt(x.m), x.nq * x.nk * x.d * x.d / x.m);
}
double compulsory_traffic(const BoundInputs& x) { return x.nq * x.d + x.nk * (x.d + x.value_dim()) + x.nq * x.value_dim(); }
double memory_efficient_bound(const BoundInputs& x) { return x.nq * x.nk * x.d / std::min(std::sqrt(x.m), x.m / x.d); }
double square_tiling_bound(const BoundInputs& x) { return x.nq * x.nk * x.d / std::sqrt(x.m) + x.nq * x.nk; }

std::string theorem_range_warning(const Problem& problem, std::int64_t sram_bytes) {
  const double m = sram_elements_exact(sram_bytes, problem.dtype);
  const double d = problem.head_dim, n = std::max(problem.seqlen_q, problem.seqlen_k);
  if (sram_bytes <= 0 || (m >= d && m <= n * d)) return "";
  std::ostringstream text;
  text << "M = " << m << " elements is " << (m < d ? "below d = " : "above N d = ") << (m < d ? d : n * d)
       << ": outside the range d <= M <= N d that FA1 Theorems 2 and 5 and Proposition 3 are proved for";
  return text.str();
}

Bound schedule_bound(std::string_view schedule, const Problem& problem, std::int64_t sram_bytes, double sparsity) {
  const ScheduleInfo& info = find_schedule(schedule);
  Bound bound{info.bound_formula, info.bound_source, info.bound(bound_inputs(problem, sram_bytes, sparsity)), {}};
  if (bound.formula == "N^2 d^2 / M") bound.warning = theorem_range_warning(problem, sram_bytes);
  return bound;
}

Bound lower_bound(const Problem& problem, std::int64_t sram_bytes) {
  const BoundInputs x = bound_inputs(problem, sram_bytes);
  return {"max(min(N^2 d / sqrt(M), N^2 d^2 / M), Nq d + Nk (d + dv) + Nq dv)",
          "Saha and Ye Theorem 3.1; FA1 Proposition 3; compulsory traffic", std::max(saha_ye_lower_bound(x), compulsory_traffic(x)),
          theorem_range_warning(problem, sram_bytes)};
}

Exponents standard_exponents(double, double) { return {2, 0, 0}; }
Exponents flash_exponents(double, double) { return {2, -1, 2}; }
// Square chunks b: the working set 4 d b + 2 b^2 is linear in b up to M ~ 16 d^2.
Exponents memory_efficient_exponents(double m_elements, double d) {
  return m_elements < 16 * d * d ? Exponents{2, -1, 2} : Exponents{2, -0.5, 1};
}
Exponents square_tiling_exponents(double m_elements, double d) {
  return m_elements < d * d ? Exponents{2, -0.5, 1} : Exponents{2, 0, 0};
}

Exponents theory_exponents(std::string_view schedule, double m_elements, double d) {
  return find_schedule(schedule).theory_exponents(m_elements, d);
}

}  // namespace flashlab::sim
