#include "run_schedule.hpp"

namespace flashlab {

namespace {
HbmMatrix view_or_empty(HostTensor& t, int head, int first_row, int length) {
  if (t.values.empty()) return {t.id, t.dtype, nullptr, 0, 0, 0};
  return t.head_view(head, first_row, length);
}
}  // namespace

HeadTensors head_tensors(AttentionTensors& t, const Problem& problem, int b, int h) {
  const int row_q = problem.first_row_q(b), length_q = problem.seqlen_q_of(b);
  const int row_k = problem.first_row_k(b), length_k = problem.seqlen_k_of(b);
  const int kv = problem.kv_head(h);
  HeadTensors views;
  views.Q = view_or_empty(t.Q, h, row_q, length_q);
  views.K = view_or_empty(t.K, kv, row_k, length_k);
  views.V = view_or_empty(t.V, kv, row_k, length_k);
  views.O = view_or_empty(t.O, h, row_q, length_q);
  views.LSE = view_or_empty(t.LSE, h, row_q, length_q);
  views.dO = view_or_empty(t.dO, h, row_q, length_q);
  views.dQ = view_or_empty(t.dQ, h, row_q, length_q);
  views.dK = view_or_empty(t.dK, kv, row_k, length_k);
  views.dV = view_or_empty(t.dV, kv, row_k, length_k);
  return views;
}

}  // namespace flashlab
