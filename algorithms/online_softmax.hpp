// The online-softmax recurrence of FlashAttention, written once and shared by every tiled
// forward schedule (FA2 Algorithm 1, lines 5 and 9-13; Milakov and Gimelshein 2018).
#pragma once

#include "tile_memory.hpp"

namespace flashlab {

// The running state of one query block, all on chip: max m, sum l, unnormalised output o.
struct SoftmaxState {
  Tile m, l, o;
};

// FA2 Algorithm 1, line 5: O = 0, l = 0, m = -inf.
template <class Memory>
SoftmaxState start_softmax_state(Memory& mem, Range rows, int value_dim) {
  return {mem.vector(TensorId::m, rows, kNegInf), mem.vector(TensorId::l, rows, 0.0f),
          mem.zeros(TensorId::O, rows, {0, value_dim})};
}

// FA2 Algorithm 1, lines 9-10: fold one score tile S and its value tile V into the state.
//   m_new = max(m, rowmax(S)),  P = exp(S - m_new),  l = exp(m - m_new) l + rowsum(P),
//   o = diag(exp(m - m_new)) o + P V.
// Dropout (FA1 Algorithm 2) drops from P after its row sum, so l still normalises the undropped
// probabilities.
template <class Memory>
void online_softmax_update(Memory& mem, SoftmaxState& state, const Tile& s, const Tile& v, const HeadProblem& head) {
  Tile m_new = mem.row_max(TensorId::m, s);
  mem.maximum(m_new, state.m);
  Tile p = mem.exp_minus_row(TensorId::P, s, m_new);
  Tile rescale = mem.exp_difference(TensorId::m, state.m, m_new);
  Tile p_row_sum = mem.row_sum(TensorId::l, p);
  mem.scale_rows(state.l, rescale);
  mem.add(state.l, p_row_sum);
  mem.apply_dropout(p, head);
  mem.scale_rows(state.o, rescale);
  mem.multiply_add(state.o, p, Transpose::no, v, Transpose::no);
  state.m = std::move(m_new);
  mem.note_softmax_state(state.m, state.l, rescale);
}

// FA2 Algorithm 1, lines 12-13: O = diag(l)^-1 o (in place) and returns L = m + log(l).
// A fully masked row has l = 0: its output is 0 and its LSE is -inf.
template <class Memory>
Tile finish_softmax_state(Memory& mem, SoftmaxState& state) {
  mem.divide_rows(state.o, state.l);
  return mem.log_sum_exp(TensorId::LSE, state.m, state.l);
}

// The log-sum-exp combine of two partial results of the same query rows, each normalised over
// its own keys (Flash-Decoding's combine of two chunks; Ring Attention's merge after each step,
// 12_ring_attention.hpp). A partial (O_a, LSE_a) is the online-softmax state m = LSE_a, l = 1,
// o = O_a, so the merge is the update above with a state for a tile:
//   m = max(LSE, LSE_b),  l = e^(LSE - m) + e^(LSE_b - m),
//   O = (e^(LSE - m) O + e^(LSE_b - m) O_b) / l,  LSE = m + log(l).
// In place on (o, lse); o_b is scaled in place. A row that no key reached yet (LSE = -inf, O = 0)
// takes the other partial whole; a row with both at -inf stays O = 0, LSE = -inf.
template <class Memory>
void combine_by_lse(Memory& mem, Tile& o, Tile& lse, Tile& o_b, const Tile& lse_b) {
  Tile m = mem.copy(TensorId::m, lse);
  mem.maximum(m, lse_b);
  Tile weight = mem.exp_difference(TensorId::l, lse, m);
  Tile weight_b = mem.exp_difference(TensorId::l, lse_b, m);
  mem.scale_rows(o, weight);
  mem.scale_rows(o_b, weight_b);
  mem.add(o, o_b);
  mem.add(weight, weight_b);  // l
  mem.divide_rows(o, weight);
  lse = mem.log_sum_exp(TensorId::LSE, m, weight);
}

}  // namespace flashlab
