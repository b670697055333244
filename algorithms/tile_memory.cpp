#include "tile_memory.hpp"

#include <sstream>

namespace flashlab {

std::int64_t Counters::hbm_read_bytes() const {
  std::int64_t total = 0;
  for (const TensorTraffic& t : tensor) checked_accumulate(total, t.hbm_read_bytes, "hbm_read_bytes");
  return total;
}

std::int64_t Counters::hbm_write_bytes() const {
  std::int64_t total = 0;
  for (const TensorTraffic& t : tensor) checked_accumulate(total, t.hbm_write_bytes, "hbm_write_bytes");
  return total;
}

std::int64_t Counters::hbm_bytes() const { return checked_add(hbm_read_bytes(), hbm_write_bytes(), "hbm_bytes"); }

Counters& Counters::operator+=(const Counters& other) {
  for (int i = 0; i < kTensorCount; ++i) {
    checked_accumulate(tensor[i].hbm_read_elements, other.tensor[i].hbm_read_elements, "hbm_read_elements");
    checked_accumulate(tensor[i].hbm_write_elements, other.tensor[i].hbm_write_elements, "hbm_write_elements");
    checked_accumulate(tensor[i].hbm_read_bytes, other.tensor[i].hbm_read_bytes, "hbm_read_bytes");
    checked_accumulate(tensor[i].hbm_write_bytes, other.tensor[i].hbm_write_bytes, "hbm_write_bytes");
  }
  checked_accumulate(matmul_flops, other.matmul_flops, "matmul_flops");
  checked_accumulate(exponentials, other.exponentials, "exponentials");
  checked_accumulate(other_flops, other.other_flops, "other_flops");
  sram_peak_bytes = std::max(sram_peak_bytes, other.sram_peak_bytes);
  checked_accumulate(loads, other.loads, "loads");
  checked_accumulate(stores, other.stores, "stores");
  return *this;
}

const char* to_string(EventKind kind) {
  switch (kind) {
    case EventKind::load: return "load";
    case EventKind::store: return "store";
    case EventKind::compute: return "compute";
    case EventKind::free: return "free";
    case EventKind::softmax_update: return "softmax_update";
    case EventKind::line: return "line";
    case EventKind::ring_step: return "ring_step";
  }
  return "?";
}

std::string Tile::describe() const {
  std::ostringstream text;
  text << to_string(id_) << "[rows " << rows_.begin << ".." << rows_.end() << ", cols " << cols_.begin << ".."
       << cols_.end() << "] " << rows_.size << "x" << cols_.size << " " << to_string(dtype_) << " = " << bytes() << " B";
  return text.str();
}

void SramArena::overflow(const Tile& tile) const {
  std::ostringstream message;
  message << "SRAM overflow: tile " << tile.describe() << " does not fit: " << in_use_bytes_ << " B in use of M = "
          << capacity_bytes_ << " B; live tiles:";
  for (const Tile* live = first_live_; live; live = live->next_live_) message << " " << live->describe() << ";";
  throw SramOverflow(message.str());
}

void SramArena::record_free(const Tile& tile) const {
  sink->record(tile_event(EventKind::free, tile, in_use_bytes_));
}

}  // namespace flashlab
