#include "pseudocode.hpp"

#include <algorithm>
#include <map>

namespace flashlab::viz {

bool Pseudocode::has_line(int number) const {
  return std::any_of(lines.begin(), lines.end(), [number](const PseudocodeLine& l) { return l.number == number; });
}

namespace {

// Written from the papers' algorithms in our own words; tau is the softmax scale.
std::map<std::string, Pseudocode, std::less<>> make_pseudocode() {
  std::map<std::string, Pseudocode, std::less<>> all;

  all["fa2"] = {"FlashAttention-2 forward (FA2 Algorithm 1)",
                {{0, "in HBM: Q, K, V (N x d); block sizes Br, Bc"},
                 {1, "split Q into Tr blocks of Br rows; K, V into Tc blocks of Bc rows"},
                 {2, "split O into Tr blocks of Br x d, L into Tr blocks of Br"},
                 {3, "for i = 1 .. Tr:"},
                 {4, "  load Q_i from HBM to SRAM"},
                 {5, "  on chip: O_i = 0, l_i = 0, m_i = -inf"},
                 {6, "  for j = 1 .. Tc:   (blocks hidden by the mask are skipped)"},
                 {7, "    load K_j, V_j from HBM to SRAM"},
                 {8, "    on chip: S_ij = tau Q_i K_j^T   (then the mask)"},
                 {9, "    on chip: m_new = max(m_i, rowmax(S_ij)); P_ij = exp(S_ij - m_new);\n"
                     "             l_i = exp(m_i - m_new) l_i + rowsum(P_ij)"},
                 {10, "    on chip: O_i = diag(exp(m_i - m_new)) O_i + P_ij V_j; m_i = m_new"},
                 {11, "  end for"},
                 {12, "  on chip: O_i = diag(l_i)^-1 O_i"},
                 {13, "  on chip: L_i = m_i + log(l_i)"},
                 {14, "  write O_i to HBM"},
                 {15, "  write L_i to HBM"},
                 {16, "end for"},
                 {17, "return O and the log-sum-exp L"}}};
  return all;
}

}  // namespace

const Pseudocode* find_pseudocode(std::string_view schedule) {
  static const auto all = make_pseudocode();
  auto it = all.find(schedule);
  return it == all.end() ? nullptr : &it->second;
}

}  // namespace flashlab::viz
