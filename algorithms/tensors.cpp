#include "tensors.hpp"

namespace flashlab {

const char* to_string(TensorId id) {
  switch (id) {
    case TensorId::Q: return "Q";
    case TensorId::K: return "K";
    case TensorId::V: return "V";
    case TensorId::O: return "O";
    case TensorId::LSE: return "LSE";
    case TensorId::dO: return "dO";
    case TensorId::dQ: return "dQ";
    case TensorId::dK: return "dK";
    case TensorId::dV: return "dV";
    case TensorId::D: return "D";
    case TensorId::S: return "S";
    case TensorId::P: return "P";
    case TensorId::dS: return "dS";
    case TensorId::dP: return "dP";
    case TensorId::m: return "m";
    case TensorId::l: return "l";
    case TensorId::O_partial: return "O_partial";
    case TensorId::LSE_partial: return "LSE_partial";
    case TensorId::A: return "A";
    case TensorId::X: return "X";
    case TensorId::Y: return "Y";
    case TensorId::page_table: return "page_table";
    case TensorId::count: break;
  }
  return "?";
}


AttentionTensors AttentionTensors::allocate(const Problem& problem, bool with_backward) {
  const int rows_q = problem.total_rows_q(), rows_k = problem.total_rows_k();
  const DType dtype = problem.dtype;
  AttentionTensors t;
  t.Q = HostTensor(TensorId::Q, dtype, rows_q, problem.heads_q, problem.head_dim);
  t.K = HostTensor(TensorId::K, dtype, rows_k, problem.heads_kv, problem.head_dim);
  t.V = HostTensor(TensorId::V, dtype, rows_k, problem.heads_kv, problem.value_dim());
  t.O = HostTensor(TensorId::O, dtype, rows_q, problem.heads_q, problem.value_dim());
  t.LSE = HostTensor(TensorId::LSE, DType::fp32, rows_q, problem.heads_q, 1);
  if (with_backward) {
    t.dO = HostTensor(TensorId::dO, dtype, rows_q, problem.heads_q, problem.value_dim());
    t.dQ = HostTensor(TensorId::dQ, dtype, rows_q, problem.heads_q, problem.head_dim);
    t.dK = HostTensor(TensorId::dK, dtype, rows_k, problem.heads_kv, problem.head_dim);
    t.dV = HostTensor(TensorId::dV, dtype, rows_k, problem.heads_kv, problem.value_dim());
  }
  return t;
}

}  // namespace flashlab
