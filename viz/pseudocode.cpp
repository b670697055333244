#include "pseudocode.hpp"

#include <algorithm>
#include <map>
#include <string>

namespace flashlab::viz {

bool Pseudocode::has_line(int number) const {
  return std::any_of(lines.begin(), lines.end(), [number](const PseudocodeLine& l) { return l.number == number; });
}

namespace {

// Written from the papers' algorithms in our own words; tau is the softmax scale.
std::map<std::string, Pseudocode, std::less<>> make_pseudocode() {
  std::map<std::string, Pseudocode, std::less<>> all;

  all["standard"] = {"Standard attention (FA1 Algorithm 0): S and P go through HBM",
                     {{0, "in HBM: Q, K, V (N x d)"},
                      {1, "load Q, K by blocks; S = tau Q K^T (masked); write S to HBM"},
                      {2, "read S by blocks: row max m, sum l; read S again; write P = exp(S - m) / l (and LSE)"},
                      {3, "load P, V by blocks; O = P V; write O to HBM"},
                      {4, "return O"}}};

  all["fa1"] = {"FlashAttention forward (FA1 Algorithm 1; mask and dropout of Algorithm 2)",
                {{0, "in HBM: Q, K, V (N x d); SRAM of M bytes"},
                 {1, "Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d)"},
                 {2, "O = 0, l = 0, m = -inf in HBM"},
                 {3, "split Q into Tr blocks of Br rows; K, V into Tc blocks of Bc rows"},
                 {4, "split O, l, m into Tr blocks"},
                 {5, "for j = 1 .. Tc:"},
                 {6, "  load K_j, V_j from HBM to SRAM"},
                 {7, "  for i = 1 .. Tr:"},
                 {8, "    load Q_i, O_i, l_i, m_i from HBM to SRAM"},
                 {9, "    on chip: S_ij = tau Q_i K_j^T (then the mask)"},
                 {10, "    on chip: m~ = rowmax(S_ij), P~ = exp(S_ij - m~), l~ = rowsum(P~)"},
                 {11, "    on chip: m_new = max(m_i, m~),\n"
                      "             l_new = exp(m_i - m_new) l_i + exp(m~ - m_new) l~"},
                 {12, "    write O_i = diag(l_new)^-1 (diag(l_i) exp(m_i - m_new) O_i\n"
                      "                    + exp(m~ - m_new) P~ V_j) to HBM   (P~ after dropout)"},
                 {13, "    write l_i = l_new, m_i = m_new to HBM"},
                 {14, "  end for"},
                 {15, "end for"},
                 {16, "return O"}}};

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

  all["standard_backward"] = {"Standard attention backward (FA1 Algorithm 3): P, dP, dS go through HBM",
                              {{0, "in HBM: Q, K, V, dO and P (N x N, from the forward pass)"},
                               {1, "load P, dO by blocks; dV = P^T dO; write dV to HBM"},
                               {2, "load dO, V by blocks; dP = dO V^T; write dP to HBM"},
                               {3, "read P, dP by blocks: D = rowsum(P * dP); again: dS = P * (dP - D); write dS"},
                               {4, "load dS, K by blocks; dQ = dS K; write dQ to HBM"},
                               {5, "load dS, Q by blocks; dK = dS^T Q; write dK to HBM"},
                               {6, "return dQ, dK, dV"}}};

  all["fa1_backward"] = {"FlashAttention backward (FA1 Algorithm 4)",
                         {{0, "in HBM: Q, K, V, O, dO; l, m from the forward pass"},
                          {1, "set the dropout generator to the forward's state R"},
                          {2, "Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d)"},
                          {3, "split Q into Tr blocks; K, V into Tc blocks"},
                          {4, "split O, dO, l, m into Tr blocks"},
                          {5, "dQ = 0, dK = 0, dV = 0 in HBM"},
                          {6, "for j = 1 .. Tc:"},
                          {7, "  load K_j, V_j from HBM to SRAM"},
                          {8, "  on chip: dK~_j = 0, dV~_j = 0"},
                          {9, "  for i = 1 .. Tr:"},
                          {10, "    load Q_i, O_i, dO_i, dQ_i, l_i, m_i from HBM to SRAM"},
                          {11, "    on chip: S_ij = tau Q_i K_j^T"},
                          {12, "    on chip: S_ij = MASK(S_ij)"},
                          {13, "    on chip: P_ij = diag(l_i)^-1 exp(S_ij - m_i)"},
                          {14, "    on chip: dropout mask Z_ij"},
                          {15, "    on chip: P_ij^dropped = P_ij * Z_ij"},
                          {16, "    on chip: dV~_j += (P_ij^dropped)^T dO_i"},
                          {17, "    on chip: dP_ij^dropped = dO_i V_j^T"},
                          {18, "    on chip: dP_ij = dP_ij^dropped * Z_ij"},
                          {19, "    on chip: D_i = rowsum(dO_i * O_i)"},
                          {20, "    on chip: dS_ij = P_ij * (dP_ij - D_i)"},
                          {21, "    write dQ_i = dQ_i + tau dS_ij K_j to HBM"},
                          {22, "    on chip: dK~_j += tau dS_ij^T Q_i"},
                          {23, "  end for"},
                          {24, "  write dK_j = dK~_j, dV_j = dV~_j to HBM"},
                          {25, "end for"},
                          {26, "return dQ, dK, dV"}}};

  all["fa2_backward"] = {"FlashAttention-2 backward (FA2 Algorithm 2)",
                         {{0, "in HBM: Q, K, V, O, dO and the log-sum-exp L"},
                          {1, "split Q into Tr blocks of Br rows; K, V into Tc blocks of Bc rows"},
                          {2, "split O, dO into Tr blocks, L into Tr blocks"},
                          {3, "dQ = 0 in HBM, split into Tr blocks; split dK, dV into Tc blocks"},
                          {4, "D = rowsum(dO * O); write D to HBM, split into Tr blocks"},
                          {5, "for j = 1 .. Tc:"},
                          {6, "  load K_j, V_j from HBM to SRAM"},
                          {7, "  on chip: dK_j = 0, dV_j = 0"},
                          {8, "  for i = 1 .. Tr:   (blocks hidden by the mask are skipped)"},
                          {9, "    load Q_i, dO_i, L_i, D_i from HBM to SRAM"},
                          {10, "    on chip: S_ij = tau Q_i K_j^T (then the mask)"},
                          {11, "    on chip: P_ij = exp(S_ij - L_i)"},
                          {12, "    on chip: dV_j += P_ij^T dO_i"},
                          {13, "    on chip: dP_ij = dO_i V_j^T"},
                          {14, "    on chip: dS_ij = P_ij * (dP_ij - D_i)"},
                          {15, "    load dQ_i; dQ_i += tau dS_ij K_j; write dQ_i to HBM"},
                          {16, "    on chip: dK_j += tau dS_ij^T Q_i"},
                          {17, "  end for"},
                          {18, "  write dK_j, dV_j to HBM"},
                          {19, "end for"},
                          {20, "return dQ, dK, dV"}}};

  all["split_kv"] = {"Split-KV decoding (Flash-Decoding)",
                     {{1, "for each KV chunk c and each query block Q_i (in parallel on a GPU):"},
                      {2, "  load Q_i; on chip O = 0, l = 0, m = -inf"},
                      {3, "  for each key block j of chunk c the mask does not hide:"},
                      {4, "    load K_j, V_j"},
                      {5, "    S = tau Q_i K_j^T, masked"},
                      {6, "    online softmax update of (m, l, O) with S and V_j"},
                      {7, "  O_c = diag(l)^-1 O, LSE_c = m + log(l); write both to HBM"},
                      {8, "for each query row r (the combine):"},
                      {9, "  load LSE_partial[r, :] and O_partial[r, :, :]"},
                      {10, "  m = max_c LSE_c, l = sum_c e^(LSE_c - m), O = sum_c e^(LSE_c - m) O_c"},
                      {11, "  write O_r = O / l and LSE_r = m + log(l)"}}};

  all["block_sparse"] = {"Block-sparse FlashAttention (FA1 Algorithm 5)",
                         {{0, "in HBM: Q, K, V; block sizes Br, Bc; block mask M~ (Tr x Tc)"},
                          {1, "initialise the dropout generator state R"},
                          {2, "O = 0, l = 0, m = -inf in HBM"},
                          {3, "split Q into Tr blocks; K, V into Tc blocks"},
                          {4, "split O, l, m into Tr blocks"},
                          {5, "for j = 1 .. Tc:"},
                          {6, "  load K_j, V_j from HBM to SRAM"},
                          {7, "  for i = 1 .. Tr:"},
                          {8, "    if M~_ij != 0:   (otherwise the tile is skipped)"},
                          {9, "      load Q_i, O_i, l_i, m_i from HBM to SRAM"},
                          {10, "      on chip: S_ij = tau Q_i K_j^T"},
                          {11, "      on chip: S_ij = MASK(S_ij)"},
                          {12, "      on chip: m~ = rowmax(S_ij), P~ = exp(S_ij - m~), l~ = rowsum(P~)"},
                          {13, "      on chip: m_new = max(m_i, m~), l_new = e^(m_i - m_new) l_i + e^(m~ - m_new) l~"},
                          {14, "      on chip: P~ = dropout(P~)"},
                          {15, "      write O_i = diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~ - m_new) P~ V_j)"},
                          {16, "      write l_i = l_new, m_i = m_new to HBM"},
                          {17, "    end if"},
                          {18, "  end for"},
                          {19, "end for"},
                          {20, "return O"}}};

  all["memory_efficient"] = {"Memory-efficient attention (Rabe and Staats 2021)",
                             {{1, "for each query chunk Q_i:"},
                              {2, "  load Q_i"},
                              {3, "  for each key chunk j:"},
                              {4, "    load K_j, V_j; s = tau Q_i K_j^T, masked"},
                              {5, "    m_j = rowmax(s), P = exp(s - m_j), l_j = rowsum(P), values_j = P V_j"},
                              {6, "    write values_j, l_j, m_j to HBM"},
                              {7, "  m = -inf; for each key chunk: load m_j, m = max(m, m_j)"},
                              {8, "  O = 0, l = 0; for each key chunk: load m_j, l_j, values_j;\n"
                                  "    O += e^(m_j - m) values_j, l += e^(m_j - m) l_j"},
                              {9, "  write O_i = O / l and LSE_i = m + log(l)"}}};

  all["square_tiling"] = {"Square tiling for small SRAM (Saha and Ye 2024, Algorithm 1)",
                          {{1, "B = floor(sqrt(M / 4))"},
                           {2, "for each row tile i: l_i = 0 on chip"},
                           {3, "  for each column tile j: S_ij = 0"},
                           {4, "    for each slice t of d: load Q_(i,t), K_(j,t); S_ij += Q_(i,t) K_(j,t)^T"},
                           {5, "    A_ij = exp(tau S_ij, masked); l_i += rowsum(A_ij); write A_ij to HBM"},
                           {6, "  write l_i and LSE_i = log(l_i)"},
                           {7, "for each row tile i and column tile c of the value dim: O_ic = 0"},
                           {8, "  for each column tile j: load A_ij, V_(j,c); O_ic += A_ij V_(j,c)"},
                           {9, "  load l_i; write O_ic / l_i"}}};

  // The variants: one line changes.
  const auto variant = [&](const std::string& base, std::string title, int number, std::string text) {
    Pseudocode code = all.at(base);
    code.title = std::move(title);
    for (PseudocodeLine& line : code.lines)
      if (line.number == number) line.text = text;
    return code;
  };
  all["fa1_skip"] = variant("fa1", "FlashAttention forward, hidden blocks skipped (FA1 Algorithm 1, as the FA1 kernel)", 7,
                            "  for i = 1 .. Tr:   (blocks hidden by the mask are skipped)");
  all["fa2_backward_atomic"] = variant("fa2_backward", "FlashAttention-2 backward, dQ by atomics (FA2 Algorithm 2, as the FA2 kernel)",
                                       15, "    dQ_i += tau dS_ij K_j by atomic adds in HBM (dQ_i never read)");
  return all;
}

}  // namespace

const Pseudocode* find_pseudocode(std::string_view schedule) {
  static const auto all = make_pseudocode();
  auto it = all.find(schedule);
  return it == all.end() ? nullptr : &it->second;
}

}  // namespace flashlab::viz
