#include "l2_cache.hpp"

#include <stdexcept>
#include <string>

#include "algorithms/checked_math.hpp"

namespace flashlab::sim {

L2Counters& L2Counters::operator+=(const L2Counters& o) {
  checked_accumulate(dram_read_bytes, o.dram_read_bytes, "dram_read_bytes");
  checked_accumulate(dram_write_bytes, o.dram_write_bytes, "dram_write_bytes");
  checked_accumulate(dirty_at_end_bytes, o.dirty_at_end_bytes, "dirty_at_end_bytes");
  checked_accumulate(l2_to_sm_bytes, o.l2_to_sm_bytes, "l2_to_sm_bytes");
  checked_accumulate(sm_to_l2_write_sectors, o.sm_to_l2_write_sectors, "sm_to_l2_write_sectors");
  checked_accumulate(sm_to_l2_reduction_sectors, o.sm_to_l2_reduction_sectors, "sm_to_l2_reduction_sectors");
  checked_accumulate(read_hit_bytes, o.read_hit_bytes, "read_hit_bytes");
  checked_accumulate(read_miss_bytes, o.read_miss_bytes, "read_miss_bytes");
  checked_accumulate(far_hit_bytes, o.far_hit_bytes, "far_hit_bytes");
  checked_accumulate(reads, o.reads, "reads");
  checked_accumulate(writes, o.writes, "writes");
  checked_accumulate(atomics, o.atomics, "atomics");
  return *this;
}

std::size_t L2Cache::KeyHash::operator()(const L2UnitKey& key) const noexcept {
  std::uint64_t h = key.first_sector * 0x9e3779b97f4a7c15ull;
  h ^= (static_cast<std::uint64_t>(key.rows) << 32 | key.sectors) + 0x7f4a7c159e3779b9ull + (h << 6) + (h >> 2);
  return static_cast<std::size_t>(h ^ (h >> 31));
}

// --- One partition ----------------------------------------------------------------------------

void L2Cache::Partition::unlink(int index) {
  Unit& u = units_[index];
  (u.newer >= 0 ? units_[u.newer].older : newest_) = u.older;
  (u.older >= 0 ? units_[u.older].newer : oldest_) = u.newer;
  u.newer = u.older = -1;
}

void L2Cache::Partition::push_newest(int index) {
  Unit& u = units_[index];
  u.newer = -1;
  u.older = newest_;
  (newest_ >= 0 ? units_[newest_].newer : oldest_) = index;
  newest_ = index;
}

void L2Cache::Partition::evict_to_capacity() {
  while (used_bytes > capacity_bytes_ && oldest_ >= 0) {
    const int victim = oldest_;
    const Unit& u = units_[victim];
    if (u.dirty) {  // write-back: the dirty unit goes to DRAM now
      checked_accumulate(counters_->dram_write_bytes, u.bytes, "dram_write_bytes");
      dirty_bytes -= u.bytes;
    }
    used_bytes -= u.bytes;
    index_.erase(u.key);
    unlink(victim);
    free_units_.push_back(victim);
  }
}

bool L2Cache::Partition::touch(const L2UnitKey& key) {
  const auto found = index_.find(key);
  if (found == index_.end()) return false;
  unlink(found->second);
  push_newest(found->second);
  return true;
}

void L2Cache::Partition::insert(const L2UnitKey& key, std::int64_t bytes, bool dirty) {
  int index = 0;
  if (free_units_.empty()) {
    index = static_cast<int>(units_.size());
    units_.emplace_back();
  } else {
    index = free_units_.back();
    free_units_.pop_back();
  }
  units_[index] = Unit{key, bytes, -1, -1, dirty};
  index_.emplace(key, index);
  push_newest(index);
  used_bytes += bytes;
  if (dirty) dirty_bytes += bytes;
  evict_to_capacity();
}

void L2Cache::Partition::make_dirty(const L2UnitKey& key) {
  Unit& u = units_[index_.at(key)];
  if (!u.dirty) u.dirty = true, dirty_bytes += u.bytes;
}

// --- The cache --------------------------------------------------------------------------------

L2Cache::L2Cache(std::int64_t capacity_bytes, int sector_bytes, int partitions)
    : capacity_bytes_(capacity_bytes), sector_bytes_(sector_bytes) {
  if (capacity_bytes < 0) throw std::invalid_argument("L2 capacity = " + std::to_string(capacity_bytes) + " bytes; allowed: >= 0");
  if (sector_bytes < 1) throw std::invalid_argument("L2 sector = " + std::to_string(sector_bytes) + " bytes; allowed: >= 1");
  if (partitions < 1 || partitions > 64) {
    throw std::invalid_argument("L2 partitions = " + std::to_string(partitions) + "; allowed: 1..64");
  }
  for (int p = 0; p < partitions; ++p) parts_.emplace_back(capacity_bytes / partitions, counters_);
}

int L2Cache::home(const L2UnitKey& key) const {
  // The address decides: hashed, as the hardware spreads addresses over its slices.
  return static_cast<int>(KeyHash{}(L2UnitKey{key.first_sector, 0, 0}) % parts_.size());
}

std::int64_t L2Cache::used_bytes() const {
  std::int64_t used = 0;
  for (const Partition& p : parts_) used += p.used_bytes;
  return used;
}

void L2Cache::access(const L2UnitKey& key, Access kind, std::int64_t request_sectors, int side) {
  if (request_sectors < 0) {
    throw std::invalid_argument("L2 access: request_sectors = " + std::to_string(request_sectors) +
                                "; allowed: >= 0 (0: the unit's sectors)");
  }
  const std::int64_t bytes = checked_mul(key.sectors, sector_bytes_, "bytes of an L2 unit");
  const std::int64_t requested = request_sectors > 0 ? request_sectors : key.sectors;
  const int home_part = home(key), near_part = side % partitions();
  Partition& home_partition = parts_[static_cast<std::size_t>(home_part)];
  if (kind == Access::read) {
    ++counters_.reads;
    checked_accumulate(counters_.l2_to_sm_bytes, checked_mul(requested, sector_bytes_, "L2 -> SM bytes"), "l2_to_sm_bytes");
    Partition& near_partition = parts_[static_cast<std::size_t>(near_part)];
    if (near_partition.touch(key)) {
      checked_accumulate(counters_.read_hit_bytes, bytes, "read_hit_bytes");
      return;
    }
    checked_accumulate(counters_.read_miss_bytes, bytes, "read_miss_bytes");
    if (near_part != home_part && home_partition.touch(key)) {
      checked_accumulate(counters_.far_hit_bytes, bytes, "far_hit_bytes");
    } else {
      checked_accumulate(counters_.dram_read_bytes, bytes, "dram_read_bytes");
      if (near_part != home_part) home_partition.insert(key, bytes, false);
    }
    near_partition.insert(key, bytes, false);  // the near partition's copy (the home's own when they are one)
    return;
  }
  if (kind == Access::write) {
    ++counters_.writes;
    checked_accumulate(counters_.sm_to_l2_write_sectors, requested, "sm_to_l2_write_sectors");
  } else {
    ++counters_.atomics;
    checked_accumulate(counters_.sm_to_l2_reduction_sectors, requested, "sm_to_l2_reduction_sectors");
  }
  if (home_partition.touch(key)) {
    home_partition.make_dirty(key);
    return;
  }
  if (kind == Access::atomic) checked_accumulate(counters_.dram_read_bytes, bytes, "dram_read_bytes");  // the add needs the old value
  home_partition.insert(key, bytes, true);
}

L2Counters L2Cache::counters() const {
  L2Counters result = counters_;
  for (const Partition& p : parts_) result.dirty_at_end_bytes += p.dirty_bytes;
  return result;
}

}  // namespace flashlab::sim
