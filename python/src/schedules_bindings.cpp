// flashlab.schedules from C++: the tile-memory interface (algorithms/tile_memory.hpp) itself, so a
// schedule written in Python runs on the same memory models as the built-in ones: DataMemory
// (values, the CPU reference) and ShapeMemory (shapes only), each optionally reporting to the
// trace recorder (sim/trace.hpp). Both classes have the same methods with the C++ names and
// argument order, so one Python schedule runs unchanged on either.
//
// Lifetimes: a Tile keeps its memory model alive, a memory model its recorder, an HBM view its
// tensors. A tile's SRAM is released when Python drops the last reference to it (or at
// tile.free()), which is where a C++ tile would leave its scope.
//
// Every argument C++ would guarantee by type or scope is checked (schedule_arguments.hpp); a
// misuse raises ValueError with the C++ message, an SRAM overflow raises SramOverflow with the
// arena's message. Problem, HeadProblem, BlockCoverage, Trace and the exceptions SramOverflow and
// TraceOverflow are bound by problem_bindings.cpp and sim_bindings.cpp; counters come back as the
// simulator's records (sim/report.hpp).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/operators.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "algorithms/00_oracle.hpp"
#include "algorithms/checked_math.hpp"
#include "algorithms/limits.hpp"
#include "algorithms/online_softmax.hpp"
#include "algorithms/run_backward.hpp"
#include "algorithms/run_schedule.hpp"
#include "algorithms/tile_memory.hpp"
#include "bindings.hpp"
#include "json_to_python.hpp"
#include "schedule_arguments.hpp"
#include "sim/check.hpp"
#include "sim/report.hpp"
#include "sim/schedules.hpp"
#include "sim/trace.hpp"
#include "viz/replay.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace flashlab::python {
namespace {

// ---------------------------------------------------------------------------------------------
// Checks on whole-problem inputs

void require_index(const char* name, int value, int count, const char* count_name) {
  if (value < 0 || value >= count) {
    throw std::invalid_argument(std::string(name) + " = " + std::to_string(value) + "; allowed: 0.." +
                                std::to_string(count - 1) + " (" + count_name + " = " + std::to_string(count) + ")");
  }
}

void require_tensor_shape(const HostTensor& t, int rows, int heads, int dim, bool optional) {
  if (optional && t.values.empty()) return;
  if (t.rows != rows || t.heads != heads || t.dim != dim) {
    throw std::invalid_argument(std::string("tensors: ") + to_string(t.id) + " is " + std::to_string(t.rows) + " x " +
                                std::to_string(t.heads) + " x " + std::to_string(t.dim) + "; allowed: " +
                                std::to_string(rows) + " x " + std::to_string(heads) + " x " + std::to_string(dim) +
                                " (rows x heads x dim of the problem)");
  }
}

// The tensors were allocated for this problem: every head view lies inside them.
void require_tensors_of(const AttentionTensors& t, const Problem& p) {
  const int rq = p.total_rows_q(), rk = p.total_rows_k(), d = p.head_dim, dv = p.value_dim();
  require_tensor_shape(t.Q, rq, p.heads_q, d, false);
  require_tensor_shape(t.K, rk, p.heads_kv, d, false);
  require_tensor_shape(t.V, rk, p.heads_kv, dv, false);
  require_tensor_shape(t.O, rq, p.heads_q, dv, false);
  require_tensor_shape(t.LSE, rq, p.heads_q, 1, false);
  require_tensor_shape(t.dO, rq, p.heads_q, dv, true);
  require_tensor_shape(t.dQ, rq, p.heads_q, d, true);
  require_tensor_shape(t.dK, rk, p.heads_kv, d, true);
  require_tensor_shape(t.dV, rk, p.heads_kv, dv, true);
}

// A data run holds its tensors in host memory (fp32): bounded like the simulator's data runs.
void require_tensor_memory(const Problem& p) {
  const CheckedInt64 rq = p.total_rows_q(), rk = p.total_rows_k(), d = p.head_dim, dv = p.value_dim();
  const CheckedInt64 elements = rq * p.heads_q * (d + dv + 1) + rk * p.heads_kv * (d + dv);  // Q, O, LSE; K, V
  const CheckedInt64 bytes = elements * CheckedInt64(sizeof(float));
  if (bytes.value() > kMaxDataBytes) {
    throw std::invalid_argument("tensors of the problem: " + std::to_string(bytes.value()) +
                                " bytes of host memory; allowed: at most " + std::to_string(kMaxDataBytes) +
                                " (count it with memory='shape', without data, or run a smaller problem)");
  }
}

// ---------------------------------------------------------------------------------------------
// numpy

using FloatArray = nb::ndarray<nb::numpy, float>;
using ConstFloatArray = nb::ndarray<nb::numpy, const float>;

// A read-only view that keeps `owner` alive.
ConstFloatArray view(const float* data, std::initializer_list<size_t> shape, std::initializer_list<int64_t> strides,
                     nb::handle owner) {
  return ConstFloatArray(data, shape, owner, strides);
}

// A fresh array holding a copy of a tile's values.
FloatArray copy_of(const RowMajorMatrix& values) {
  auto* data = new float[static_cast<std::size_t>(values.size())];
  std::copy(values.data(), values.data() + values.size(), data);
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  return FloatArray(data, {static_cast<size_t>(values.rows()), static_cast<size_t>(values.cols())}, owner);
}

ConstFloatArray host_tensor_view(nb::handle owner, const HostTensor& t) {
  if (t.values.empty()) throw std::invalid_argument(std::string(to_string(t.id)) + " is not allocated in these tensors");
  return view(t.values.data(), {size_t(t.rows), size_t(t.heads), size_t(t.dim)},
              {int64_t(t.heads) * t.dim, int64_t(t.dim), 1}, owner);
}

// Copies a [rows, heads, dim] float32 array into a tensor, rounded to the tensor's dtype.
void assign_host_tensor(HostTensor& t, nb::ndarray<const float, nb::ndim<3>, nb::c_contig, nb::device::cpu> values) {
  if (t.values.empty()) throw std::invalid_argument(std::string(to_string(t.id)) + " is not allocated in these tensors");
  if (values.shape(0) != size_t(t.rows) || values.shape(1) != size_t(t.heads) || values.shape(2) != size_t(t.dim)) {
    throw std::invalid_argument(std::string("assign ") + to_string(t.id) + ": an array of " +
                                std::to_string(values.shape(0)) + " x " + std::to_string(values.shape(1)) + " x " +
                                std::to_string(values.shape(2)) + "; allowed: " + std::to_string(t.rows) + " x " +
                                std::to_string(t.heads) + " x " + std::to_string(t.dim) + " (rows x heads x dim)");
  }
  const float* source = values.data();
  for (std::size_t i = 0; i < t.values.size(); ++i) t.values[i] = round_to(t.dtype, source[i]);
}

// ---------------------------------------------------------------------------------------------
// The memory models

template <class Memory>
Tile load(Memory& mem, const HbmMatrix& source, Range rows, std::optional<Range> cols) {
  require_hbm_data<Memory>(source, "load");
  return cols ? mem.load(source, rows, *cols) : mem.load(source, rows);
}

template <class Memory>
void store(Memory& mem, const HbmMatrix& destination, Range rows, std::optional<Range> cols, const Tile& tile) {
  held(mem, tile, "store", "tile");
  require_hbm_data<Memory>(destination, "store");
  if (cols) {
    mem.store(destination, rows, *cols, tile);
  } else {
    mem.store(destination, rows, tile);
  }
}

// TileMemory::matmul, whose result (rows of op(a), cols of op(b)) a data run must be able to hold.
template <class Memory>
Tile matmul(Memory& mem, const char* op, TensorId result, const Tile& a, Transpose ta, const Tile& b, Transpose tb,
            float alpha) {
  held(mem, a, op, "a");
  held(mem, b, op, "b");
  require_tile_sizes<Memory>(ta == Transpose::yes ? a.cols() : a.rows(), tb == Transpose::yes ? b.rows() : b.cols(), op);
  return mem.matmul(result, a, ta, b, tb, alpha);
}

template <class Memory>
void bind_memory(nb::module_& m, const char* name, const char* doc) {
  using M = Memory;
  constexpr auto alive = nb::keep_alive<0, 1>();  // a tile keeps its memory model alive
  nb::class_<M>(m, name, doc)
      .def(
          "__init__",
          [](M* self, const std::string& dtype, std::int64_t sram_bytes, TraceRecorder* trace) {
            if (sram_bytes < 0 || sram_bytes > kMaxSramBytes) {
              throw std::invalid_argument("sram_bytes = " + std::to_string(sram_bytes) + "; allowed: 0.." +
                                          std::to_string(kMaxSramBytes) + " (0: unbounded)");
            }
            new (self) M(MemoryConfig{dtype_from_string(dtype), sram_bytes}, trace);
          },
          "dtype"_a = "fp32", "sram_bytes"_a = 0, "trace"_a = nb::none(), nb::keep_alive<1, 4>(),
          "A memory model: dtype of inputs, outputs and score tiles; sram_bytes is M, the arena's capacity (0: "
          "unbounded); trace: a TraceRecorder that receives every event.")
      .def_ro_static("with_data", &M::with_data)
      .def("counters", &M::counters, "The counters so far, with the SRAM peak filled in.")
      .def_prop_ro("dtype", [](const M& mem) { return std::string(to_string(mem.config().dtype)); })
      .def_prop_ro("sram_bytes", [](const M& mem) { return mem.config().sram_capacity_bytes; })
      .def_prop_ro("sram_in_use_bytes", &M::sram_in_use_bytes)
      .def("tile_dtype", [](const M& mem, TensorId id) { return std::string(to_string(mem.tile_dtype(id))); }, "id"_a)
      .def("holds", &M::holds, "tile"_a, "Whether the tile lives in this model's SRAM.")
      // Movement between HBM and SRAM
      .def("load", &load<M>, "source"_a, "rows"_a, "cols"_a = nb::none(), alive,
           "A tile of rows x cols (default: all columns) moves HBM -> SRAM.")
      .def(
          "store",
          [](M& mem, const HbmMatrix& destination, Range rows, const Tile& tile) {
            store(mem, destination, rows, std::nullopt, tile);
          },
          "destination"_a, "rows"_a, "tile"_a, "A tile moves SRAM -> HBM (all columns), rounded to the tensor's dtype.")
      .def(
          "store",
          [](M& mem, const HbmMatrix& destination, Range rows, Range cols, const Tile& tile) {
            store(mem, destination, rows, cols, tile);
          },
          "destination"_a, "rows"_a, "cols"_a, "tile"_a)
      // Tiles made on chip
      .def(
          "filled",
          [](M& mem, TensorId id, Range rows, Range cols, float value) {
            require_tile_sizes<M>(rows, cols, "filled");
            return mem.filled(id, rows, cols, value);
          },
          "id"_a, "rows"_a, "cols"_a, "value"_a, alive)
      .def(
          "zeros",
          [](M& mem, TensorId id, Range rows, Range cols) {
            require_tile_sizes<M>(rows, cols, "zeros");
            return mem.zeros(id, rows, cols);
          },
          "id"_a, "rows"_a, "cols"_a, alive)
      .def(
          "vector",
          [](M& mem, TensorId id, Range rows, float value) {
            require_tile_sizes<M>(rows, {0, 1}, "vector");
            return mem.vector(id, rows, value);
          },
          "id"_a, "rows"_a, "value"_a, alive, "A statistics vector (one value per row), e.g. m = -inf.")
      .def(
          "copy", [](M& mem, TensorId id, const Tile& source) { return mem.copy(id, held(mem, source, "copy", "source")); },
          "id"_a, "source"_a, alive)
      // Matrix products
      .def(
          "matmul",
          [](M& mem, TensorId result, const Tile& a, Transpose ta, const Tile& b, Transpose tb, float alpha) {
            return matmul(mem, "matmul", result, a, ta, b, tb, alpha);
          },
          "result"_a, "a"_a, "ta"_a, "b"_a, "tb"_a, "alpha"_a = 1.0f, alive, "alpha * op(a) * op(b).")
      .def(
          "matmul_nt",
          [](M& mem, TensorId result, const Tile& a, const Tile& b, float alpha) {
            return matmul(mem, "matmul_nt", result, a, Transpose::no, b, Transpose::yes, alpha);
          },
          "result"_a, "a"_a, "b"_a, "alpha"_a = 1.0f, alive, "alpha * a * b^T, e.g. S = Q_i K_j^T.")
      .def(
          "matmul_nn",
          [](M& mem, TensorId result, const Tile& a, const Tile& b, float alpha) {
            return matmul(mem, "matmul_nn", result, a, Transpose::no, b, Transpose::no, alpha);
          },
          "result"_a, "a"_a, "b"_a, "alpha"_a = 1.0f, alive)
      .def(
          "multiply_add",
          [](M& mem, Tile& c, const Tile& a, Transpose ta, const Tile& b, Transpose tb, float alpha) {
            held(mem, c, "multiply_add", "c");
            if (&c == &a || &c == &b)
              throw std::invalid_argument("multiply_add: the result tile c is also an operand; allowed: c apart from a and b");
            mem.multiply_add(c, held(mem, a, "multiply_add", "a"), ta, held(mem, b, "multiply_add", "b"), tb, alpha);
          },
          "c"_a, "a"_a, "ta"_a, "b"_a, "tb"_a, "alpha"_a = 1.0f, "c += alpha * op(a) * op(b).")
      // Score modification and masking
      .def(
          "apply_score_mods",
          [](M& mem, Tile& s, const HeadProblem& head) {
            held(mem, s, "apply_score_mods", "s");
            require_score_tile(s, head, "apply_score_mods");
            mem.apply_score_mods(s, head);
          },
          "s"_a, "head"_a, "In place on a scaled score tile: softcap, ALiBi, then -inf where the mask hides the key.")
      .def(
          "chain_score_mods",
          [](M& mem, Tile& ds, const Tile& s_scaled, const HeadProblem& head) {
            held(mem, ds, "chain_score_mods", "ds");
            held(mem, s_scaled, "chain_score_mods", "s_scaled");
            mem.chain_score_mods(ds, s_scaled, head);
          },
          "ds"_a, "s_scaled"_a, "head"_a)
      .def(
          "apply_dropout",
          [](M& mem, Tile& p, const HeadProblem& head) {
            held(mem, p, "apply_dropout", "p");
            require_score_tile(p, head, "apply_dropout");
            mem.apply_dropout(p, head);
          },
          "p"_a, "head"_a)
      // Row statistics and the softmax
      .def(
          "row_max", [](M& mem, TensorId id, const Tile& s) { return mem.row_max(id, held(mem, s, "row_max", "s")); },
          "id"_a, "s"_a, alive)
      .def(
          "row_sum", [](M& mem, TensorId id, const Tile& p) { return mem.row_sum(id, held(mem, p, "row_sum", "p")); },
          "id"_a, "p"_a, alive)
      .def(
          "row_dot",
          [](M& mem, TensorId id, const Tile& a, const Tile& b) {
            return mem.row_dot(id, held(mem, a, "row_dot", "a"), held(mem, b, "row_dot", "b"));
          },
          "id"_a, "a"_a, "b"_a, alive, "rowsum(a * b).")
      .def(
          "maximum", [](M& mem, Tile& a, const Tile& b) { mem.maximum(held(mem, a, "maximum", "a"), held(mem, b, "maximum", "b")); },
          "a"_a, "b"_a, "a = max(a, b), element-wise.")
      .def(
          "exp_minus_row",
          [](M& mem, TensorId id, const Tile& s, const Tile& m) {
            return mem.exp_minus_row(id, held(mem, s, "exp_minus_row", "s"), held(mem, m, "exp_minus_row", "m"));
          },
          "id"_a, "s"_a, "m"_a, alive, "exp(s - m), m broadcast along each row.")
      .def(
          "exp_difference",
          [](M& mem, TensorId id, const Tile& a, const Tile& b) {
            return mem.exp_difference(id, held(mem, a, "exp_difference", "a"), held(mem, b, "exp_difference", "b"));
          },
          "id"_a, "a"_a, "b"_a, alive, "exp(a - b) element-wise: the rescale factor exp(m_old - m_new).")
      .def(
          "scale_rows",
          [](M& mem, Tile& x, const Tile& factor) {
            mem.scale_rows(held(mem, x, "scale_rows", "x"), held(mem, factor, "scale_rows", "factor"));
          },
          "x"_a, "factor"_a, "x = diag(factor) x.")
      .def(
          "divide_rows",
          [](M& mem, Tile& x, const Tile& denominator) {
            mem.divide_rows(held(mem, x, "divide_rows", "x"), held(mem, denominator, "divide_rows", "denominator"));
          },
          "x"_a, "denominator"_a, "x = diag(1 / denominator) x; a zero denominator gives a zero row.")
      .def(
          "add", [](M& mem, Tile& y, const Tile& x, float alpha) { mem.add(held(mem, y, "add", "y"), held(mem, x, "add", "x"), alpha); },
          "y"_a, "x"_a, "alpha"_a = 1.0f, "y += alpha * x.")
      .def(
          "log_sum_exp",
          [](M& mem, TensorId id, const Tile& m, const Tile& l) {
            return mem.log_sum_exp(id, held(mem, m, "log_sum_exp", "m"), held(mem, l, "log_sum_exp", "l"));
          },
          "id"_a, "m"_a, "l"_a, alive, "m + log(l); a row with l = 0 gives -inf.")
      .def(
          "softmax_backward",
          [](M& mem, TensorId id, const Tile& p, const Tile& dp, const Tile& d) {
            return mem.softmax_backward(id, held(mem, p, "softmax_backward", "p"), held(mem, dp, "softmax_backward", "dp"),
                                        held(mem, d, "softmax_backward", "d"));
          },
          "id"_a, "p"_a, "dp"_a, "d"_a, alive, "dS = P * (dP - D), D broadcast along rows.")
      // Trace annotations
      .def(
          "mark_line",
          [](M& mem, int line) {
            if (line < 0) throw std::invalid_argument("mark_line: line = " + std::to_string(line) + "; allowed: >= 0");
            mem.mark_line(line);
          },
          "line"_a, "The schedule is at this line of its paper's algorithm (shown by the visualizer).")
      .def(
          "note_softmax_state",
          [](M& mem, const Tile& m, const Tile& l, const Tile& rescale) {
            held(mem, m, "note_softmax_state", "m");
            held(mem, l, "note_softmax_state", "l");
            held(mem, rescale, "note_softmax_state", "rescale");
            if (l.row_count() != m.row_count() || rescale.row_count() != m.row_count() || m.col_count() != 1 ||
                l.col_count() != 1 || rescale.col_count() != 1)
              throw std::invalid_argument("note_softmax_state: m, l and rescale must be vectors of one block's rows; got " +
                                          m.describe() + ", " + l.describe() + ", " + rescale.describe());
            mem.note_softmax_state(m, l, rescale);
          },
          "m"_a, "l"_a, "rescale"_a, "The online-softmax state of a query block after an update (for the trace).");
}

// The online-softmax helpers of algorithms/online_softmax.hpp, for one memory model.
template <class Memory>
void bind_softmax_helpers(nb::module_& m) {
  using M = Memory;
  auto require_state = [](const M& mem, const SoftmaxState& state, const char* op) {
    held(mem, state.m, op, "state.m");
    held(mem, state.l, op, "state.l");
    held(mem, state.o, op, "state.o");
  };
  m.def(
      "start_softmax_state",
      [](M& mem, Range rows, int value_dim) {
        require_tile_sizes<M>(rows, {0, value_dim}, "start_softmax_state");
        return start_softmax_state(mem, rows, value_dim);
      },
      "mem"_a, "rows"_a, "value_dim"_a, nb::keep_alive<0, 1>(), "FA2 Algorithm 1, line 5: O = 0, l = 0, m = -inf.");
  m.def(
      "online_softmax_update",
      [require_state](M& mem, SoftmaxState& state, const Tile& s, const Tile& v, const HeadProblem& head) {
        require_state(mem, state, "online_softmax_update");
        held(mem, s, "online_softmax_update", "s");
        held(mem, v, "online_softmax_update", "v");
        require_score_tile(s, head, "online_softmax_update");
        // The shapes the update multiplies: checked by the memory model's ops as they run, but a
        // failure half way would leave the state half updated.
        if (s.row_count() != state.o.row_count() || s.col_count() != v.row_count() || v.col_count() != state.o.col_count())
          throw std::invalid_argument("online_softmax_update: S " + s.describe() + " and V " + v.describe() +
                                      " do not fit the state's O " + state.o.describe() +
                                      "; allowed: S rows x keys, V keys x value dim");
        online_softmax_update(mem, state, s, v, head);
      },
      "mem"_a, "state"_a, "s"_a, "v"_a, "head"_a, "FA2 Algorithm 1, lines 9-10: fold S and V into the state.");
  m.def(
      "finish_softmax_state",
      [require_state](M& mem, SoftmaxState& state) {
        require_state(mem, state, "finish_softmax_state");
        return finish_softmax_state(mem, state);
      },
      "mem"_a, "state"_a, nb::keep_alive<0, 1>(),
      "FA2 Algorithm 1, lines 12-13: O = diag(l)^-1 O in place; returns LSE = m + log(l).");
}

// HBM tensors a schedule needs beyond its inputs and outputs (S and P of standard attention, ...).
// A data run's hold values, bounded like the run's other host memory; shape-only ones carry shapes.
class PyHbmScratch {
 public:
  explicit PyHbmScratch(bool with_data) : with_data_(with_data), scratch_(with_data) {}
  bool with_data() const { return with_data_; }
  HbmMatrix matrix(TensorId id, const std::string& dtype, int rows, int cols) {
    const DType type = dtype_from_string(dtype);
    if (rows < 1 || cols < 1) {
      throw std::invalid_argument("HbmScratch.matrix: " + std::to_string(rows) + " x " + std::to_string(cols) +
                                  "; allowed: sizes >= 1");
    }
    const std::int64_t bytes = std::int64_t{rows} * cols * std::int64_t{sizeof(float)};
    if (with_data_ && bytes > kMaxDataBytes) {
      throw std::invalid_argument("HbmScratch.matrix: " + std::to_string(rows) + " x " + std::to_string(cols) +
                                  " holds " + std::to_string(bytes) + " bytes of values; allowed: at most " +
                                  std::to_string(kMaxDataBytes) + " (count it with a shape-only scratch)");
    }
    return scratch_.matrix(id, type, rows, cols);
  }

 private:
  bool with_data_;
  HbmScratch scratch_;
};

}  // namespace

void bind_schedules(nb::module_& m) {
  // SramOverflow and TraceOverflow are the simulator's exceptions (sim_bindings.cpp), raised here too.
  // The memory model's own refusals (a window outside its tensor, shapes that differ) are
  // std::logic_error: a misuse of the interface, a ValueError in Python.
  nb::register_exception_translator([](const std::exception_ptr& error, void*) {
    try {
      std::rethrow_exception(error);
    } catch (const std::out_of_range&) {
      throw;
    } catch (const std::logic_error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  nb::enum_<TensorId> ids(m, "TensorId", "Every tensor a schedule can move or compute (counted apart).");
  for (int i = 0; i < kTensorCount; ++i) ids.value(to_string(TensorId(i)), TensorId(i));
  nb::enum_<Transpose>(m, "Transpose").value("no", Transpose::no).value("yes", Transpose::yes);

  nb::class_<Counters>(m, "Counters", "A memory model's counts; to_dict() is the simulator's record of them.")
      .def(nb::init<>())
      .def("to_dict", [](const Counters& c) { return to_python(sim::to_json(c)); })
      .def("hbm_bytes", &Counters::hbm_bytes)
      .def_ro("sram_peak_bytes", &Counters::sram_peak_bytes)
      .def(
          "__iadd__", [](Counters& c, const Counters& other) -> Counters& { return c += other; }, nb::rv_policy::none,
          "Sums traffic and FLOPs (checked, never wrapped); the SRAM peak is the maximum.")
      .def(nb::self == nb::self);

  nb::class_<Range>(m, "Range", "A half-open range [begin, begin + size) of rows or columns.")
      .def(
          "__init__",
          [](Range* self, int begin, int size) {
            require_range(begin, size);
            new (self) Range{begin, size};
          },
          "begin"_a, "size"_a)
      .def_prop_rw("begin", [](const Range& r) { return r.begin; }, [](Range& r, int begin) {
        require_range(begin, r.size);
        r.begin = begin;
      })
      .def_prop_rw("size", [](const Range& r) { return r.size; }, [](Range& r, int size) {
        require_range(r.begin, size);
        r.size = size;
      })
      .def_prop_ro("end", &Range::end)
      .def(nb::self == nb::self)
      .def("__repr__", [](const Range& r) {
        return "Range(" + std::to_string(r.begin) + ", " + std::to_string(r.size) + ")";
      });

  nb::class_<Tile>(m, "Tile",
                   "A tile in SRAM: its tensor, its position in that tensor and, in data runs, its values. It holds "
                   "SRAM until freed (tile.free(), or when Python drops it).")
      .def_prop_ro("id", &Tile::id)
      .def_prop_ro("dtype", [](const Tile& t) { return std::string(to_string(t.dtype())); })
      .def_prop_ro("rows", &Tile::rows)
      .def_prop_ro("cols", &Tile::cols)
      .def_prop_ro("row_count", &Tile::row_count)
      .def_prop_ro("col_count", &Tile::col_count)
      .def_prop_ro("elements", &Tile::elements)
      .def_prop_ro("bytes", &Tile::bytes)
      .def_prop_ro("live", [](const Tile& t) { return t.arena() != nullptr; }, "Whether it still holds SRAM.")
      .def_prop_ro(
          "values",
          [](const Tile& t) -> std::optional<FloatArray> {
            if (t.arena() == nullptr) throw std::invalid_argument("values: the tile was freed (or moved into a softmax state)");
            if (t.values.size() == 0) return std::nullopt;  // shape-only
            return copy_of(t.values);
          },
          nb::rv_policy::automatic, "A copy of the values as a rows x cols float32 array (None in shape-only runs).")
      .def("describe", &Tile::describe)
      .def("__repr__", [](const Tile& t) { return t.arena() ? "<Tile " + t.describe() + ">" : std::string("<Tile (freed)>"); })
      .def("free", [](Tile& t) { t = Tile(); }, "Releases the tile's SRAM now; the tile cannot be used after.")
      .def("__enter__", [](nb::handle self) { return self; })
      .def("__exit__", [](Tile& t, nb::args) { t = Tile(); }, "Frees the tile at the end of a with block.");

  nb::class_<HbmMatrix>(m, "HbmMatrix", "A tensor of one head in HBM, as a schedule sees it.")
      .def_prop_ro("id", [](const HbmMatrix& x) { return x.id; })
      .def_prop_ro("dtype", [](const HbmMatrix& x) { return std::string(to_string(x.dtype)); })
      .def_prop_ro("rows", [](const HbmMatrix& x) { return x.rows; })
      .def_prop_ro("cols", [](const HbmMatrix& x) { return x.cols; })
      .def_prop_ro("has_data", [](const HbmMatrix& x) { return x.data != nullptr; })
      .def_prop_ro(
          "values",
          [](nb::handle self) -> std::optional<ConstFloatArray> {
            const HbmMatrix& x = nb::cast<const HbmMatrix&>(self);
            if (x.data == nullptr) return std::nullopt;
            return view(x.data, {size_t(x.rows), size_t(x.cols)}, {int64_t(x.row_stride), 1}, self);
          },
          nb::rv_policy::automatic, "A read-only rows x cols view of the values (None for a shape-only view).")
      .def("__repr__", [](const HbmMatrix& x) {
        return std::string("<HbmMatrix ") + to_string(x.id) + " " + std::to_string(x.rows) + " x " + std::to_string(x.cols) +
               " " + to_string(x.dtype) + (x.data ? "" : ", shape only") + ">";
      });

  auto tensor_field = [](HbmMatrix HeadTensors::* field) {
    return [field](HeadTensors& x) -> HbmMatrix& { return x.*field; };
  };
  nb::class_<HeadTensors>(m, "HeadTensors", "The HBM views of one (sequence, query head): what a schedule is handed.")
      .def_prop_ro("Q", tensor_field(&HeadTensors::Q), nb::rv_policy::reference_internal)
      .def_prop_ro("K", tensor_field(&HeadTensors::K), nb::rv_policy::reference_internal)
      .def_prop_ro("V", tensor_field(&HeadTensors::V), nb::rv_policy::reference_internal)
      .def_prop_ro("O", tensor_field(&HeadTensors::O), nb::rv_policy::reference_internal)
      .def_prop_ro("LSE", tensor_field(&HeadTensors::LSE), nb::rv_policy::reference_internal)
      .def_prop_ro("dO", tensor_field(&HeadTensors::dO), nb::rv_policy::reference_internal)
      .def_prop_ro("dQ", tensor_field(&HeadTensors::dQ), nb::rv_policy::reference_internal)
      .def_prop_ro("dK", tensor_field(&HeadTensors::dK), nb::rv_policy::reference_internal)
      .def_prop_ro("dV", tensor_field(&HeadTensors::dV), nb::rv_policy::reference_internal);

  // HeadProblem (problem_bindings.cpp) gains what a schedule asks besides the mask rules.
  nb::handle head_type = nb::type<HeadProblem>();
  if (!nb::hasattr(head_type, "modifies_scores")) {
    head_type.attr("modifies_scores") =
        nb::cpp_function([](const HeadProblem& h) { return h.modifies_scores(); }, nb::is_method(),
                         nb::name("modifies_scores"), "whether softcap or ALiBi change visible scores");
  }

  // The state's tiles are views into it; assigning a tile moves it in (the old name no longer holds
  // it), as `state.m = std::move(m_new)` does in C++.
  auto state_tile = [](Tile SoftmaxState::* field) {
    return std::pair{[field](SoftmaxState& s) -> Tile& { return s.*field; },
                     [field](SoftmaxState& s, Tile& t) { s.*field = std::move(t); }};
  };
  {
    auto [get_m, set_m] = state_tile(&SoftmaxState::m);
    auto [get_l, set_l] = state_tile(&SoftmaxState::l);
    auto [get_o, set_o] = state_tile(&SoftmaxState::o);
    nb::class_<SoftmaxState>(m, "SoftmaxState", "The running state of one query block, on chip: max m, sum l, output o.")
        .def_prop_rw("m", get_m, set_m, nb::rv_policy::reference_internal)
        .def_prop_rw("l", get_l, set_l, nb::rv_policy::reference_internal)
        .def_prop_rw("o", get_o, set_o, nb::rv_policy::reference_internal);
  }

  nb::class_<TraceRecorder>(m, "TraceRecorder",
                            "Keeps the events of a run (a memory model's trace=) in a bounded store; never cuts a "
                            "trace short silently.")
      .def(nb::init<std::size_t, std::int64_t, std::int64_t>(), "max_events"_a = TraceRecorder::kDefaultMaxEvents,
           "value_elements"_a = 0, "max_values"_a = kMaxTraceValues)
      .def_prop_ro("max_events", &TraceRecorder::max_events)
      .def_prop_ro("seen_events", &TraceRecorder::seen_events)
      .def_prop_ro("overflowed", &TraceRecorder::overflowed)
      .def(
          "finish",
          [](TraceRecorder& recorder, const std::string& schedule, const Problem& problem, std::int64_t sram_bytes,
             int block_rows, int block_cols) {
            problem.validate();
            Trace trace = recorder.finish(trace_info(schedule, problem, sram_bytes, block_rows, block_cols));
            validate_trace(trace, "the trace of " + schedule);  // what the loader will check
            return trace;
          },
          "schedule"_a, "problem"_a, "sram_bytes"_a, "block_rows"_a, "block_cols"_a,
          "The trace of a finished one-head run, with its header; TraceOverflow when the run did not fit.");
  m.def(
      "check_replayable", [](const Trace& trace) { viz::check_replayable(trace, "the trace of " + trace.info.schedule); },
      "trace"_a, "Raises ValueError unless the visualizer can replay the trace (its limits and checks).");

  nb::class_<PyHbmScratch>(m, "HbmScratch",
                           "HBM tensors a schedule makes for itself (S and P of standard attention): with values "
                           "for a DataMemory (with_data=True), shapes only for a ShapeMemory.")
      .def(nb::init<bool>(), "with_data"_a)
      .def_prop_ro("with_data", &PyHbmScratch::with_data)
      .def("matrix", &PyHbmScratch::matrix, "id"_a, "dtype"_a, "rows"_a, "cols"_a, nb::keep_alive<0, 1>(),
           "A rows x cols HBM tensor (its values 0 in a data scratch), counted per tensor id like the inputs.");

  bind_memory<DataMemory>(m, "DataMemory",
                          "The CPU reference memory model: tiles hold values and the math runs; counts as ShapeMemory.");
  bind_memory<ShapeMemory>(m, "ShapeMemory",
                           "The shape-only memory model: tiles carry shapes, no values; counts as DataMemory.");
  bind_softmax_helpers<DataMemory>(m);
  bind_softmax_helpers<ShapeMemory>(m);

  // --- Tensors of a whole problem --------------------------------------------------------------

  auto host_field = [](HostTensor AttentionTensors::* field) {
    return [field](nb::handle self) { return host_tensor_view(self, nb::cast<AttentionTensors&>(self).*field); };
  };
  nb::class_<AttentionTensors>(m, "AttentionTensors",
                               "The tensors of a problem, [rows, heads, dim] (the flash-attention layout), as float32 "
                               "values already rounded to the problem's dtype.")
      .def_prop_ro("Q", host_field(&AttentionTensors::Q), nb::rv_policy::automatic)
      .def_prop_ro("K", host_field(&AttentionTensors::K), nb::rv_policy::automatic)
      .def_prop_ro("V", host_field(&AttentionTensors::V), nb::rv_policy::automatic)
      .def_prop_ro("O", host_field(&AttentionTensors::O), nb::rv_policy::automatic)
      .def_prop_ro("LSE", host_field(&AttentionTensors::LSE), nb::rv_policy::automatic)
      .def_prop_ro("dO", host_field(&AttentionTensors::dO), nb::rv_policy::automatic)
      .def_prop_ro("dQ", host_field(&AttentionTensors::dQ), nb::rv_policy::automatic)
      .def_prop_ro("dK", host_field(&AttentionTensors::dK), nb::rv_policy::automatic)
      .def_prop_ro("dV", host_field(&AttentionTensors::dV), nb::rv_policy::automatic)
      .def(
          "assign",
          [](AttentionTensors& t, TensorId id, nb::ndarray<const float, nb::ndim<3>, nb::c_contig, nb::device::cpu> values) {
            // The inputs of a forward pass, and those a backward pass reads (O, LSE, dO).
            HostTensor* fields[] = {&t.Q, &t.K, &t.V, &t.O, &t.LSE, &t.dO};
            for (HostTensor* field : fields) {
              if (field->id == id && !field->values.empty()) return assign_host_tensor(*field, values);
            }
            throw std::invalid_argument(std::string("assign: ") + to_string(id) +
                                        "; allowed: Q, K, V, O, LSE, and dO in tensors made with backward=True");
          },
          "id"_a, "values"_a, "Copies a float32 [rows, heads, dim] array into an input, rounded to its dtype.");

  m.def(
      "random_tensors",
      [](const Problem& problem, std::uint64_t seed, bool backward) {
        problem.validate();
        require_tensor_memory(problem);
        return sim::random_tensors(problem, seed, backward);
      },
      "problem"_a, "seed"_a = 1, "backward"_a = false,
      "Standard normal Q, K, V rounded to the dtype, as the simulator's data runs draw them; O and LSE NaN. "
      "backward=True: also dO (standard normal) and dQ, dK, dV (NaN).");

  m.def(
      "head_tensors",
      [](AttentionTensors& tensors, const Problem& problem, int batch_index, int head_index) {
        problem.validate();
        require_tensors_of(tensors, problem);
        require_index("batch_index", batch_index, problem.batch, "batch");
        require_index("head_index", head_index, problem.heads_q, "heads_q");
        HeadTensors x = head_tensors(tensors, problem, batch_index, head_index);
        // Views of buffers a forward run lacks (the gradients) still name their tensor.
        x.dO.id = TensorId::dO, x.dQ.id = TensorId::dQ, x.dK.id = TensorId::dK, x.dV.id = TensorId::dV;
        return x;
      },
      "tensors"_a, "problem"_a, "batch_index"_a, "head_index"_a, nb::keep_alive<0, 1>(),
      "The HBM views of sequence b, query head h: Q and O of head h, K and V of its KV head (GQA).");

  m.def(
      "shape_head_tensors",
      [](const Problem& problem, int batch_index) {
        problem.validate();
        require_index("batch_index", batch_index, problem.batch, "batch");
        return shape_only_head_tensors(problem, batch_index);
      },
      "problem"_a, "batch_index"_a, "The HBM views of sequence b with shapes and no data, for ShapeMemory runs.");

  m.def(
      "oracle_check",
      [](const Problem& problem, const AttentionTensors& tensors) {
        problem.validate();
        require_tensors_of(tensors, problem);
        const std::int64_t bytes = oracle_bytes(problem, false);
        if (bytes > kMaxDataBytes) {
          throw std::invalid_argument("the oracle of this problem needs " + std::to_string(bytes) +
                                      " bytes; allowed: at most " + std::to_string(kMaxDataBytes));
        }
        OracleResult oracle;
        {
          nb::gil_scoped_release release;
          oracle = oracle_attention(problem, tensors);
        }
        nb::dict errors;
        errors["O"] = sim::max_error(tensors.O, oracle.O);
        errors["LSE"] = sim::max_error(tensors.LSE, oracle.LSE);
        return nb::make_tuple(errors, sim::check_tolerance(problem.dtype, sim::Pass::forward));
      },
      "problem"_a, "tensors"_a,
      "The largest |error| of O and LSE against the double-precision oracle on the tensors' inputs, and the "
      "tolerance the simulator's check holds a forward schedule to.");
}

}  // namespace flashlab::python
