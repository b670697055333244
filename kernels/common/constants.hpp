// Numbers every rung shares, on the host and in the kernels (plain C++, no CUDA needed).
#pragma once

#include <numbers>

namespace flashlab::kernels {

// The softmax works in base 2: exp(x) = exp2(x log2 e) and ln(x) = log2(x) ln 2. The host folds
// log2 e into the scale in double precision; the kernels use the float constants.
inline constexpr double kLog2e = std::numbers::log2e;
inline constexpr float kLog2eFloat = std::numbers::log2e_v<float>;
inline constexpr float kLn2Float = std::numbers::ln2_v<float>;

// Shared memory one thread block may opt into (CUDA C++ Programming Guide, technical
// specifications per compute capability): the budgets the tilings are chosen for.
inline constexpr int kTuringSharedBytes = 64 * 1024;   // sm_75 (T4, TITAN RTX)
inline constexpr int kAmpereSharedBytes = 163 * 1024;  // sm_80 (A100)
inline constexpr int kHopperSharedBytes = 227 * 1024;  // sm_90 (H100, H200)

// The L2 share a causal FA3 forward keeps the K and V of the tiles in flight within
// (kernels/03_fa3_sm90/tile_order.hpp): a quarter of the H200's 60 MB L2 measured best of 8, 16,
// 32 MiB and no sections (docs/bench/h200_fa3_tile_order.md).
inline constexpr long long kL2SectionBytes = 16ll << 20;

// FA4's conditional rescaling: the running max moves only when a block's max exceeds it by more
// than this (log2 units), so P = exp2(s - m) stays <= 2^8 = 256, well inside fp16's range.
inline constexpr float kRescaleThresholdLog2 = 8.0f;

inline constexpr int kWarpSize = 32;
// Q, K, V, O, dO and the gradients are 16-bit (fp16 or bf16) in every kernel.
inline constexpr int kElementBytes = 2;
// Elements of one 16-byte access (cp.async, a uint4 load or store): a tile row moves in chunks of
// this many elements, so head dims are multiples of it.
inline constexpr int kChunkElements = 16 / kElementBytes;
// The FA2 rung instantiates head dims in steps of this many (two k16 mma steps); a head dim runs
// on the next instance up.
inline constexpr int kHeadDimStep = 32;
constexpr int round_up(int value, int multiple) { return (value + multiple - 1) / multiple * multiple; }

// Shared tiles pad each row by one chunk, so the 8 row addresses of an ldmatrix fall in 8
// different bank groups (no bank conflicts).
inline constexpr int kSharedRowPadding = kChunkElements;

}  // namespace flashlab::kernels
