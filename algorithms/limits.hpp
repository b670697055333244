// The limits on sizes, work and memory, in one place. An input beyond one of them is refused by
// name, with the limit, before any work starts: by Problem::validate (dimensions), by the schedule
// registry (sim/schedules.hpp: the work and memory of a run), by the trace recorder and by the
// command lines (their options' ranges are these).
#pragma once

#include <cstdint>
#include <limits>

namespace flashlab {

// --- Problem dimensions (Problem::validate) ---------------------------------------------------
inline constexpr int kMaxBatch = 1 << 30;
inline constexpr int kMaxSequenceLength = 1 << 30;
inline constexpr int kMaxHeads = 1 << 16;
inline constexpr int kMaxHeadDim = 1 << 16;
// Rows of the packed [rows, heads, dim] tensors (batch x seqlen, or a varlen batch's total) are
// int everywhere, host and device.
inline constexpr std::int64_t kMaxPackedRows = std::numeric_limits<int>::max();

// --- SRAM sizes M (every command line and sweep) ----------------------------------------------
inline constexpr std::int64_t kMaxSramBytes = std::int64_t{1} << 40;  // 1 TiB: far beyond any chip
inline constexpr std::int64_t kMinSweepSramBytes = 16;

// --- The work and memory of one simulator run (sim/schedules.cpp) -------------------------------
// The limits keep the largest accepted run to about a minute and a few GB on a laptop (measured
// on a release build: 120-220 ns per tile step, 0.5 G multiply-adds per second with the oracle; a
// data run may take a few minutes).
// A run costs O(tile steps): one step is one (query block, key block) pair of a head that is run
// (square tiling: times its slices of d); a data run's step costs 0.3-0.6 us more.
inline constexpr std::int64_t kMaxTileSteps = std::int64_t{1} << 28;
// Data runs hold the problem's tensors, the HBM scratch and the SRAM tiles in host memory (fp32;
// the command line adds the oracle's double-precision matrices),
inline constexpr std::int64_t kMaxDataBytes = std::int64_t{4} << 30;  // 4 GiB
// and compute every score and output product: multiply-adds summed over heads.
inline constexpr std::int64_t kMaxDataMultiplyAdds = std::int64_t{1} << 35;

// --- Sweeps (sim/sweep.hpp) ---------------------------------------------------------------------
inline constexpr int kMaxSweepSeqlen = 1 << 24;
inline constexpr int kMaxSweepHeadDim = 4096;

// --- Ring Attention (12_ring_attention.hpp) ------------------------------------------------------
inline constexpr int kMaxRingDevices = 1024;  // devices in a ring

// --- Traces (sim/trace.hpp) ---------------------------------------------------------------------
// A trace is held in memory while recorded and written as JSON (about 1.5 KB per event while it
// is written): its events and the tile values they keep are bounded so that both fit in a few GB.
inline constexpr std::int64_t kMaxTraceEvents = 2'000'000;
inline constexpr std::int64_t kMaxTraceValueElements = 1 << 20;  // values one compute event keeps
inline constexpr std::int64_t kMaxTraceValues = std::int64_t{1} << 25;  // values the whole trace keeps

}  // namespace flashlab
