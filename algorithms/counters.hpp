// Counters: what a memory model counts for a run (algorithms/tile_memory.hpp): HBM traffic per
// tensor in elements and bytes, FLOPs split into matmul, exponentials and other non-matmul work,
// the SRAM peak and the tile transfers. Plain data, summed over heads with +=; the closed forms
// (sim/closed_forms.hpp) predict them and the printers (sim/report.hpp) print them. The member
// functions are defined in tile_memory.cpp.
#pragma once

#include <array>
#include <cstdint>

#include "tensors.hpp"

namespace flashlab {

struct TensorTraffic {
  std::int64_t hbm_read_elements = 0;
  std::int64_t hbm_write_elements = 0;
  std::int64_t hbm_read_bytes = 0;
  std::int64_t hbm_write_bytes = 0;
  bool operator==(const TensorTraffic&) const = default;
};

struct Counters {
  std::array<TensorTraffic, kTensorCount> tensor{};
  std::int64_t matmul_flops = 0;  // 2 per multiply-add
  std::int64_t exponentials = 0;  // exp, log and tanh evaluations (the special-function unit)
  std::int64_t other_flops = 0;   // every other non-matmul operation, 1 per element written
  std::int64_t sram_peak_bytes = 0;
  std::int64_t loads = 0;   // tile transfers HBM -> SRAM
  std::int64_t stores = 0;  // tile transfers SRAM -> HBM

  const TensorTraffic& operator[](TensorId id) const { return tensor[static_cast<int>(id)]; }
  std::int64_t hbm_read_bytes() const;
  std::int64_t hbm_write_bytes() const;
  std::int64_t hbm_bytes() const;
  // Sums traffic and FLOPs; the peak is the maximum (heads run one after another). Every sum
  // here is checked (checked_math.hpp): a count past int64 is refused, never wrapped.
  Counters& operator+=(const Counters& other);
  bool operator==(const Counters&) const = default;
};

}  // namespace flashlab
