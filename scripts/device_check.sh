#!/usr/bin/env bash
# On the GPU machine: configure and build the kernels and the GPU tests, run the correctness grid,
# then the benchmark against PyTorch SDPA, optionally Nsight Compute byte counts and the
# compute-sanitizer checks. Logs and results go under $OUT (or ./device_logs).
# Usage: scripts/device_check.sh [steps...], run in the order given; steps: build tests tests-fwd
# bench (forward and backward) bench-fwd example ncu ncu-bwd sanitize compare (default: build tests
# bench). compare: COMPARE_PATCHES="<git diff file>..." scripts/device_check.sh compare
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device_logs}
mkdir -p "$OUT"
BUILD=build/device
steps=${*:-build tests bench}
status=0

step_build() {
  start=$(date +%s)
  cmake -S . -B $BUILD -DCMAKE_BUILD_TYPE=Release -DFLASHLAB_BUILD_VIZ=OFF -DCMAKE_CUDA_ARCHITECTURES=90a \
    >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  cmake --build $BUILD --target ${BUILD_TARGETS:-test_kernels flashlab_kernels_c fa2_forward_bench test_fa2_backward_bench} -j16 >>"$OUT/build.log" 2>&1 \
    || { grep -B2 -A12 -E "error|Error" "$OUT/build.log" | head -80; exit 1; }
  echo "build (sm_90a, -j16): $(( $(date +%s) - start )) s"
}
step_example() {
  # The reference library's report on the outside example kernel with the planted bug.
  $BUILD/tests/kernels/test_kernels "[reference_example]" >"$OUT/reference_example.log" 2>&1
  echo "reference example: exit $?"; grep -m3 -A3 "^FAILED" "$OUT/reference_example.log"
}
step_tests() {
  start=$(date +%s)
  (cd $BUILD && ctest -L gpu -j4 --output-on-failure --timeout 500) >"$OUT/tests.log" 2>&1 || status=1
  echo "gpu tests: status $status in $(( $(date +%s) - start )) s"
  grep -E "tests passed|Passed|Failed|Skipped|\*\*\*" "$OUT/tests.log" | head -20
  grep -E "FAILED|REFUSED" "$OUT/tests.log" | head -20
}
step_tests_fwd() {
  # The forward kernels' tests only (the whole gpu label includes the backward's).
  $BUILD/tests/kernels/test_kernels "[fa2_forward],[fa1_forward],[api]" >"$OUT/tests.log" 2>&1 || status=1
  echo "forward gpu tests: status $status"; tail -3 "$OUT/tests.log"
}
# The benchmark on the library <lib>: results in $OUT/<name>.{json,md,log}, the progress lines (not
# the tables) printed; further arguments go to bench_kernels.py before BENCH_ARGS.
run_benchmark() {
  local lib=$1 name=$2
  shift 2
  PYTHONUNBUFFERED=1 python3 scripts/bench_kernels.py --lib "$lib" \
    --json "$OUT/$name.json" --markdown "$OUT/$name.md" "$@" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/$name.log" | grep -v "^|"
}
step_bench() { run_benchmark $BUILD/kernels/libflashlab_kernels_c.so bench --backward; }
step_bench_fwd() { run_benchmark $BUILD/kernels/libflashlab_kernels_c.so bench; }
step_ncu() {
  # DRAM and L2 bytes, time and occupancy of the FA2 forward at three sizes (bf16, d = 128,
  # non-causal), and of the FA1 forward at the middle one (fp16).
  metrics=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,launch__grid_size
  for run in "16 16 1024 2" "4 16 4096 2" "1 16 16384 2" "4 16 4096 1"; do
    set -- $run
    ncu --clock-control none --kernel-name regex:fa._forward_kernel --launch-count 1 --metrics $metrics \
      $BUILD/tests/kernels/fa2_forward_bench $1 $2 $3 128 0 1 $4 >"$OUT/ncu_fa$4_b$1_s$3.log" 2>&1
    echo "== FA$4 b=$1 h=$2 s=$3 d=128"
    grep -E "dram__|lts__|gpu__time|warps_active|hmma|grid_size|ERR" "$OUT/ncu_fa$4_b$1_s$3.log"
  done
}
step_sanitize() {
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 3 $BUILD/tests/kernels/test_kernels "[sanitizer_grid]" \
      >"$OUT/sanitizer_$tool.log" 2>&1
    echo "compute-sanitizer $tool: exit $? ($(grep -cE "ERROR|error" "$OUT/sanitizer_$tool.log") error lines)"
    tail -3 "$OUT/sanitizer_$tool.log"
    grep -m2 -A6 -E "^========= (Warning|Error)" "$OUT/sanitizer_$tool.log"
  done
}
step_ncu_bwd() {
  # Our FA2 backward's main kernel next to SDPA flash's backward kernel on the same shape (bf16,
  # batch 4, 2048 / d heads, seqlen 4096, d = NCU_BWD_HDIM or 128, non-causal): Nsight Compute's
  # full set for each, the details pages as text and the stall reasons per SASS line of ours.
  local d=${NCU_BWD_HDIM:-128}
  ncu --clock-control none --kernel-name regex:backward_main --launch-skip 2 --launch-count 1 --set full \
    --import-source yes -o "$OUT/ncu_bwd_ours" -f $BUILD/tests/kernels/test_fa2_backward_bench 16384 --hdims $d \
    --seqlens 4096 >"$OUT/ncu_bwd_ours.log" 2>&1
  ncu -i "$OUT/ncu_bwd_ours.ncu-rep" --page details >"$OUT/ncu_bwd_ours.txt" 2>&1
  ncu -i "$OUT/ncu_bwd_ours.ncu-rep" --page source --csv --print-source sass >"$OUT/ncu_bwd_ours_sass.csv" 2>&1
  ncu --clock-control none --kernel-name regex:flash_bwd_dq_dk_dv --launch-skip 2 --launch-count 1 --set full \
    -o "$OUT/ncu_bwd_sdpa" -f python3 -c "
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
q, k, v = (torch.randn(4, 2048 // $d, 4096, $d, device='cuda', dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
for _ in range(4):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        F.scaled_dot_product_attention(q, k, v).backward(torch.randn_like(q))
torch.cuda.synchronize()" >"$OUT/ncu_bwd_sdpa.log" 2>&1
  ncu -i "$OUT/ncu_bwd_sdpa.ncu-rep" --page details >"$OUT/ncu_bwd_sdpa.txt" 2>&1
  for side in ours sdpa; do
    echo "== $side"; grep -E "^  [a-z_]+.*\(|Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|Shared Memory Throughput|Warp Cycles Per Issued|Executed Ipc A|Block Size|Grid Size|Dynamic Shared" "$OUT/ncu_bwd_$side.txt" | head -24
  done
}
step_compare() {
  # Candidate changes measured against the current tree in one run. Each patch of COMPARE_PATCHES
  # (`git diff` files taken at the repository root) is applied to this tree in turn, built
  # incrementally, its GPU tests run (COMPARE_TESTS: a ctest -R regex, default all of them) and its
  # library kept; the patch is then reverted. The benchmark times the base, every variant and a
  # control (an unchanged copy of the base library: its spread from 1.0 is the noise floor) in the
  # same interleaved rounds (BENCH_ARGS; add --backward for the backward), and
  # scripts/compare_bench.py sets them side by side.
  local libs=/tmp/flashlab_compare lib=$BUILD/kernels/libflashlab_kernels_c.so patch name variants=()
  rm -rf $libs && mkdir -p $libs
  step_build
  cp $lib $libs/base.so && cp $lib $libs/control.so && variants+=(--variant "control=$libs/control.so")
  for patch in ${COMPARE_PATCHES:?compare needs COMPARE_PATCHES=\"<git diff file>...\"}; do
    name=$(basename "$patch" .patch)
    mkdir -p "$OUT/$name"
    patch -p1 --quiet <"$patch" || { echo "$name: the patch does not apply"; status=1; continue; }
    if cmake --build $BUILD --target flashlab_kernels_c test_kernels -j16 >"$OUT/$name/build.log" 2>&1; then
      # A shorter limit than the tests step's: a patched kernel that hangs costs 4 minutes, not 8.
      (cd $BUILD && ctest -L gpu -R "${COMPARE_TESTS:-.}" -j4 --timeout 240) >"$OUT/$name/tests.log" 2>&1 \
        || { echo "$name: GPU TESTS FAILED"; status=1; }
      echo "$name: $(grep -E "tests passed" "$OUT/$name/tests.log")"; grep -E "\*\*\*Failed|Timeout" "$OUT/$name/tests.log"
      cp $lib "$libs/$name.so" && variants+=(--variant "$name=$libs/$name.so")
    else
      echo "$name: build failed"; grep -m20 -E "error" "$OUT/$name/build.log"; status=1
    fi
    patch -R -p1 --quiet <"$patch"
  done
  cmake --build $BUILD --target ${BUILD_TARGETS:-test_kernels flashlab_kernels_c} -j16 >>"$OUT/build.log" 2>&1  # the base again
  run_benchmark $libs/base.so compare --fa1-max-seqlen 0 "${variants[@]}" >/dev/null || status=1
  python3 scripts/compare_bench.py "$OUT/compare.json" | tee "$OUT/compare.md"
}
for step in $steps; do
  "step_${step//-/_}"
done
exit $status
