// The tile-memory interface: the one vocabulary every schedule is written in.
//
// A schedule moves tiles between slow memory (HBM, an HbmMatrix) and fast memory (SRAM, a Tile)
// and computes on tiles in SRAM. Every movement and every operation is a call on a memory model,
// so one schedule serves many consumers:
//   DataMemory  - runs the math on real data (Eigen, row-major tiles) and counts;
//   ShapeMemory - carries shapes only (no data) and counts the same numbers, in O(tiles) time.
// Both keep the same Counters (HBM traffic per tensor, FLOPs split into matmul, exponentials and
// other non-matmul work, peak SRAM) and enforce the same SRAM capacity, and both can report each
// event to a TraceSink (the simulator's recorder, the visualizer's trace).
//
// Element sizes: a tile holds its tensor's dtype; statistics (m, l, LSE, D) are fp32, every other
// tile has the problem's dtype, in SRAM as in HBM. Capacity is in bytes.
#pragma once

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "checked_math.hpp"
#include "counters.hpp"
#include "problem.hpp"
#include "tensors.hpp"

// A shape-only sweep calls the ops and their bookkeeping (tile lifetime, SRAM arena, argument
// checks, the trace check) millions of times per run: they are forced inline into the schedule,
// and their rare paths (an error's message, a trace event) stay out of line.
#if defined(__GNUC__) || defined(__clang__)
#define FLASHLAB_HOT_INLINE [[gnu::always_inline]] inline
#else
#define FLASHLAB_HOT_INLINE inline
#endif

namespace flashlab {

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// ---------------------------------------------------------------------------------------------
// Trace events, for the recorder and the visualizer.
// ring_step: Ring Attention (12_ring_attention.hpp) moved a device on to the next step of the
// ring, holding another key/value block.
enum class EventKind : std::uint8_t { load, store, compute, free, softmax_update, line, ring_step };
const char* to_string(EventKind kind);

struct TraceEvent {
  EventKind kind = EventKind::compute;
  TensorId tensor = TensorId::S;  // the tile moved, computed or freed
  Range rows, cols;               // its position in the logical tensor
  const char* op = "";            // compute: "matmul", "exp", "row_max", ...
  int line = 0;                   // line: the paper's algorithm line the schedule is at
  std::int64_t sram_bytes = 0;    // SRAM in use after the event
  std::int64_t bytes = 0;         // the tile's size; load and store: the HBM bytes moved
  // softmax_update (data runs only): per row of the query block.
  std::vector<float> row_max, row_sum, rescale;
  // compute (data runs only, when the sink asks): the tile's values after the op, row-major.
  std::vector<float> values;
  // ring_step: at ring step `step`, device `device` holds the key/value block of device `block`.
  int step = 0, device = 0, block = 0;
};

class TraceSink {
 public:
  virtual ~TraceSink() = default;
  // noexcept: a tile's destructor records its free, also during stack unwinding, where a throw
  // would end the program. A sink that cannot store an event notes it and reports it later.
  virtual void record(const TraceEvent& event) noexcept = 0;
  // Compute events of data runs carry the tile's values when it has at most this many elements.
  std::int64_t value_elements_limit = 0;
};

// ---------------------------------------------------------------------------------------------
// SRAM: a bounded arena. A tile that would exceed the capacity throws SramOverflow naming the
// tile, its size, the live tiles and the capacity; nothing spills silently.
class SramOverflow : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Tile;

class SramArena {
 public:
  explicit SramArena(std::int64_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}
  std::int64_t capacity_bytes() const { return capacity_bytes_; }  // 0: unbounded
  std::int64_t in_use_bytes() const { return in_use_bytes_; }
  std::int64_t peak_bytes() const { return peak_bytes_; }
  // Inline fast paths (shape-only sweeps call these millions of times); the rare paths (an
  // overflow's message, a trace event) stay out of line.
  FLASHLAB_HOT_INLINE void acquire(const Tile& tile);
  FLASHLAB_HOT_INLINE void release(const Tile& tile);
  FLASHLAB_HOT_INLINE void relocate(const Tile* from, const Tile* to);  // a live tile was moved
  TraceSink* sink = nullptr;

 private:
  [[noreturn, gnu::cold, gnu::noinline]] void overflow(const Tile& tile) const;
  [[gnu::noinline]] void record_free(const Tile& tile) const;
  std::int64_t capacity_bytes_;
  std::int64_t in_use_bytes_ = 0;
  std::int64_t peak_bytes_ = 0;
  const Tile* first_live_ = nullptr;  // the live tiles, oldest first, linked through the tiles
  const Tile* last_live_ = nullptr;
};

// A tile in SRAM: its tensor, its position in that tensor, and (in data runs) its values.
// Move-only; its SRAM is released when it goes out of scope.
class Tile {
 public:
  Tile() = default;
  FLASHLAB_HOT_INLINE Tile(SramArena* arena, TensorId id, DType dtype, Range rows, Range cols)
      : arena_(arena), id_(id), dtype_(dtype), rows_(rows), cols_(cols),
        bytes_(checked_product("bytes of a tile", rows.size, cols.size, element_bytes(dtype))) {
    arena_->acquire(*this);
  }
  FLASHLAB_HOT_INLINE Tile(Tile&& other) noexcept { *this = std::move(other); }
  FLASHLAB_HOT_INLINE Tile& operator=(Tile&& other) noexcept {
    if (this != &other) {
      free();
      arena_ = std::exchange(other.arena_, nullptr);
      id_ = other.id_, dtype_ = other.dtype_, rows_ = other.rows_, cols_ = other.cols_, bytes_ = other.bytes_;
      values = std::move(other.values);
      if (arena_) arena_->relocate(&other, this);
    }
    return *this;
  }
  Tile(const Tile&) = delete;
  Tile& operator=(const Tile&) = delete;
  FLASHLAB_HOT_INLINE ~Tile() {
    free();
    if (values.data() != nullptr) values.~RowMajorMatrix();
  }

  TensorId id() const { return id_; }
  DType dtype() const { return dtype_; }
  Range rows() const { return rows_; }
  Range cols() const { return cols_; }
  int row_count() const { return rows_.size; }
  int col_count() const { return cols_.size; }
  std::int64_t elements() const { return static_cast<std::int64_t>(rows_.size) * cols_.size; }
  std::int64_t bytes() const { return bytes_; }
  std::string describe() const;  // "S[rows 0..64, cols 128..192] 64x64 fp32 = 16384 B"
  // The arena holding this tile; null once it was moved from (or never held SRAM).
  const SramArena* arena() const { return arena_; }

  // Empty in shape-only runs. In a union so that ~Tile destroys it only when it holds values:
  // an empty matrix owns nothing, and shape-only runs skip Eigen's free(nullptr) per tile.
  union {
    RowMajorMatrix values{};
  };

 private:
  FLASHLAB_HOT_INLINE void free() {
    if (arena_) arena_->release(*this), arena_ = nullptr;
  }
  SramArena* arena_ = nullptr;
  TensorId id_ = TensorId::S;
  DType dtype_ = DType::fp32;
  Range rows_, cols_;
  std::int64_t bytes_ = 0;  // cached: the arena asks at every acquire and release
  friend class SramArena;
  mutable const Tile* previous_live_ = nullptr;  // the arena's list of live tiles
  mutable const Tile* next_live_ = nullptr;
};

// The trace event of one tile (load, compute, free): its tensor, position and size.
inline TraceEvent tile_event(EventKind kind, const Tile& tile, std::int64_t sram_bytes) {
  TraceEvent event;
  event.kind = kind;
  event.tensor = tile.id();
  event.rows = tile.rows();
  event.cols = tile.cols();
  event.sram_bytes = sram_bytes;
  event.bytes = tile.bytes();
  return event;
}

// GCC 12 sees the arena keep the address of a local tile once acquire is inlined into a
// schedule (-Wdangling-pointer); the tile's destructor unlinks it before the address dies.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdangling-pointer"
#endif
FLASHLAB_HOT_INLINE void SramArena::acquire(const Tile& tile) {
  const std::int64_t in_use = checked_add(in_use_bytes_, tile.bytes(), "SRAM bytes in use");
  if (capacity_bytes_ > 0 && in_use > capacity_bytes_) overflow(tile);
  in_use_bytes_ = in_use;
  peak_bytes_ = std::max(peak_bytes_, in_use_bytes_);
  tile.previous_live_ = last_live_;
  tile.next_live_ = nullptr;
  (last_live_ ? last_live_->next_live_ : first_live_) = &tile;
  last_live_ = &tile;
}
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic pop
#endif

FLASHLAB_HOT_INLINE void SramArena::release(const Tile& tile) {
  in_use_bytes_ -= tile.bytes();
  (tile.previous_live_ ? tile.previous_live_->next_live_ : first_live_) = tile.next_live_;
  (tile.next_live_ ? tile.next_live_->previous_live_ : last_live_) = tile.previous_live_;
  if (sink) record_free(tile);
}

FLASHLAB_HOT_INLINE void SramArena::relocate(const Tile* from, const Tile* to) {
  to->previous_live_ = from->previous_live_;
  to->next_live_ = from->next_live_;
  (to->previous_live_ ? to->previous_live_->next_live_ : first_live_) = to;
  (to->next_live_ ? to->next_live_->previous_live_ : last_live_) = to;
}

enum class Transpose : bool { no = false, yes = true };

struct MemoryConfig {
  DType dtype = DType::fp32;           // element type of inputs, outputs and score tiles
  std::int64_t sram_capacity_bytes = 0;  // 0: unbounded
};

// ---------------------------------------------------------------------------------------------
// The memory model. kWithData selects DataMemory (true) or ShapeMemory (false); accounting is
// shared, so both count identically by construction and a test holds them to it.
template <bool kWithData>
class TileMemory {
 public:
  static constexpr bool with_data = kWithData;

  explicit TileMemory(MemoryConfig config = {}, TraceSink* sink = nullptr) : config_(config), arena_(config.sram_capacity_bytes) {
    arena_.sink = sink;
  }
  TileMemory(const TileMemory&) = delete;
  TileMemory& operator=(const TileMemory&) = delete;

  // The counters so far, with the SRAM peak filled in.
  Counters counters() const {
    Counters result = counters_;
    result.sram_peak_bytes = arena_.peak_bytes();
    return result;
  }
  const MemoryConfig& config() const { return config_; }
  std::int64_t sram_in_use_bytes() const { return arena_.in_use_bytes(); }
  // Whether the tile lives in this model's SRAM (not another model's, not moved from): what a
  // caller outside C++'s scopes (the Python bindings) checks before an op reads it.
  bool holds(const Tile& tile) const { return tile.arena() == &arena_; }
  DType tile_dtype(TensorId id) const { return is_statistic(id) ? DType::fp32 : config_.dtype; }

  // --- Movement between HBM and SRAM --------------------------------------------------------

  FLASHLAB_HOT_INLINE Tile load(const HbmMatrix& source, Range rows, Range cols) {
    check_window(source, rows, cols, "load");
    Tile tile(&arena_, source.id, source.dtype, rows, cols);
    count_hbm(source, tile.elements(), /*write=*/false);
    if constexpr (kWithData) {
      tile.values.resize(rows.size, cols.size);
      for (int r = 0; r < rows.size; ++r)
        for (int c = 0; c < cols.size; ++c) tile.values(r, c) = source.at(rows.begin + r, cols.begin + c);
    }
    emit(EventKind::load, tile);
    return tile;
  }
  FLASHLAB_HOT_INLINE Tile load(const HbmMatrix& source, Range rows) { return load(source, rows, {0, source.cols}); }

  // Rows of an HBM tensor that are read but never used: a kernel that loads whole pages of a paged
  // KV cache (08_split_kv_decode.hpp) reads the rows of a page outside its key block too and
  // masks them in registers. Counted as HBM reads and one transfer; never held in SRAM, never
  // computed on, so nothing reaches a data run's math.
  FLASHLAB_HOT_INLINE void read_unused(const HbmMatrix& source, Range rows) {
    check_window(source, rows, {0, source.cols}, "read_unused");
    count_hbm(source, static_cast<std::int64_t>(rows.size) * source.cols, /*write=*/false);
  }

  // Writes a tile to rows x cols of an HBM tensor, rounding to the tensor's dtype.
  FLASHLAB_HOT_INLINE void store(const HbmMatrix& destination, Range rows, Range cols, const Tile& tile) {
    check_window(destination, rows, cols, "store");
    require_shape(tile, rows.size, cols.size, "store");
    count_hbm(destination, tile.elements(), /*write=*/true);
    if constexpr (kWithData) {
      for (int r = 0; r < rows.size; ++r)
        for (int c = 0; c < cols.size; ++c)
          destination.at(rows.begin + r, cols.begin + c) = round_to(destination.dtype, tile.values(r, c));
    }
    emit_store(destination, rows, cols);
  }
  FLASHLAB_HOT_INLINE void store(const HbmMatrix& destination, Range rows, const Tile& tile) {
    store(destination, rows, {0, destination.cols}, tile);
  }
  // Adds a tile into rows of an HBM tensor without reading it on chip: an atomic add that the
  // L2 cache performs (a GPU's red/atomicAdd to global memory). Counted as a write of the tile;
  // the tensor's old values never travel to SRAM.
  FLASHLAB_HOT_INLINE void atomic_add(const HbmMatrix& destination, Range rows, const Tile& tile) {
    const Range cols{0, destination.cols};
    check_window(destination, rows, cols, "atomic_add");
    require_shape(tile, rows.size, cols.size, "atomic_add");
    count_hbm(destination, tile.elements(), /*write=*/true);
    if constexpr (kWithData) {
      for (int r = 0; r < rows.size; ++r)
        for (int c = 0; c < cols.size; ++c) {
          float& value = destination.at(rows.begin + r, cols.begin + c);
          value = round_to(destination.dtype, value + tile.values(r, c));
        }
    }
    emit_store(destination, rows, cols, "atomic_add");
  }

  // --- Tiles made on chip -------------------------------------------------------------------

  FLASHLAB_HOT_INLINE Tile filled(TensorId id, Range rows, Range cols, float value) {
    Tile tile(&arena_, id, tile_dtype(id), rows, cols);
    if constexpr (kWithData) tile.values.setConstant(rows.size, cols.size, value);
    emit_compute(tile, "fill");
    return tile;
  }
  FLASHLAB_HOT_INLINE Tile zeros(TensorId id, Range rows, Range cols) { return filled(id, rows, cols, 0.0f); }
  // An fp32 accumulator of zeros, whatever the problem's dtype (a partial sum bound for an fp32
  // tensor in HBM, e.g. dQ's atomic adds).
  FLASHLAB_HOT_INLINE Tile fp32_zeros(TensorId id, Range rows, Range cols) {
    Tile tile(&arena_, id, DType::fp32, rows, cols);
    if constexpr (kWithData) tile.values.setZero(rows.size, cols.size);
    emit_compute(tile, "fill");
    return tile;
  }
  // A statistics vector (one value per row), e.g. m = -inf, l = 0 (FA1 Algorithm 1, line 2).
  FLASHLAB_HOT_INLINE Tile vector(TensorId id, Range rows, float value) { return filled(id, rows, {0, 1}, value); }

  FLASHLAB_HOT_INLINE Tile copy(TensorId id, const Tile& source) {
    Tile tile(&arena_, id, tile_dtype(id), source.rows(), source.cols());
    checked_accumulate(counters_.other_flops, tile.elements(), "other_flops");
    if constexpr (kWithData) tile.values = source.values;
    emit_compute(tile, "copy");
    return tile;
  }

  // --- Matrix products (tensor cores on a GPU) ------------------------------------------------

  // result = alpha * op(a) * op(b). The result's position: rows from op(a)'s rows, cols from
  // op(b)'s cols, so S = Q_i K_j^T sits at (rows of Q_i, rows of K_j).
  FLASHLAB_HOT_INLINE Tile matmul(TensorId result, const Tile& a, Transpose ta, const Tile& b, Transpose tb, float alpha = 1.0f) {
    const Range rows = ta == Transpose::yes ? a.cols() : a.rows();
    const Range cols = tb == Transpose::yes ? b.rows() : b.cols();
    Tile c(&arena_, result, tile_dtype(result), rows, cols);
    if constexpr (kWithData) c.values.setZero(rows.size, cols.size);
    multiply_add(c, a, ta, b, tb, alpha);
    return c;
  }
  FLASHLAB_HOT_INLINE Tile matmul_nt(TensorId result, const Tile& a, const Tile& b, float alpha = 1.0f) {
    return matmul(result, a, Transpose::no, b, Transpose::yes, alpha);
  }
  FLASHLAB_HOT_INLINE Tile matmul_nn(TensorId result, const Tile& a, const Tile& b, float alpha = 1.0f) {
    return matmul(result, a, Transpose::no, b, Transpose::no, alpha);
  }
  // c += alpha * op(a) * op(b)
  FLASHLAB_HOT_INLINE void multiply_add(Tile& c, const Tile& a, Transpose ta, const Tile& b, Transpose tb, float alpha = 1.0f) {
    const int m = ta == Transpose::yes ? a.col_count() : a.row_count();
    const int k = ta == Transpose::yes ? a.row_count() : a.col_count();
    const int kb = tb == Transpose::yes ? b.col_count() : b.row_count();
    const int n = tb == Transpose::yes ? b.row_count() : b.col_count();
    if (k != kb || c.row_count() != m || c.col_count() != n) matmul_shape_error(c, a, b);
    checked_accumulate(counters_.matmul_flops, checked_product("matmul_flops of a tile", 2, m, n, k), "matmul_flops");
    if constexpr (kWithData) {
      if (ta == Transpose::no && tb == Transpose::no) c.values.noalias() += alpha * (a.values * b.values);
      if (ta == Transpose::no && tb == Transpose::yes) c.values.noalias() += alpha * (a.values * b.values.transpose());
      if (ta == Transpose::yes && tb == Transpose::no) c.values.noalias() += alpha * (a.values.transpose() * b.values);
      if (ta == Transpose::yes && tb == Transpose::yes) c.values.noalias() += alpha * (a.values.transpose() * b.values.transpose());
    }
    emit_compute(c, "matmul");
  }

  // --- Score modification and masking ---------------------------------------------------------

  // In place on a scaled score tile: softcap, ALiBi, then -inf where the mask hides the key.
  FLASHLAB_HOT_INLINE void apply_score_mods(Tile& s, const HeadProblem& head) {
    checked_accumulate(counters_.other_flops, checked_mul(s.elements(), score_mod_flops(head), "other_flops of a tile"),
                       "other_flops");
    if (head.softcap > 0) checked_accumulate(counters_.exponentials, s.elements(), "exponentials");
    if constexpr (kWithData) {
      for (int r = 0; r < s.row_count(); ++r) {
        const int row = s.rows().begin + r;
        for (int c = 0; c < s.col_count(); ++c) {
          const int col = s.cols().begin + c;
          s.values(r, c) = head.key_visible(row, col) ? head.modify_score(s.values(r, c), row, col) : kNegInf;
        }
      }
    }
    emit_compute(s, "score_mods");
  }

  // Backward: dS (w.r.t. modified scores) times d(modified)/d(scaled score); s holds the scaled
  // scores before modification.
  FLASHLAB_HOT_INLINE void chain_score_mods(Tile& ds, const Tile& s_scaled, const HeadProblem& head) {
    require_same_shape(ds, s_scaled, "chain_score_mods");
    if (head.softcap <= 0) return;
    checked_accumulate(counters_.exponentials, ds.elements(), "exponentials");
    checked_accumulate(counters_.other_flops, checked_mul(2, ds.elements(), "other_flops of a tile"), "other_flops");
    if constexpr (kWithData) {
      for (int r = 0; r < ds.row_count(); ++r)
        for (int c = 0; c < ds.col_count(); ++c) ds.values(r, c) *= head.modify_score_derivative(s_scaled.values(r, c));
    }
    emit_compute(ds, "softcap_grad");
  }

  // In place: dropped elements become 0, kept ones are scaled by 1 / (1 - p) (FA1 Algorithm 2).
  FLASHLAB_HOT_INLINE void apply_dropout(Tile& p, const HeadProblem& head) {
    if (head.dropout.probability <= 0) return;
    checked_accumulate(counters_.other_flops, p.elements(), "other_flops");
    if constexpr (kWithData) {
      const float keep_scale = head.dropout_scale();
      for (int r = 0; r < p.row_count(); ++r)
        for (int c = 0; c < p.col_count(); ++c)
          p.values(r, c) *= head.dropout_keeps(p.rows().begin + r, p.cols().begin + c) ? keep_scale : 0.0f;
    }
    emit_compute(p, "dropout");
  }

  // --- Row statistics and the softmax --------------------------------------------------------

  FLASHLAB_HOT_INLINE Tile row_max(TensorId id, const Tile& s) {
    Tile m(&arena_, id, tile_dtype(id), s.rows(), {0, 1});
    checked_accumulate(counters_.other_flops, s.elements(), "other_flops");
    if constexpr (kWithData) m.values = s.values.rowwise().maxCoeff();
    emit_compute(m, "row_max");
    return m;
  }
  FLASHLAB_HOT_INLINE Tile row_sum(TensorId id, const Tile& p) {
    Tile l(&arena_, id, tile_dtype(id), p.rows(), {0, 1});
    checked_accumulate(counters_.other_flops, p.elements(), "other_flops");
    if constexpr (kWithData) l.values = p.values.rowwise().sum();
    emit_compute(l, "row_sum");
    return l;
  }
  // rowsum(a * b), e.g. D = rowsum(dO * O) (FA2 Algorithm 2, line 4).
  FLASHLAB_HOT_INLINE Tile row_dot(TensorId id, const Tile& a, const Tile& b) {
    require_same_shape(a, b, "row_dot");
    Tile d(&arena_, id, tile_dtype(id), a.rows(), {0, 1});
    checked_accumulate(counters_.other_flops, checked_mul(2, a.elements(), "other_flops of a tile"), "other_flops");
    if constexpr (kWithData) d.values = a.values.cwiseProduct(b.values).rowwise().sum();
    emit_compute(d, "row_dot");
    return d;
  }
  // a = max(a, b), element-wise.
  FLASHLAB_HOT_INLINE void maximum(Tile& a, const Tile& b) {
    require_same_shape(a, b, "maximum");
    checked_accumulate(counters_.other_flops, a.elements(), "other_flops");
    if constexpr (kWithData) a.values = a.values.cwiseMax(b.values);
    emit_compute(a, "max");
  }
  // exp(s - m) with m broadcast along each row; a row whose max is -inf (fully masked so far)
  // gives zeros, never NaN.
  FLASHLAB_HOT_INLINE Tile exp_minus_row(TensorId id, const Tile& s, const Tile& m) {
    require_rows(s, m, "exp_minus_row");
    Tile p(&arena_, id, tile_dtype(id), s.rows(), s.cols());
    checked_accumulate(counters_.exponentials, s.elements(), "exponentials");
    checked_accumulate(counters_.other_flops, s.elements(), "other_flops");
    if constexpr (kWithData) {
      p.values.resize(s.row_count(), s.col_count());
      for (int r = 0; r < s.row_count(); ++r) {
        const float row_max = m.values(r, 0);
        if (row_max == kNegInf) {
          p.values.row(r).setZero();
        } else {
          // Eigen's vectorised exp(-inf) is a tiny positive number, not 0: a masked score must give 0.
          const auto scores = s.values.row(r).array();
          p.values.row(r) = (scores == kNegInf).select(0.0f, (scores - row_max).exp()).matrix();
        }
      }
    }
    emit_compute(p, "exp");
    return p;
  }
  // exp(a - b) element-wise for statistics vectors: the rescale factor exp(m_old - m_new).
  // Equal arguments give 1, so -inf - (-inf) is 1, not NaN.
  FLASHLAB_HOT_INLINE Tile exp_difference(TensorId id, const Tile& a, const Tile& b) {
    require_same_shape(a, b, "exp_difference");
    Tile e(&arena_, id, tile_dtype(id), a.rows(), a.cols());
    checked_accumulate(counters_.exponentials, a.elements(), "exponentials");
    checked_accumulate(counters_.other_flops, a.elements(), "other_flops");
    if constexpr (kWithData) {
      e.values = a.values.binaryExpr(b.values, [](float x, float y) { return x == y ? 1.0f : std::exp(x - y); });
    }
    emit_compute(e, "exp");
    return e;
  }
  // x = diag(factor) x
  FLASHLAB_HOT_INLINE void scale_rows(Tile& x, const Tile& factor) {
    require_rows(x, factor, "scale_rows");
    checked_accumulate(counters_.other_flops, x.elements(), "other_flops");
    if constexpr (kWithData) x.values = factor.values.col(0).asDiagonal() * x.values;
    emit_compute(x, "scale_rows");
  }
  // x = diag(1 / denominator) x; a zero denominator (a fully masked row) gives a zero row.
  FLASHLAB_HOT_INLINE void divide_rows(Tile& x, const Tile& denominator) {
    require_rows(x, denominator, "divide_rows");
    checked_accumulate(counters_.other_flops, x.elements(), "other_flops");
    if constexpr (kWithData) {
      for (int r = 0; r < x.row_count(); ++r) {
        const float d = denominator.values(r, 0);
        x.values.row(r) = d == 0.0f ? Eigen::RowVectorXf::Zero(x.col_count()) : Eigen::RowVectorXf(x.values.row(r) / d);
      }
    }
    emit_compute(x, "divide_rows");
  }
  // y += alpha * x
  FLASHLAB_HOT_INLINE void add(Tile& y, const Tile& x, float alpha = 1.0f) {
    require_same_shape(y, x, "add");
    checked_accumulate(counters_.other_flops, y.elements(), "other_flops");
    if constexpr (kWithData) y.values += alpha * x.values;
    emit_compute(y, "add");
  }
  // m + log(l): the log-sum-exp of each row; a row with l = 0 gives -inf.
  FLASHLAB_HOT_INLINE Tile log_sum_exp(TensorId id, const Tile& m, const Tile& l) {
    require_same_shape(m, l, "log_sum_exp");
    Tile lse(&arena_, id, tile_dtype(id), m.rows(), m.cols());
    checked_accumulate(counters_.exponentials, m.elements(), "exponentials");
    checked_accumulate(counters_.other_flops, m.elements(), "other_flops");
    if constexpr (kWithData) {
      lse.values = m.values.binaryExpr(l.values, [](float max, float sum) { return sum == 0.0f ? kNegInf : max + std::log(sum); });
    }
    emit_compute(lse, "log_sum_exp");
    return lse;
  }
  // dS = P * (dP - D), D broadcast along rows (FA2 Algorithm 2, line 13).
  FLASHLAB_HOT_INLINE Tile softmax_backward(TensorId id, const Tile& p, const Tile& dp, const Tile& d) {
    require_same_shape(p, dp, "softmax_backward");
    require_rows(p, d, "softmax_backward");
    Tile ds(&arena_, id, tile_dtype(id), p.rows(), p.cols());
    checked_accumulate(counters_.other_flops, checked_mul(2, p.elements(), "other_flops of a tile"), "other_flops");
    if constexpr (kWithData) ds.values = p.values.cwiseProduct((dp.values.colwise() - d.values.col(0)));
    emit_compute(ds, "softmax_backward");
    return ds;
  }

  // --- Trace annotations (no cost, no effect on data) ----------------------------------------

  // The schedule is at this line of its paper's algorithm (shown by the visualizer).
  FLASHLAB_HOT_INLINE void mark_line(int line) {
    if (arena_.sink) record_line(outer_line_ > 0 ? outer_line_ : line);
  }
  // A schedule that runs another inside one of its lines (Ring Attention runs FA2 per block pair)
  // keeps its own line shown while the inner one runs: the inner marks read as `line` until
  // restored with the value returned (0: none held).
  int hold_line(int line) { return std::exchange(outer_line_, line); }
  // Ring Attention: at ring step `step`, device `device` holds the key/value block of `block`.
  void note_ring_step(int step, int device, int block) {
    if (!arena_.sink) return;
    TraceEvent event;
    event.kind = EventKind::ring_step;
    event.step = step, event.device = device, event.block = block;
    event.sram_bytes = arena_.in_use_bytes();
    arena_.sink->record(event);
  }
  // The online-softmax state of a query block after an update: running max, running sum and
  // the rescale factor exp(m_old - m_new) applied to the old state.
  FLASHLAB_HOT_INLINE void note_softmax_state(const Tile& m, const Tile& l, const Tile& rescale) {
    if (arena_.sink) record_softmax_state(m, l, rescale);
  }

 private:
  [[gnu::noinline]] void record_line(int line) {
    TraceEvent event;
    event.kind = EventKind::line;
    event.line = line;
    event.sram_bytes = arena_.in_use_bytes();
    arena_.sink->record(event);
  }
  [[gnu::noinline]] void record_softmax_state(const Tile& m, const Tile& l, const Tile& rescale) {
    TraceEvent event;
    event.kind = EventKind::softmax_update;
    event.tensor = TensorId::m;
    event.rows = m.rows();
    event.cols = {0, 1};
    event.sram_bytes = arena_.in_use_bytes();
    if constexpr (kWithData) {
      event.row_max.assign(m.values.data(), m.values.data() + m.elements());
      event.row_sum.assign(l.values.data(), l.values.data() + l.elements());
      event.rescale.assign(rescale.values.data(), rescale.values.data() + rescale.elements());
    }
    arena_.sink->record(event);
  }

  static int score_mod_flops(const HeadProblem& head) {
    return 1 + (head.softcap > 0 ? 2 : 0) + (head.alibi_slope != 0 ? 2 : 0);
  }
  FLASHLAB_HOT_INLINE void count_hbm(const HbmMatrix& tensor, std::int64_t elements, bool write) {
    TensorTraffic& traffic = counters_.tensor[static_cast<int>(tensor.id)];
    const std::int64_t bytes = checked_mul(elements, element_bytes(tensor.dtype), "HBM bytes of a tile");
    if (write) {
      checked_accumulate(traffic.hbm_write_elements, elements, "hbm_write_elements");
      checked_accumulate(traffic.hbm_write_bytes, bytes, "hbm_write_bytes");
      checked_accumulate(counters_.stores, 1, "stores");
    } else {
      checked_accumulate(traffic.hbm_read_elements, elements, "hbm_read_elements");
      checked_accumulate(traffic.hbm_read_bytes, bytes, "hbm_read_bytes");
      checked_accumulate(counters_.loads, 1, "loads");
    }
  }
  FLASHLAB_HOT_INLINE static void check_window(const HbmMatrix& tensor, Range rows, Range cols, const char* what) {
    if (rows.begin < 0 || cols.begin < 0 || rows.size < 1 || cols.size < 1 || rows.end() > tensor.rows ||
        cols.end() > tensor.cols) {
      window_error(tensor, rows, cols, what);
    }
  }
  [[noreturn, gnu::cold, gnu::noinline]] static void window_error(const HbmMatrix& tensor, Range rows, Range cols,
                                                                 const char* what) {
    throw std::logic_error(std::string(what) + " of " + to_string(tensor.id) + " rows [" + std::to_string(rows.begin) +
                           ", " + std::to_string(rows.end()) + ") cols [" + std::to_string(cols.begin) + ", " +
                           std::to_string(cols.end()) + ") outside its " + std::to_string(tensor.rows) + " x " +
                           std::to_string(tensor.cols));
  }
  FLASHLAB_HOT_INLINE static void require_shape(const Tile& t, int rows, int cols, const char* what) {
    if (t.row_count() != rows || t.col_count() != cols) shape_error(t, rows, cols, what);
  }
  [[noreturn, gnu::cold, gnu::noinline]] static void shape_error(const Tile& t, int rows, int cols, const char* what) {
    throw std::logic_error(std::string(what) + ": " + t.describe() + " is not " + std::to_string(rows) + " x " + std::to_string(cols));
  }
  FLASHLAB_HOT_INLINE static void require_same_shape(const Tile& a, const Tile& b, const char* what) {
    require_shape(b, a.row_count(), a.col_count(), what);
  }
  FLASHLAB_HOT_INLINE static void require_rows(const Tile& a, const Tile& b, const char* what) {
    if (a.row_count() != b.row_count()) rows_error(a, b, what);
  }
  [[noreturn, gnu::cold, gnu::noinline]] static void rows_error(const Tile& a, const Tile& b, const char* what) {
    throw std::logic_error(std::string(what) + ": rows of " + a.describe() + " and " + b.describe() + " differ");
  }
  [[noreturn, gnu::cold, gnu::noinline]] static void matmul_shape_error(const Tile& c, const Tile& a, const Tile& b) {
    throw std::logic_error("matmul shapes differ: " + a.describe() + " x " + b.describe() + " into " + c.describe());
  }
  FLASHLAB_HOT_INLINE void emit(EventKind kind, const Tile& tile, const char* op = "") {
    if (arena_.sink) record(kind, tile, op);
  }
  [[gnu::noinline]] void record(EventKind kind, const Tile& tile, const char* op) {
    TraceEvent event = tile_event(kind, tile, arena_.in_use_bytes());
    event.op = op;
    if constexpr (kWithData) {
      if (kind == EventKind::compute && tile.elements() <= arena_.sink->value_elements_limit)
        event.values.assign(tile.values.data(), tile.values.data() + tile.values.size());
    }
    arena_.sink->record(event);
  }
  FLASHLAB_HOT_INLINE void emit_compute(const Tile& tile, const char* op) { emit(EventKind::compute, tile, op); }
  // A store event; op "atomic_add" for an add the L2 performs (atomic_add), "" for a plain store.
  FLASHLAB_HOT_INLINE void emit_store(const HbmMatrix& destination, Range rows, Range cols, const char* op = "") {
    if (arena_.sink) record_store(destination, rows, cols, op);
  }
  [[gnu::noinline]] void record_store(const HbmMatrix& destination, Range rows, Range cols, const char* op) {
    TraceEvent event;
    event.kind = EventKind::store;
    event.op = op;
    event.tensor = destination.id;
    event.rows = rows;
    event.cols = cols;
    event.sram_bytes = arena_.in_use_bytes();
    event.bytes = checked_product("bytes of a stored tile", rows.size, cols.size, element_bytes(destination.dtype));
    arena_.sink->record(event);
  }

  MemoryConfig config_;
  SramArena arena_;
  Counters counters_;
  int outer_line_ = 0;  // hold_line
};

using DataMemory = TileMemory<true>;
using ShapeMemory = TileMemory<false>;

}  // namespace flashlab
