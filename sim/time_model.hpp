// The time model: how long a kernel takes, from the three-level model's work and traffic
// (hierarchy.hpp) and the machine's rates, with a few constants per kernel calibrated on measured
// times (sim/machines/*.json "time_model"; scripts/calibrate_time_model.py).
//
// One tile step of a thread block (a query block against a key block: 4 Br Bc d matmul FLOPs
// forward, 10 Br Bc d backward, Br Bc scores), on the SM that runs it:
//   tensor  = step FLOPs / (tensor_efficiency x the measured matmul rate per SM)
//   softmax = step scores x softmax_cycles_per_score / the SM clock   (exponentials, row max and
//             sum, rescaling: the non-matmul work, on the FP32 and special-function pipes)
//   SM time = tensor + softmax where one block runs them one after the other (FA2's loop has no
//             overlap of softmax and GEMM; its warps meet at barriers every step: the FA2 forward
//             above d 128 and the FA2 and Hopper backward, one block per SM); max(tensor, softmax)
//             where they overlap: the Hopper forward's warp specialization with ping-pong (one
//             warpgroup's softmax under the other's GEMMs), or two blocks sharing an SM (the FA2
//             forward up to d 128, FA1: the warp schedulers run one block's softmax under the
//             other's GEMMs)
// The blocks resident on an SM share it, so a block's step takes blocks-per-SM x the SM time, or
// the latency of its dependent global-memory round trips (FA1's O state) if that is longer. A
// thread block takes block_seconds (start, first loads, epilogue) plus its steps. The blocks are
// dealt to the SMs' slots in launch order, each to the first free slot (waves, occupancy and the
// tail of the last wave); the kernel takes the longest of that schedule, its DRAM bytes at the
// measured copy bandwidth and its L2 -> SM bytes at the L2 bandwidth. The backward pass adds its
// other kernels (D, the dQ conversion), streaming their bytes at the copy bandwidth.
//
// The bound named is the largest term: "dram", "l2", or for the SM schedule what dominates a
// step: "tensor", "exp" (the softmax's pipes) or "latency" (round trips and per-block overhead).
#pragma once

#include <string>

#include "sim/hierarchy.hpp"
#include "sim/machines.hpp"

namespace flashlab::sim {

struct TimePrediction {
  double seconds = 0;               // the pass: main kernel + other kernels
  double kernel_seconds = 0;        // the main kernel alone (what Nsight Compute times)
  std::string bound;                // "tensor", "exp", "latency", "dram", "l2"
  double sm_seconds = 0;            // the thread blocks on the SMs (the dispatch schedule's length)
  double dram_seconds = 0, l2_seconds = 0;
  double other_kernels_seconds = 0;
  // Per tile step of one thread block: its parts, and what it takes with the SM shared.
  double step_tensor_seconds = 0, step_softmax_seconds = 0, step_latency_seconds = 0, step_seconds = 0;
  double block_seconds = 0;         // the calibrated per-block overhead
  double slot_utilisation = 0;      // busy slot time / (slots x schedule length): the tail's cost
  std::string constants;            // the time_model key used ("fa2_forward")
};

// The machine's calibrated constants for the kernel; throws std::invalid_argument naming the
// machine and the kernel when it has none.
const KernelTimeConstants& time_constants(const Machine& machine, const KernelChoice& kernel);
std::string time_constants_key(const KernelChoice& kernel);  // "fa2_forward"

TimePrediction predict_time(const HierarchyResult& run, const Machine& machine);
TimePrediction predict_time(const HierarchyResult& run, const Machine& machine, const KernelTimeConstants& constants);

}  // namespace flashlab::sim
