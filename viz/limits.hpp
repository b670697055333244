// What the visualizer records and replays, in one place. Every frame draws each score cell and
// walks the events and live tiles up to the cursor, so these bound the work of a frame; a trace
// beyond them is refused by name (check_replayable, record_trace) before a window opens.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashlab::viz {

// Recording in the app: problems a person can follow tile by tile; larger ones belong to the
// shape-only sweep (`flashlab sweep`), which counts without keeping events.
inline constexpr int kMaxAnimatedSeqlen = 1024;
inline constexpr std::size_t kMaxAnimatedEvents = 400'000;
// S and P tiles up to this many elements keep their values, for the hover tooltip.
inline constexpr std::int64_t kRecordedTileValues = 128 * 128;

// Replaying a trace file (`flashlab trace` records larger ones than the app does).
inline constexpr int kMaxReplaySeqlen = 1 << 16;
// The closed form shown beside the counters walks every (query block, key block) pair: 2^24
// pairs take about 0.1 s.
inline constexpr std::int64_t kMaxReplayTilePairs = std::int64_t{1} << 24;
// The finest grid the app records: one cell per score at N = kMaxAnimatedSeqlen.
inline constexpr std::int64_t kMaxScoreCells = std::int64_t{kMaxAnimatedSeqlen} * kMaxAnimatedSeqlen;
// Tiles in SRAM at once: every schedule holds at most 16.
inline constexpr std::size_t kMaxLiveTiles = 64;

}  // namespace flashlab::viz
