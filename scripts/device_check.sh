#!/usr/bin/env bash
# On the GPU machine: configure and build the kernels and the GPU tests, run the correctness grid,
# then the benchmark against PyTorch SDPA, optionally Nsight Compute byte counts and the
# compute-sanitizer checks. Logs and results go under $OUT (or ./device_logs).
# Usage: scripts/device_check.sh [steps...], run in the order given; steps: build tests tests-fwd
# tests-sm90 ptxas bench (forward and backward) bench-fwd bwd-kernels example ncu ncu-sm90 ncu-bwd ncu-model sanitize
# sanitize-sm90 fa4 fa4-sass variants compare compare-bench python lab06 decode ring (default: build tests
# bench). ncu-model: Nsight Compute's DRAM, L2 -> SM bytes, SM -> L2 store and reduction sectors,
# time and SM clock of FA1, FA2 and FA3 (forward and backward) at three sizes, beside the
# three-level model (scripts/model_vs_ncu.py;
# $OUT/ncu_model.{csv,md,json}). python: the Python package in the build tree (flashlab._core and
# the kernel library) and its pytest suite, the GPU tests (marker gpu) included. lab06: the
# course's lab-06 grader on this GPU (python/tests/gpu/test_grade_lab06.py; flashlab._core alone is
# built, the kernels are not): the reference solution, the untouched skeleton and each planted
# mistake graded, a score line each. decode: the decode rung's GPU tests (decode-tests: those
# alone), its benchmark against SDPA's flash and cuDNN with the read-only ceiling, Nsight Compute's
# DRAM bytes beside the KV bytes, and memcheck on a small grid. ring: Ring Attention on this one
# GPU (flashlab.distributed with P logical ranks on streams of it): its CPU and GPU tests, the
# 2x/3x check against attention on the gathered tensors and a timing of the overlap
# (scripts/ring_bench.py --local 4; under two minutes once the package is built). compare:
# COMPARE_PATCHES="<git diff file>..." scripts/device_check.sh compare. TRAP_HANGS=ON builds the
# Hopper kernels with the bounded mbarrier wait that traps (kernels/common/sm90_sync.cuh).
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
    -DFLASHLAB_TRAP_HANGS=${TRAP_HANGS:-OFF} >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  cmake --build $BUILD --target ${BUILD_TARGETS:-test_kernels test_sm90_primitives flashlab_kernels_c fa2_forward_bench test_fa2_backward_bench} -j16 >>"$OUT/build.log" 2>&1 \
    || { grep -B2 -A12 -E "error|Error" "$OUT/build.log" | head -80; exit 1; }
  echo "build (sm_90a, -j16): $(( $(date +%s) - start )) s"
}
step_python() {
  start=$(date +%s)
  [[ -f $BUILD/CMakeCache.txt ]] || step_build
  cmake -S . -B $BUILD -DPython_EXECUTABLE="$(command -v python3)" >>"$OUT/build.log" 2>&1 \
    && cmake --build $BUILD --target flashlab_python_core flashlab_python_kernels -j16 >>"$OUT/build.log" 2>&1 \
    || { grep -B2 -A12 -E "error|Error" "$OUT/build.log" | head -80; status=1; return; }
  # pytest-xdist, where present, spreads the cases (their oracle runs on the CPU) over 8 workers.
  local parallel=(); python3 -c "import xdist" 2>/dev/null && parallel=(-n 8)
  PYTHONPATH=$PWD/$BUILD/python${PYTHONPATH:+:$PYTHONPATH} python3 -m pytest -q -p no:cacheprovider -rs "${parallel[@]}" python/tests \
    >"$OUT/python_tests.log" 2>&1 || status=1
  echo "python package tests: status $status in $(( $(date +%s) - start )) s"
  tail -15 "$OUT/python_tests.log"
}
step_lab06() {
  # The grader compiles each submission with nvcc for this GPU and checks it with the reference-test
  # library; the test prints one line per report ("lab06 <submission> score S / 10 [per check]").
  start=$(date +%s)
  cmake -S . -B $BUILD -DCMAKE_BUILD_TYPE=Release -DFLASHLAB_BUILD_VIZ=OFF -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DPython_EXECUTABLE="$(command -v python3)" >>"$OUT/build.log" 2>&1 \
    && cmake --build $BUILD --target flashlab_python_core -j16 >>"$OUT/build.log" 2>&1 \
    || { grep -B2 -A12 -E "error|Error" "$OUT/build.log" | head -80; status=1; return; }
  echo "lab06: flashlab._core ready in $(( $(date +%s) - start )) s"
  start=$(date +%s)
  local lab_status=0
  PYTHONPATH=$PWD/$BUILD/python${PYTHONPATH:+:$PYTHONPATH} python3 -m pytest -q -s -rs -p no:cacheprovider \
    python/tests/gpu/test_grade_lab06.py >"$OUT/lab06.log" 2>&1 || lab_status=1
  [ $lab_status = 0 ] || status=1
  echo "lab06 grader on the GPU: status $lab_status in $(( $(date +%s) - start )) s (reports in $OUT/lab06.log)"
  grep -E "^lab06 " "$OUT/lab06.log"
  grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" "$OUT/lab06.log" | tail -12
}
step_ring() {
  # Ring Attention on one GPU: P logical ranks, each on its own stream, device-to-device copies on a
  # copy stream in place of NCCL. The package's build as the python step's (incremental once built).
  start=$(date +%s)
  [[ -f $BUILD/CMakeCache.txt ]] || step_build
  cmake -S . -B $BUILD -DPython_EXECUTABLE="$(command -v python3)" >>"$OUT/build.log" 2>&1 \
    && cmake --build $BUILD --target flashlab_python_core flashlab_python_kernels -j16 >>"$OUT/build.log" 2>&1 \
    || { grep -B2 -A12 -E "error|Error" "$OUT/build.log" | head -80; status=1; return; }
  local ring_status=0
  PYTHONPATH=$PWD/$BUILD/python${PYTHONPATH:+:$PYTHONPATH} python3 -m pytest -q -p no:cacheprovider -rs \
    python/tests/test_distributed.py python/tests/gpu/test_distributed_gpu.py >"$OUT/ring_tests.log" 2>&1 || ring_status=1
  echo "ring tests (CPU ring, gloo ring, one-GPU ring by the 2x/3x rule): status $ring_status"
  tail -3 "$OUT/ring_tests.log"
  PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/$BUILD/python${PYTHONPATH:+:$PYTHONPATH} python3 scripts/ring_bench.py --local 4 --check \
    --seqlens-per-gpu 4096,16384 --backward --repeats 5 --json "$OUT/ring_local.json" --markdown "$OUT/ring_local.md" \
    >"$OUT/ring_bench.log" 2>&1 || ring_status=1
  grep -E "^(PASS|FAIL)|correctness" "$OUT/ring_bench.log"
  grep -E "^\||logical ranks|Error|error" "$OUT/ring_bench.log" | head -20
  echo "ring: status $ring_status in $(( $(date +%s) - start )) s"
  [ $ring_status = 0 ] || status=1
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
step_tests_sm90() {
  # The Hopper rung alone: its primitives, then the FA3 forward and backward grids, each under a time limit.
  start=$(date +%s)
  (cd $BUILD && ctest -L gpu -R "sm90_primitives|fa3_forward|fa3_backward" --output-on-failure --timeout 420) >"$OUT/tests_sm90.log" 2>&1 || status=1
  echo "sm90 tests: status $status in $(( $(date +%s) - start )) s"
  grep -E "tests passed|Passed|Failed|\*\*\*|Timeout" "$OUT/tests_sm90.log" | head -20
  grep -E -B2 -A12 "FAILED|REFUSED" "$OUT/tests_sm90.log" | head -60
}
step_ptxas() {
  # The Hopper kernels' resource report (scripts/ptxas_check.sh): 0 spill bytes, none of the
  # warnings that mean wgmma was serialised or setmaxnreg ignored, and HGMMA in the SASS.
  bash scripts/ptxas_check.sh --log "$OUT/ptxas.log" || status=1
}
step_fa4() {
  # FlashAttention-4 from wheels carried in .whl/, installed into /tmp/site (the benchmark puts it
  # on its path). A wheel too large for one transfer comes in two parts: NAME.part-a in .whl_a/,
  # carried by an earlier call and left in /tmp, and NAME.part-b in .whl/, joined here.
  if python3 -c "import sys; sys.path[:0] = ['/tmp/site', '/tmp/site/nvidia_cutlass_dsl/dsl_packages']; import flash_attn.cute" 2>/dev/null; then
    echo "fa4: already installed"; return
  fi
  cp .whl_a/*.part-a /tmp/ 2>/dev/null || true
  if ! ls .whl/*.whl >/dev/null 2>&1; then echo "fa4: no wheels in .whl/ (parts kept in /tmp: $(ls /tmp/*.part-a 2>/dev/null))"; return; fi
  mkdir -p /tmp/wheels
  local part name
  for part in .whl/*.part-b; do
    [ -e "$part" ] || continue
    name=$(basename "$part" .part-b)
    [ -e "/tmp/$name.part-a" ] || { echo "fa4: /tmp/$name.part-a is missing"; status=1; return; }
    cat "/tmp/$name.part-a" "$part" >"/tmp/wheels/$name"
  done
  cp .whl/*.whl /tmp/wheels/
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/wheels/*.whl \
    >"$OUT/fa4_install.log" 2>&1 || { echo "fa4: install failed"; tail -5 "$OUT/fa4_install.log"; status=1; return; }
  echo "fa4: installed $(ls /tmp/wheels | tr '\n' ' ')"
}
step_fa4_sass() {
  # FlashAttention-4's sm90 backward as compiled here (after the fa4 step): its main kernel's PTX
  # and cubin for d 64 and 128, with and without the causal mask, one process per configuration
  # (the DSL names its files after the kernel, not the configuration), in $OUT/fa4_sass.tgz, to
  # read beside our instances' SASS (cuobjdump -sass, scripts/sass_loop_mix.py).
  local d causal dir=/tmp/fa4_sass
  rm -rf $dir
  for d in 64 128; do
    for causal in False True; do
      mkdir -p $dir/d${d}_causal_$causal
      CUTE_DSL_KEEP=ptx,cubin CUTE_DSL_DUMP_DIR=$dir/d${d}_causal_$causal python3 -c "
import sys, torch
sys.path[:0] = ['/tmp/site', '/tmp/site/nvidia_cutlass_dsl/dsl_packages']
from flash_attn.cute import flash_attn_func
q, k, v = (torch.randn(2, 2048, 2048 // $d, $d, device='cuda', dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
out = flash_attn_func(q, k, v, causal=$causal)
out = out[0] if isinstance(out, tuple) else out
torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
torch.cuda.synchronize()" >>"$OUT/fa4_sass.log" 2>&1 || { echo "fa4-sass: d $d causal $causal failed"; tail -5 "$OUT/fa4_sass.log"; status=1; }
      (cd $dir/d${d}_causal_$causal && for f in *flash_bwd_sm90*; do mv "$f" "bwd_main.${f##*.}"; done; rm -f cutlass___call___*)
    done
  done
  tar czf "$OUT/fa4_sass.tgz" -C $dir . && echo "fa4-sass: $(tar tzf "$OUT/fa4_sass.tgz" | grep -c bwd_main) files in fa4_sass.tgz"
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
  PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:${PYTHONPATH:-} \
    python3 scripts/bench_kernels.py --lib "$lib" \
    --json "$OUT/$name.json" --markdown "$OUT/$name.md" "$@" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/$name.log" | grep -v "^|"
}
step_bench() { run_benchmark $BUILD/kernels/libflashlab_kernels_c.so bench --backward; }
step_bench_fwd() { run_benchmark $BUILD/kernels/libflashlab_kernels_c.so bench; }
step_bwd_kernels() {
  # Every kernel one backward call launches, ours beside cuDNN and FlashAttention-4 (after the fa4
  # step), time per call, medians of interleaved rounds (scripts/backward_kernel_times.py;
  # BWD_KERNELS_ARGS, e.g. --seqlens 2048 --rounds 7).
  PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:${PYTHONPATH:-} \
    python3 scripts/backward_kernel_times.py --lib $BUILD/kernels/libflashlab_kernels_c.so \
    --json "$OUT/bwd_kernels.json" --markdown "$OUT/bwd_kernels.md" ${BWD_KERNELS_ARGS:-} >"$OUT/bwd_kernels.log" 2>&1 \
    || { status=1; tail -20 "$OUT/bwd_kernels.log"; }
  cat "$OUT/bwd_kernels.md" 2>/dev/null
}
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
step_ncu_model() {
  # The main kernel of FA1 forward (fp16), FA2 forward and backward, FA3 forward and backward (bf16),
  # d 128, 16 heads, non-causal, 16k tokens as b 16 s 1024, b 4 s 4096, b 1 s 16384: one launch each
  # (--launch-count 1, clocks as they are), the metrics the three-level model predicts (the stores'
  # and the reductions' SM -> L2 sectors apart), those that say which unit is busiest, and the SM
  # clock of the launch. Then scripts/model_vs_ncu.py collects them into $OUT/ncu_model.csv and,
  # where the build tree has the Python package, sets the model beside them ($OUT/ncu_model.md, .json).
  local start=$(date +%s) logs=$OUT/ncu_model wanted names present=() missing=() metric
  mkdir -p "$logs"
  wanted="dram__bytes_read.sum dram__bytes_write.sum l1tex__m_xbar2l1tex_read_bytes.sum gpu__time_duration.sum
    lts__t_sectors_srcunit_tex_op_write.sum sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active
    sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active dram__throughput.avg.pct_of_peak_sustained_elapsed
    lts__t_sectors.avg.pct_of_peak_sustained_elapsed lts__t_sectors_srcunit_tex_op_red.sum
    smsp__cycles_elapsed.avg.per_second"
  names=$(ncu --query-metrics 2>/dev/null | awk '{print $1}')
  for metric in $wanted; do
    if grep -qx "${metric%%.*}" <<<"$names"; then present+=("$metric"); else missing+=("$metric"); fi
  done
  echo "ncu metrics: ${present[*]}"
  [ ${#missing[@]} = 0 ] || echo "ncu metrics MISSING on this device (left out): ${missing[*]}"
  local metrics; metrics=$(IFS=,; echo "${present[*]}")
  python3 -c "import torch; p = torch.cuda.get_device_properties(0); print(f'device: {p.name}, {p.multi_processor_count} SMs, L2 {p.L2_cache_size} bytes')" \
    2>/dev/null | tee "$logs/device.txt"
  local shape batch seqlen generation direction log
  for shape in "16 1024" "4 4096" "1 16384"; do
    read -r batch seqlen <<<"$shape"
    for generation in 1 2 3; do
      log=$logs/ncu_model_fa${generation}_forward_b${batch}_s${seqlen}.log
      ncu --clock-control none --kernel-name regex:fa${generation}_forward_kernel --launch-count 1 --metrics "$metrics" \
        $BUILD/tests/kernels/fa2_forward_bench $batch 16 $seqlen 128 0 1 $generation >"$log" 2>&1
      echo "== FA$generation forward b=$batch s=$seqlen: $(grep -cE "dram__|xbar|gpu__time" "$log") metrics$(grep -m1 -E "ERR|rror" "$log")"
    done
    for generation in 2 3; do
      log=$logs/ncu_model_fa${generation}_backward_b${batch}_s${seqlen}.log
      ncu --clock-control none --kernel-name regex:"backward_main|fa3_backward_kernel" --launch-count 1 --metrics "$metrics" \
        $BUILD/tests/kernels/test_fa2_backward_bench 16384 --hdims 128 --seqlens $seqlen --generation $generation >"$log" 2>&1
      echo "== FA$generation backward b=$batch s=$seqlen: $(grep -cE "dram__|xbar|gpu__time" "$log") metrics$(grep -m1 -E "ERR|rror" "$log")"
    done
  done
  python3 scripts/model_vs_ncu.py collect "$logs" --csv "$OUT/ncu_model.csv" || status=1
  if PYTHONPATH=$PWD/$BUILD/python python3 -c "import flashlab._core" 2>/dev/null; then
    PYTHONPATH=$PWD/$BUILD/python python3 scripts/model_vs_ncu.py compare "$OUT/ncu_model.csv" --markdown "$OUT/ncu_model.md" \
      --json "$OUT/ncu_model.json" | tail -12 || status=1
  else
    echo "model beside ncu: PYTHONPATH=build/release/python python3 scripts/model_vs_ncu.py compare ncu_model.csv --markdown ncu_model.md"
  fi
  echo "ncu-model: $(( $(date +%s) - start )) s"
}
step_ncu_sm90() {
  # The FA3 forward at d 128 (bf16, 16 heads; seqlen 4096 x batch 4, non-causal and causal, and
  # seqlen 2048 x batch 8 causal): time,
  # tensor-pipe activity, DRAM bytes and the bytes TMA brought into shared memory.
  local names metrics
  names=$(ncu --query-metrics 2>/dev/null | grep -oE "^(sm__pipe_tensor_op_gmma_cycles_active|sm__pipe_tensor_cycles_active|sm__inst_executed_pipe_tensor_op_gmma|l1tex__m_xbar2l1tex_read_bytes|dram__bytes_read|dram__bytes_write|gpu__time_duration|lts__t_sectors_srcunit_tex_op_read)" | sort -u)
  metrics=$(for n in $names; do case $n in sm__pipe*) echo "$n.avg.pct_of_peak_sustained_active";; *) echo "$n.sum";; esac; done | paste -sd,)
  echo "ncu metrics: $metrics"
  local shape batch seqlen causal
  for shape in "4 4096 0" "4 4096 1" "8 2048 1"; do
    read -r batch seqlen causal <<<"$shape"
    ncu --clock-control none --kernel-name regex:fa3_forward_kernel --launch-skip 1 --launch-count 1 --metrics "$metrics" \
      $BUILD/tests/kernels/fa2_forward_bench $batch 16 $seqlen 128 $causal 2 3 >"$OUT/ncu_fa3_s${seqlen}_causal$causal.log" 2>&1
    echo "== FA3 b=$batch h=16 s=$seqlen d=128 causal=$causal"
    grep -E "gmma|tensor|xbar|dram__|lts__|gpu__time|ERR|rror" "$OUT/ncu_fa3_s${seqlen}_causal$causal.log"
  done
}
step_sanitize_sm90() {
  # memcheck, synccheck and racecheck (which sees the generic proxy's shared-memory accesses only:
  # not TMA's writes nor wgmma's reads).
  for tool in memcheck synccheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 3 $BUILD/tests/kernels/test_kernels "[sanitizer_grid_sm90]" \
      >"$OUT/sanitizer_sm90_$tool.log" 2>&1
    local rc=$?
    [ $rc = 0 ] || status=1
    echo "compute-sanitizer $tool (FA3 grid): exit $rc ($(grep -cE "ERROR|error" "$OUT/sanitizer_sm90_$tool.log") error lines)"
    tail -3 "$OUT/sanitizer_sm90_$tool.log"
    grep -m2 -A6 -E "^========= (Warning|Error)" "$OUT/sanitizer_sm90_$tool.log"
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
  # Our backward's main kernel (NCU_BWD_GENERATION 2: the FA2 rung, 3: the Hopper rung) next to SDPA
  # flash's backward kernel on the same shape (bf16, 16k tokens, 2048 / d heads, seqlen
  # NCU_BWD_SEQLEN or 4096, d = NCU_BWD_HDIM or 128, NCU_BWD_CAUSAL=1 causal, else no mask;
  # NCU_BWD_ANCHOR=0 leaves SDPA out; NCU_BWD_DETERMINISTIC=1 profiles our deterministic mode, the
  # anchors theirs by default): Nsight Compute's full set
  # for each, the details pages as text and the stall reasons per SASS line of ours; NCU_BWD_FA4=1
  # adds FlashAttention-4's backward kernels on the same shape (after the fa4 step). Then every
  # side's raw page and its main kernel's stall reasons side by side (scripts/ncu_stalls.py); the
  # raw and SASS pages come back in $OUT/ncu_bwd_pages.tar.gz.
  local d=${NCU_BWD_HDIM:-128} generation=${NCU_BWD_GENERATION:-2} kernel=backward_main
  local seqlen=${NCU_BWD_SEQLEN:-4096} causal=${NCU_BWD_CAUSAL:-0} causal_py=False
  [[ $seqlen =~ ^[0-9]+$ && $seqlen -ge 1 && $seqlen -le 16384 ]] \
    || { echo "NCU_BWD_SEQLEN = $seqlen; allowed: 1 to 16384" >&2; status=2; return; }
  [[ $causal = 0 || $causal = 1 ]] || { echo "NCU_BWD_CAUSAL = $causal; allowed: 0 or 1" >&2; status=2; return; }
  local deterministic=()
  case ${NCU_BWD_DETERMINISTIC:-0} in
    0) ;;
    1) deterministic=(--deterministic) ;;
    *) echo "NCU_BWD_DETERMINISTIC = $NCU_BWD_DETERMINISTIC; allowed: 0 or 1" >&2; status=2; return ;;
  esac
  local keep_reports=${NCU_KEEP_REP:-0}
  [[ $keep_reports = 0 || $keep_reports = 1 ]] || { echo "NCU_KEEP_REP = $keep_reports; allowed: 0 or 1" >&2; status=2; return; }
  [ "$causal" = 1 ] && causal_py=True
  local batch=$((16384 / seqlen > 0 ? 16384 / seqlen : 1))
  [ "$generation" = 3 ] && kernel=fa3_backward_kernel
  [[ -x $BUILD/tests/kernels/test_fa2_backward_bench ]] || cmake --build $BUILD --target test_fa2_backward_bench -j16 \
    >>"$OUT/build.log" 2>&1 || { echo "ncu-bwd: test_fa2_backward_bench does not build"; status=1; return; }
  ncu --clock-control none --kernel-name regex:$kernel --launch-skip 2 --launch-count 1 --set full \
    --import-source yes -o "$OUT/ncu_bwd_ours" -f $BUILD/tests/kernels/test_fa2_backward_bench 16384 --hdims $d \
    --seqlens $seqlen --causal $causal --generation $generation "${deterministic[@]}" >"$OUT/ncu_bwd_ours.log" 2>&1
  ncu -i "$OUT/ncu_bwd_ours.ncu-rep" --page details >"$OUT/ncu_bwd_ours.txt" 2>&1
  ncu -i "$OUT/ncu_bwd_ours.ncu-rep" --page source --csv --print-source sass >"$OUT/ncu_bwd_ours_sass.csv" 2>&1
  local sides=ours
  if [ "${NCU_BWD_ANCHOR:-1}" = 1 ]; then
    sides="ours sdpa"
    ncu --clock-control none --kernel-name regex:flash_bwd_dq_dk_dv --launch-skip 2 --launch-count 1 --set full \
      -o "$OUT/ncu_bwd_sdpa" -f python3 -c "
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
q, k, v = (torch.randn($batch, 2048 // $d, $seqlen, $d, device='cuda', dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
for _ in range(4):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        F.scaled_dot_product_attention(q, k, v, is_causal=$causal_py).backward(torch.randn_like(q))
torch.cuda.synchronize()" >"$OUT/ncu_bwd_sdpa.log" 2>&1
    ncu -i "$OUT/ncu_bwd_sdpa.ncu-rep" --page details >"$OUT/ncu_bwd_sdpa.txt" 2>&1
  fi
  if [ "${NCU_BWD_FA4:-0}" = 1 ]; then  # FlashAttention-4's backward kernels (the fa4 step installs it), same shape
    sides="$sides fa4"
    ncu --clock-control none --profile-from-start off --set full -o "$OUT/ncu_bwd_fa4" -f python3 -c "
import sys, torch
sys.path[:0] = ['/tmp/site', '/tmp/site/nvidia_cutlass_dsl/dsl_packages']
from flash_attn.cute import flash_attn_func
q, k, v = (torch.randn($batch, $seqlen, 2048 // $d, $d, device='cuda', dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
do = torch.randn_like(q)
def forward():
    out = flash_attn_func(q, k, v, causal=$causal_py)
    return out[0] if isinstance(out, tuple) else out
for _ in range(3):
    torch.autograd.grad(forward(), (q, k, v), do)
out = forward()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
torch.autograd.grad(out, (q, k, v), do)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()" >"$OUT/ncu_bwd_fa4.log" 2>&1
    ncu -i "$OUT/ncu_bwd_fa4.ncu-rep" --page details >"$OUT/ncu_bwd_fa4.txt" 2>&1
    # Its stall samples per SASS instruction too, every kernel of the profiled call.
    ncu -i "$OUT/ncu_bwd_fa4.ncu-rep" --page source --csv --print-source sass \
      >"$OUT/ncu_bwd_fa4_sass.csv" 2>&1
  fi
  local stall_reports=()
  for side in $sides; do
    echo "== $side"; grep -E "^  [a-z_]+.*\(|Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|Shared Memory Throughput|Warp Cycles Per Issued|Executed Ipc A|Block Size|Grid Size|Dynamic Shared" "$OUT/ncu_bwd_$side.txt" | head -24
    ncu -i "$OUT/ncu_bwd_$side.ncu-rep" --page raw --csv >"$OUT/ncu_bwd_${side}_raw.csv" 2>&1
    stall_reports+=("$side=$OUT/ncu_bwd_${side}_raw.csv")
  done
  # Each side's longest kernel: its issued instructions and why its warps wait, reason by reason.
  python3 scripts/ncu_stalls.py "${stall_reports[@]}" | tee "$OUT/ncu_bwd_stalls.md"
  # A call returns at most 8 files: the raw and SASS pages go back in one archive
  # (ncu_bwd_pages.tar.gz), beside each side's details page and the stall table. The reports stay
  # here (NCU_KEEP_REP=1 keeps them); ncu's log of a side goes back only where that side failed (no
  # report, or an ==ERROR==), its tail printed.
  local pages=()
  for side in $sides; do
    for page in ncu_bwd_${side}_raw.csv ncu_bwd_${side}_sass.csv; do [[ -f $OUT/$page ]] && pages+=("$page"); done
    if [[ ! -f $OUT/ncu_bwd_$side.ncu-rep ]] || grep -q "==ERROR==" "$OUT/ncu_bwd_$side.log"; then
      echo "ncu-bwd: $side failed:"; tail -5 "$OUT/ncu_bwd_$side.log"; status=1
    else
      rm -f "$OUT/ncu_bwd_$side.log"
    fi
    [ "$keep_reports" = 1 ] || rm -f "$OUT/ncu_bwd_$side.ncu-rep"
  done
  ((${#pages[@]} == 0)) || { tar -czf "$OUT/ncu_bwd_pages.tar.gz" -C "$OUT" "${pages[@]}" && (cd "$OUT" && rm -f "${pages[@]}"); }
}
step_variants() {
  # Libraries of candidate changes, kept for a later call on the same machine (its benchmark takes
  # them with --variant NAME=/tmp/flashlab_variants/NAME.so): each patch of COMPARE_PATCHES is
  # applied, built incrementally, its library copied, and reverted; the base is rebuilt last. Where
  # an earlier compare left its libraries, each is copied there too, so that compare-bench times it
  # beside them (variants checked by compare, the others only built).
  local libs=/tmp/flashlab_variants lib=$BUILD/kernels/libflashlab_kernels_c.so patch name
  mkdir -p $libs
  for patch in ${COMPARE_PATCHES:?variants needs COMPARE_PATCHES=\"<git diff file>...\"}; do
    name=$(basename "$patch" .patch)
    patch -p1 --quiet <"$patch" || { echo "$name: the patch does not apply"; status=1; continue; }
    if cmake --build $BUILD --target flashlab_kernels_c -j16 >"$OUT/variant_$name.log" 2>&1; then
      cp $lib "$libs/$name.so" && echo "variant $name: $libs/$name.so"
      if [ -d /tmp/flashlab_compare ]; then cp $lib "/tmp/flashlab_compare/$name.so"; fi
    else
      echo "$name: build failed"; grep -m20 -E "error" "$OUT/variant_$name.log"; status=1
    fi
    patch -R -p1 --quiet <"$patch"
  done
  cmake --build $BUILD --target ${BUILD_TARGETS:-test_kernels flashlab_kernels_c} -j16 >>"$OUT/build.log" 2>&1
}
step_compare() {
  # Candidate changes measured against the current tree in one run. Each patch of COMPARE_PATCHES
  # (`git diff` files taken at the repository root) is applied to this tree in turn, built in a build
  # folder of its own ($BUILD-variant, so the base build and its test binaries stay as they are),
  # its GPU tests run (COMPARE_CATCH: a Catch2 test spec run on its test_kernels, e.g. one test case;
  # COMPARE_TIMEOUT seconds, default 420; else COMPARE_TESTS: a ctest -R regex, default all of them;
  # with COMPARE_CATCH, COMPARE_RACECHECK=1
  # also runs racecheck on its FA3 small grid) and its library kept; the patch is then
  # reverted. The benchmark times the base, every variant and a control (an unchanged copy of the
  # base library: its spread from 1.0 is the noise floor) in the same interleaved rounds (BENCH_ARGS;
  # add --backward for the backward), and scripts/compare_bench.py sets them side by side.
  local libs=/tmp/flashlab_compare variant_build=$BUILD-variant patch name
  rm -rf $libs && mkdir -p $libs
  step_build
  cp $BUILD/kernels/libflashlab_kernels_c.so $libs/base.so && cp $libs/base.so $libs/control.so
  cmake -S . -B $variant_build -DCMAKE_BUILD_TYPE=Release -DFLASHLAB_BUILD_VIZ=OFF -DCMAKE_CUDA_ARCHITECTURES=90a \
    >"$OUT/variant_configure.log" 2>&1 || { echo "variant build folder: configure failed"; status=1; return; }
  for patch in ${COMPARE_PATCHES:?compare needs COMPARE_PATCHES=\"<git diff file>...\"}; do
    name=$(basename "$patch" .patch)
    mkdir -p "$OUT/$name"
    patch -p1 --quiet <"$patch" || { echo "$name: the patch does not apply"; status=1; continue; }
    if cmake --build $variant_build --target flashlab_kernels_c test_kernels -j16 >"$OUT/$name/build.log" 2>&1; then
      if [ -n "${COMPARE_CATCH:-}" ]; then
        timeout ${COMPARE_TIMEOUT:-420} $variant_build/tests/kernels/test_kernels "$COMPARE_CATCH" >"$OUT/$name/tests.log" 2>&1 \
          || { echo "$name: GPU TESTS FAILED"; status=1; }
        echo "$name: $(grep -E "test cases|All tests passed" "$OUT/$name/tests.log" | tail -1)"
        if [ "${COMPARE_RACECHECK:-0}" = 1 ]; then  # the variant's FA3 small grid under racecheck
          timeout 300 compute-sanitizer --tool racecheck $variant_build/tests/kernels/test_kernels "[sanitizer_grid_sm90]" \
            >"$OUT/$name/racecheck.log" 2>&1
          echo "$name: racecheck $(grep -E "RACECHECK SUMMARY" "$OUT/$name/racecheck.log")"
        fi
      else
        # The FA3 backward grid takes about 5 minutes beside the other GPU tests; a hang costs 7.
        (cd $variant_build && ctest -L gpu -R "${COMPARE_TESTS:-.}" -j4 --timeout 420) >"$OUT/$name/tests.log" 2>&1 \
          || { echo "$name: GPU TESTS FAILED"; status=1; }
        echo "$name: $(grep -E "tests passed" "$OUT/$name/tests.log")"; grep -E "\*\*\*Failed|Timeout" "$OUT/$name/tests.log"
      fi
      cp $variant_build/kernels/libflashlab_kernels_c.so "$libs/$name.so"
    else
      echo "$name: build failed"; grep -m20 -E "error" "$OUT/$name/build.log"; status=1
    fi
    patch -R -p1 --quiet <"$patch"
  done
  [ "${COMPARE_BENCH:-1}" = 1 ] && step_compare_bench
}
step_compare_bench() {
  # The benchmark of compare's libraries (left in /tmp/flashlab_compare on this machine; COMPARE_BENCH=0
  # makes compare stop before it, so that a later call on the warm machine can time them, e.g.
  # after fa4): the base, the control and every variant in the same interleaved rounds.
  local libs=/tmp/flashlab_compare variants=() lib
  for lib in $libs/*.so; do
    [ "$(basename "$lib")" = base.so ] || variants+=(--variant "$(basename "$lib" .so)=$lib")
  done
  run_benchmark $libs/base.so compare --fa1-max-seqlen 0 "${variants[@]}" >/dev/null || status=1
  python3 scripts/compare_bench.py "$OUT/compare.json" | tee "$OUT/compare.md"
}
step_decode_tests() {
  local start=$(date +%s)
  timeout 420 $BUILD/tests/kernels/test_kernels "[decode]" >"$OUT/decode_tests.log" 2>&1 || status=1
  echo "decode tests: status $status in $(( $(date +%s) - start )) s: $(grep -E "test cases|All tests passed" "$OUT/decode_tests.log" | tail -1)"
  grep -E -B3 -A25 "FAILED" "$OUT/decode_tests.log" | head -60
}
step_decode() {
  step_decode_tests
  PYTHONUNBUFFERED=1 python3 scripts/bench_decode.py --lib $BUILD/kernels/libflashlab_kernels_c.so \
    --json "$OUT/decode_bench.json" --markdown "$OUT/decode_bench.md" ${DECODE_BENCH_ARGS:-} 2>&1 | tee "$OUT/decode_bench.log" \
    | grep -v "^|" || status=1
  cat "$OUT/decode_bench.md" 2>/dev/null
  # DRAM bytes of one decode call (the main kernel) beside the KV bytes it must read.
  local shape
  for shape in "1 131072" "64 4096"; do
    ncu --clock-control none --kernel-name regex:decode_kernel --launch-skip 1 --launch-count 1 \
      --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum \
      python3 scripts/bench_decode.py --lib $BUILD/kernels/libflashlab_kernels_c.so --profile $shape \
      >"$OUT/ncu_decode_${shape// /x}.log" 2>&1
    echo "== ncu decode $shape"; grep -E "kv bytes|dram__|gpu__time|ERR|rror" "$OUT/ncu_decode_${shape// /x}.log"
  done
  compute-sanitizer --tool memcheck --error-exitcode 3 $BUILD/tests/kernels/test_kernels "[sanitizer_grid_decode]" \
    >"$OUT/sanitizer_decode_memcheck.log" 2>&1
  echo "compute-sanitizer memcheck (decode grid): exit $? ($(grep -c "Invalid" "$OUT/sanitizer_decode_memcheck.log") invalid accesses)"
  tail -2 "$OUT/sanitizer_decode_memcheck.log"
}
for step in $steps; do
  "step_${step//-/_}"
done
exit $status
