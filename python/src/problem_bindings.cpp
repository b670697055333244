// Problem and HeadProblem (algorithms/problem.hpp), and the limits they are held to. The fields of
// Mask, Dropout and BlockSparsity are flattened into Problem's (causal, dropout_p, block_rows,
// ...); validate() is Problem::validate, so Python gets the C++ checks and their messages.
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <stdexcept>
#include <string>

#include "algorithms/limits.hpp"
#include "algorithms/problem.hpp"
#include "bindings.hpp"
#include "sim/sweep.hpp"

namespace nb = nanobind;

namespace flashlab::python {

namespace {

const char* to_string(CausalAlignment alignment) {
  return alignment == CausalAlignment::top_left ? "top_left" : "bottom_right";
}

CausalAlignment alignment_from_string(const std::string& name) {
  if (name == "top_left") return CausalAlignment::top_left;
  if (name == "bottom_right") return CausalAlignment::bottom_right;
  throw std::invalid_argument("alignment '" + name + "' is unknown; allowed: top_left, bottom_right");
}

// An index C++ would read unchecked: refused here by name, with its range.
void require_index(const char* name, int value, int size) {
  if (value < 0 || value >= size) {
    throw std::invalid_argument(std::string(name) + " = " + std::to_string(value) + " is out of range; allowed: [0, " +
                                std::to_string(size - 1) + "]");
  }
}

// What Problem.head returns: a HeadProblem with its own copy of the Problem's block mask, so that
// changing the Problem afterwards cannot leave it reading a mask of another shape.
struct OwnedHeadProblem : HeadProblem {
  explicit OwnedHeadProblem(const HeadProblem& head) : HeadProblem(head) { own_mask(); }
  OwnedHeadProblem(const OwnedHeadProblem& other) : HeadProblem(other) { own_mask(); }
  OwnedHeadProblem& operator=(const OwnedHeadProblem&) = delete;

 private:
  void own_mask() {
    if (block_sparsity == nullptr) return;
    mask_ = *block_sparsity;
    block_sparsity = &mask_;
  }
  BlockSparsity mask_;
};

void bind_limits(nb::module_& m) {
  nb::dict limits;
  limits["max_batch"] = kMaxBatch;
  limits["max_sequence_length"] = kMaxSequenceLength;
  limits["max_heads"] = kMaxHeads;
  limits["max_head_dim"] = kMaxHeadDim;
  limits["max_packed_rows"] = kMaxPackedRows;
  limits["max_sram_bytes"] = kMaxSramBytes;
  limits["min_sweep_sram_bytes"] = kMinSweepSramBytes;
  limits["max_sweep_seqlen"] = kMaxSweepSeqlen;
  limits["max_ring_devices"] = kMaxRingDevices;
  limits["max_sweep_head_dim"] = kMaxSweepHeadDim;
  limits["max_sweep_jobs"] = sim::kMaxSweepJobs;
  limits["max_trace_events"] = kMaxTraceEvents;
  limits["max_trace_value_elements"] = kMaxTraceValueElements;
  m.attr("limits") = limits;
}

}  // namespace

void bind_problem(nb::module_& m) {
  bind_limits(m);

  nb::class_<Problem>(m, "Problem", "One attention problem (algorithms/problem.hpp); validate() checks it")
      .def(nb::init<>())
      .def_rw("batch", &Problem::batch)
      .def_rw("heads_q", &Problem::heads_q)
      .def_rw("heads_kv", &Problem::heads_kv)
      .def_rw("seqlen_q", &Problem::seqlen_q)
      .def_rw("seqlen_k", &Problem::seqlen_k)
      .def_rw("head_dim", &Problem::head_dim)
      .def_rw("head_dim_v", &Problem::head_dim_v)
      .def_rw("softmax_scale", &Problem::softmax_scale)
      .def_rw("alibi_slopes", &Problem::alibi_slopes)
      .def_rw("softcap", &Problem::softcap)
      .def_rw("cu_seqlens_q", &Problem::cu_seqlens_q)
      .def_rw("cu_seqlens_k", &Problem::cu_seqlens_k)
      .def_prop_rw("dtype", [](const Problem& p) { return std::string(to_string(p.dtype)); },
                   [](Problem& p, const std::string& name) { p.dtype = dtype_from_string(name); })
      .def_prop_rw("causal", [](const Problem& p) { return p.mask.causal; }, [](Problem& p, bool v) { p.mask.causal = v; })
      .def_prop_rw("alignment", [](const Problem& p) { return std::string(to_string(p.mask.alignment)); },
                   [](Problem& p, const std::string& name) { p.mask.alignment = alignment_from_string(name); })
      .def_prop_rw("window_left", [](const Problem& p) { return p.mask.window_left; },
                   [](Problem& p, int v) { p.mask.window_left = v; })
      .def_prop_rw("window_right", [](const Problem& p) { return p.mask.window_right; },
                   [](Problem& p, int v) { p.mask.window_right = v; })
      .def_prop_rw("dropout_p", [](const Problem& p) { return p.dropout.probability; },
                   [](Problem& p, float v) { p.dropout.probability = v; })
      .def_prop_rw("dropout_seed", [](const Problem& p) { return p.dropout.seed; },
                   [](Problem& p, std::uint64_t v) { p.dropout.seed = v; })
      .def_prop_rw("dropout_offset", [](const Problem& p) { return p.dropout.offset; },
                   [](Problem& p, std::uint64_t v) { p.dropout.offset = v; })
      .def_prop_rw("block_rows", [](const Problem& p) { return p.block_sparsity.block_rows; },
                   [](Problem& p, int v) { p.block_sparsity.block_rows = v; })
      .def_prop_rw("block_cols", [](const Problem& p) { return p.block_sparsity.block_cols; },
                   [](Problem& p, int v) { p.block_sparsity.block_cols = v; })
      .def_prop_rw("row_blocks", [](const Problem& p) { return p.block_sparsity.row_blocks; },
                   [](Problem& p, int v) { p.block_sparsity.row_blocks = v; })
      .def_prop_rw("col_blocks", [](const Problem& p) { return p.block_sparsity.col_blocks; },
                   [](Problem& p, int v) { p.block_sparsity.col_blocks = v; })
      .def_prop_rw("block_keep", [](const Problem& p) { return p.block_sparsity.keep; },
                   [](Problem& p, const std::vector<std::uint8_t>& keep) { p.block_sparsity.keep = keep; })
      .def("validate", &Problem::validate, "raises ValueError naming the input and its allowed range")
      .def("scale", &Problem::scale, "the softmax scale (1 / sqrt(head_dim) when softmax_scale is 0)")
      .def("value_dim", &Problem::value_dim)
      .def("varlen", &Problem::varlen)
      .def("group_size", &Problem::group_size)
      .def("total_rows_q", &Problem::total_rows_q)
      .def("total_rows_k", &Problem::total_rows_k)
      .def("set_varlen", [](Problem& p, const std::vector<int>& seqlens_q, const std::vector<int>& seqlens_k) {
        set_varlen(p, seqlens_q, seqlens_k);
      }, nb::arg("seqlens_q"), nb::arg("seqlens_k"), "a varlen batch from per-sequence lengths (fills cu_seqlens_*)")
      .def("head", [](const Problem& p, int batch_index, int head_index) {
        p.validate();
        require_index("batch_index", batch_index, p.batch);
        require_index("head_index", head_index, p.heads_q);
        return OwnedHeadProblem(head_problem(p, batch_index, head_index));
      }, nb::arg("batch_index"), nb::arg("head_index"),
         "the HeadProblem of one (sequence, query head), with its own copy of the block mask");

  nb::enum_<HeadProblem::BlockCoverage>(m, "BlockCoverage")
      .value("empty", HeadProblem::BlockCoverage::empty)
      .value("partial", HeadProblem::BlockCoverage::partial)
      .value("full", HeadProblem::BlockCoverage::full);

  // Read-only: a HeadProblem is made from its Problem (Problem.head).
  nb::class_<HeadProblem>(m, "HeadProblem", "One (sequence, head) of a Problem: what a schedule sees")
      .def_ro("batch_index", &HeadProblem::batch_index)
      .def_ro("head_index", &HeadProblem::head_index)
      .def_ro("seqlen_q", &HeadProblem::seqlen_q)
      .def_ro("seqlen_k", &HeadProblem::seqlen_k)
      .def_ro("head_dim", &HeadProblem::head_dim)
      .def_ro("head_dim_v", &HeadProblem::head_dim_v)
      .def_ro("scale", &HeadProblem::scale)
      .def_ro("alibi_slope", &HeadProblem::alibi_slope)
      .def_ro("softcap", &HeadProblem::softcap)
      .def_prop_ro("dtype", [](const HeadProblem& h) { return std::string(to_string(h.dtype)); })
      .def_prop_ro("causal", [](const HeadProblem& h) { return h.mask.causal; })
      .def_prop_ro("window_left", [](const HeadProblem& h) { return h.mask.window_left; })
      .def_prop_ro("window_right", [](const HeadProblem& h) { return h.mask.effective_window_right(); })
      .def("diagonal_offset", &HeadProblem::diagonal_offset, "query i is aligned with key i + diagonal_offset()")
      .def("key_visible", [](const HeadProblem& h, int row, int col) {
        require_index("row", row, h.seqlen_q);
        require_index("col", col, h.seqlen_k);
        return h.key_visible(row, col);
      }, nb::arg("row"), nb::arg("col"))
      .def("dropout_keeps", [](const HeadProblem& h, int row, int col) {
        require_index("row", row, h.seqlen_q);
        require_index("col", col, h.seqlen_k);
        return h.dropout_keeps(row, col);
      }, nb::arg("row"), nb::arg("col"))
      .def("visible_key_range", [](const HeadProblem& h, int row_begin, int row_end) {
        require_index("row_begin", row_begin, h.seqlen_q);
        if (row_end <= row_begin || row_end > h.seqlen_q) {
          throw std::invalid_argument("row_end = " + std::to_string(row_end) + " is out of range; allowed: [row_begin + 1, " +
                                      std::to_string(h.seqlen_q) + "]");
        }
        return h.visible_key_range(row_begin, row_end);
      }, nb::arg("row_begin"), nb::arg("row_end"), "the keys [first, last) the rows can see")
      .def("coverage", [](const HeadProblem& h, int row_begin, int row_end, int col_begin, int col_end) {
        require_index("row_begin", row_begin, h.seqlen_q);
        require_index("col_begin", col_begin, h.seqlen_k);
        if (row_end <= row_begin || row_end > h.seqlen_q) {
          throw std::invalid_argument("row_end = " + std::to_string(row_end) + " is out of range; allowed: [row_begin + 1, " +
                                      std::to_string(h.seqlen_q) + "]");
        }
        if (col_end <= col_begin || col_end > h.seqlen_k) {
          throw std::invalid_argument("col_end = " + std::to_string(col_end) + " is out of range; allowed: [col_begin + 1, " +
                                      std::to_string(h.seqlen_k) + "]");
        }
        return h.coverage(row_begin, row_end, col_begin, col_end);
      }, nb::arg("row_begin"), nb::arg("row_end"), nb::arg("col_begin"), nb::arg("col_end"),
         "whether the block is empty, partially or fully visible");
  nb::class_<OwnedHeadProblem, HeadProblem>(m, "_OwnedHeadProblem");
}

}  // namespace flashlab::python
