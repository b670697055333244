#!/usr/bin/env bash
# On the GPU machine: build the FA2 backward kernel, its tests and its timing program on their own
# (the CPU libraries through the project's CMake, the kernel through a small CMake project), run the
# correctness tests, then time the kernel and PyTorch SDPA's flash backward on the same shapes.
# Logs go to $OUT (or ./fa2_backward_logs). Usage: tests/kernels/test_fa2_backward_device.sh [tests|bench|all]
set -uo pipefail
cd "$(dirname "$0")/../.."
SRC=$(pwd)
OUT=${OUT:-$SRC/fa2_backward_logs}
mkdir -p "$OUT"
WHAT=${1:-all}
ARCH=${CUDA_ARCH:-90a}
BUILD=$SRC/build/fa2_backward_device
mkdir -p "$BUILD/kernel_project"
cmake -S . -B "$BUILD/cpu" -DCMAKE_BUILD_TYPE=Release -DFLASHLAB_BUILD_KERNELS=OFF -DFLASHLAB_BUILD_VIZ=OFF >"$OUT/cmake_cpu.log" 2>&1 \
  && cmake --build "$BUILD/cpu" --target flashlab_reference -j16 >>"$OUT/cmake_cpu.log" 2>&1 || { tail -30 "$OUT/cmake_cpu.log"; exit 1; }
cat >"$BUILD/kernel_project/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.25)
project(fa2_backward_device LANGUAGES CXX CUDA)
set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_ARCHITECTURES $ARCH)
find_package(CUDAToolkit REQUIRED)
find_package(Catch2 3 QUIET)
if(NOT Catch2_FOUND)
  find_package(Catch2 2 REQUIRED)
endif()
add_library(fa2_backward STATIC $SRC/kernels/03_fa2_backward.cu $SRC/kernels/attention_api.cpp)
target_include_directories(fa2_backward PUBLIC $SRC $SRC/tests)
target_compile_options(fa2_backward PRIVATE \$<\$<COMPILE_LANGUAGE:CUDA>:--use_fast_math -lineinfo -Xptxas=-v>)
target_link_libraries(fa2_backward PUBLIC CUDA::cudart $BUILD/cpu/tests/libflashlab_reference.a $BUILD/cpu/algorithms/libflashlab_algorithms.a)
add_executable(test_fa2_backward $SRC/tests/kernels/test_fa2_backward.cpp)
target_link_libraries(test_fa2_backward PRIVATE fa2_backward Catch2::Catch2WithMain)
add_executable(test_fa2_backward_bench $SRC/tests/kernels/test_fa2_backward_bench.cu)
target_link_libraries(test_fa2_backward_bench PRIVATE fa2_backward)
CMAKE
start=$(date +%s)
cmake -S "$BUILD/kernel_project" -B "$BUILD/kernel_build" -DCMAKE_BUILD_TYPE=Release >"$OUT/cmake_kernel.log" 2>&1 \
  && cmake --build "$BUILD/kernel_build" -j16 >>"$OUT/cmake_kernel.log" 2>&1 || { grep -B2 -A10 "error" "$OUT/cmake_kernel.log" | head -60; exit 1; }
echo "kernel build: $(( $(date +%s) - start )) s"
grep -A2 "backward_main_kernel" "$OUT/cmake_kernel.log" | grep -E "registers|spill" | head -8
status=0
if [[ $WHAT == tests || $WHAT == all ]]; then
  start=$(date +%s)
  "$BUILD/kernel_build/test_fa2_backward" --durations yes >"$OUT/tests.log" 2>&1
  status=$?
  echo "tests: exit $status in $(( $(date +%s) - start )) s"
  tail -25 "$OUT/tests.log"
fi
if [[ $WHAT == bench || $WHAT == all ]]; then
  "$BUILD/kernel_build/test_fa2_backward_bench" 16384 | tee "$OUT/bench.log"
  PYTHONUNBUFFERED=1 timeout 240 python3 tests/kernels/test_fa2_backward_sdpa.py flash | tee "$OUT/sdpa.log"
fi
exit $status
