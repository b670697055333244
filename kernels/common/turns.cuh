// Turns through a counter in global memory, for reductions that must add in a fixed order (the
// deterministic dQ of the FA2 and FA3 backward rungs): a block waits until the counter shows its
// turn, adds, makes its sums visible (__threadfence and a barrier of its adders), and passes the
// turn on. Written from the PTX ISA's memory consistency model (ld.acquire / st.release, gpu scope).
#pragma once

namespace flashlab::kernels::device {

// One thread spins until *counter == turn; the sums of the earlier turns are visible after it.
__device__ __forceinline__ void wait_for_turn(const int* counter, int turn) {
  int seen;
  do {
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
  } while (seen != turn);
}

// One thread hands the turn on (*counter = next_turn), once every adder's sums are visible.
__device__ __forceinline__ void pass_turn(int* counter, int next_turn) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;\n" ::"l"(counter), "r"(next_turn) : "memory");
}

}  // namespace flashlab::kernels::device
