#!/usr/bin/env bash
# The Hopper kernels' resource check, on any machine with nvcc (no GPU needed): each source is
# compiled for sm_90a with ptxas's report, which must show 0 spill bytes and none of the warnings
# that mean wgmma was serialised or setmaxnreg ignored (C7508, C7511, C7512, C7513, C7515, C7519,
# and any other "Potential Performance Loss"); where
# cuobjdump is on the PATH, each object must also hold HGMMA instructions.
#
#   bash scripts/ptxas_check.sh [--patch FILE.patch] [--log FILE] [SOURCE.cu ...]
#
# Default sources: every instance of kernels/03_fa3_sm90 and its GEMM. --patch applies a `git diff`
# file for the check and reverts it after (a candidate in docs/bench/patches checked before it is
# timed). Exit status 0 when clean, 1 when not, 2 on bad arguments.
set -uo pipefail

patch_file="" log="" sources=()
while (($#)); do
  case $1 in
    --patch | --log)
      (($# >= 2)) || { echo "ptxas_check.sh: $1 needs a file" >&2; exit 2; }
      if [[ $1 == --patch ]]; then patch_file=$(realpath -m "$2"); else log=$(realpath -m "$2"); fi
      shift 2 ;;
    -*) echo "ptxas_check.sh: unknown option '$1'; allowed: --patch FILE, --log FILE" >&2; exit 2 ;;
    *) sources+=("$(realpath -m "$1")"); shift ;;
  esac
done
cd "$(dirname "$0")/.."
if [[ -n $patch_file && ! -f $patch_file ]]; then
  echo "ptxas_check.sh: --patch $patch_file: no such file" >&2; exit 2
fi
((${#sources[@]})) || sources=(kernels/03_fa3_sm90/forward_instances/*.cu kernels/03_fa3_sm90/backward_instances/*.cu
                                kernels/03_fa3_sm90/gemm_host.cu)
for source in "${sources[@]}"; do
  [[ -f $source ]] || { echo "ptxas_check.sh: source $source: no such file" >&2; exit 2; }
done

if [[ -n $patch_file ]]; then
  git apply --check "$patch_file" 2>/dev/null || { echo "ptxas_check.sh: --patch $patch_file does not apply to this tree" >&2; exit 2; }
fi

# From here on every exit removes the temporary files and reverts the patch.
temporary_log=0
[[ -n $log ]] || { log=$(mktemp); temporary_log=1; }
object=$(mktemp --suffix=.o)
cleanup() {
  rm -f "$object"
  ((temporary_log)) && rm -f "$log"
  [[ -z $patch_file ]] || git apply -R "$patch_file"
}
trap cleanup EXIT
[[ -z $patch_file ]] || git apply "$patch_file"
bad=0
: >"$log"
for source in "${sources[@]}"; do
  nvcc -std=c++20 -O3 --use_fast_math -DFLASHLAB_HAVE_SM90A -gencode=arch=compute_90a,code=sm_90a -I. \
    -I/usr/include/eigen3 -Xptxas -v -c "$source" -o "$object" >>"$log" 2>&1 || { echo "$source: does not compile"; bad=1; }
  if command -v cuobjdump >/dev/null; then
    echo "$source: $(cuobjdump --dump-sass "$object" | grep -c HGMMA) HGMMA instructions" | tee -a "$log"
  fi
done
grep -E "C75(08|11|12|13|15|19)|Potential Performance Loss" "$log" && bad=1
grep -E "spill" "$log" | grep -vE " 0 bytes spill stores, 0 bytes spill loads" && bad=1
grep -q " 0 HGMMA" "$log" && bad=1
echo "ptxas check${patch_file:+ with $patch_file}: $([ $bad = 0 ] && echo clean || echo FAILED)" \
  "($(grep -c 'spill' "$log") kernels, $(grep -oE 'Used [0-9]+ registers' "$log" | sort | uniq -c | tr '\n' ' '))"
exit $bad
