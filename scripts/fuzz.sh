#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, preset fuzz: clang, ASan, UBSan) in build/fuzz and runs
# each for a while on its committed seeds and dictionary, growing a working corpus in
# build/fuzz/corpus/. Reports per target the executions, the coverage libFuzzer counts (edges:
# "cov", features: "ft") and the findings; saves every finding's input under fuzz/findings/
# (git-ignored) with a one-line summary each in fuzz/findings/SUMMARY.txt. docs/fuzzing.md has
# the details.
#
#   bash scripts/fuzz.sh                        # CI: 60 s per target, stops a target at its first finding
#   bash scripts/fuzz.sh --seconds 1200 --keep-going --coverage   # a long run, every finding, llvm-cov
#   bash scripts/fuzz.sh --targets trace --seconds 30             # one target
#   bash scripts/fuzz.sh --summarize            # only re-run the saved findings and summarise them
#
# Exit status: 0 when no target found anything in this run, 1 otherwise (2: bad usage).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-60}
targets=(trace machine cli)
keep_going=0
coverage=0
summarize_only=0
while (($#)); do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --targets) IFS=, read -r -a targets <<<"$2"; shift 2 ;;
    --keep-going) keep_going=1; shift ;;
    --coverage) coverage=1; shift ;;
    --summarize) summarize_only=1; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "fuzz.sh: unknown argument '$1'; allowed: --seconds N, --targets a,b, --keep-going, --coverage, --summarize" >&2; exit 2 ;;
  esac
done
[[ $seconds =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: --seconds '$seconds'; allowed: a whole number >= 1" >&2; exit 2; }
for target in "${targets[@]}"; do
  [[ -d fuzz/corpus/$target ]] || { echo "fuzz.sh: target '$target' is unknown; allowed: trace, machine, cli" >&2; exit 2; }
done

# The inputs each target takes at most, in bytes: the seeds with room to grow.
declare -A max_len=([trace]=65536 [machine]=8192 [cli]=2048)
# What each target's coverage report covers: the code under test, not the harness.
declare -A sources=([trace]="sim/trace.cpp sim/json_input.cpp viz/replay.cpp" [machine]="sim/machines.cpp sim/json_input.cpp"
                  [cli]="sim/cli/main.cpp sim/decimal.cpp sim/report.cpp")
# The limits a finding is judged by: an input slower than this (seconds) or larger than this (MB).
timeout_seconds=10
rss_limit_mb=2048
build=build/fuzz
findings=fuzz/findings
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

build_targets() {  # preset, build directory
  local names=()
  for target in "${targets[@]}"; do names+=("fuzz_$target"); done
  cmake --preset "$1" >/dev/null
  cmake --build "$2" -j "$(nproc)" --target "${names[@]}"
}

# One line on what a saved input does: the sanitizer's or the harness's first words about it,
# and the first frame in this project's code.
summarize_finding() {  # target, file
  local output first frame
  output=$(timeout 120 "$build/fuzz/fuzz_$1" -runs=1 -timeout=$timeout_seconds -rss_limit_mb=$rss_limit_mb "$2" \
           </dev/null 2>&1 || true)
  first=$(grep -m1 -E 'runtime error:|ERROR: AddressSanitizer|what\(\):|^fuzz_[a-z]+: |ERROR: libFuzzer:' <<<"$output" |
          sed -E 's/^==[0-9]+==//; s/^ +//' || true)
  frame=$(grep -m1 -E '#[0-9]+ 0x[0-9a-f]+ in .*(/algorithms/|/sim/|/viz/|/kernels/)' <<<"$output" |
          sed -E 's/.* in //; s#[^ ]*/(algorithms|sim|viz|kernels)/#\1/#' || true)
  [[ -n $first ]] || first="no longer reproduces"
  echo "$1/$(basename "$2"): $first${frame:+ [at $frame]}"
}

summarize_findings() {
  local summary=$findings/SUMMARY.txt
  mkdir -p "$findings"
  : >"$summary"
  for target in "${targets[@]}"; do
    [[ -d $findings/$target ]] || continue
    for file in "$findings/$target"/*; do
      [[ -f $file ]] && summarize_finding "$target" "$file" >>"$summary"
    done
  done
  if [[ -s $summary ]]; then
    echo "fuzz.sh: $(wc -l <"$summary") saved finding(s), one line each in $summary:"
    # Distinct problems: the same summary without the input's name.
    sed -E 's/^[a-z]+\/[^:]+: //' "$summary" | sort | uniq -c | sort -rn | sed 's/^/  /'
  else
    echo "fuzz.sh: no saved findings"
  fi
}

if ((summarize_only)); then
  summarize_findings
  exit 0
fi

build_targets fuzz "$build"
found_any=0
report=()
for target in "${targets[@]}"; do
  corpus=$build/corpus/$target
  mkdir -p "$corpus" "$findings/$target"
  before=$(find "$findings/$target" -type f | wc -l)
  options=(-max_total_time="$seconds" -print_final_stats=1 -timeout=$timeout_seconds -rss_limit_mb=$rss_limit_mb
           -max_len="${max_len[$target]}" -dict="fuzz/dict/$target.dict" -artifact_prefix="$findings/$target/")
  # Keep going: children do the fuzzing and a finding ends only its child (libFuzzer's fork mode).
  ((keep_going)) && options+=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
  log=$build/fuzz_$target.log
  echo "fuzz.sh: fuzz_$target for $seconds s (log: $log)"
  status=0
  "$build/fuzz/fuzz_$target" "${options[@]}" "$corpus" "fuzz/corpus/$target" </dev/null >"$log" 2>&1 || status=$?
  after=$(find "$findings/$target" -type f | wc -l)
  executions=$(grep -oE 'stat::number_of_executed_units: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+$' || true)
  last=$(grep -E '^#[0-9]+.*cov: [0-9]+' "$log" | tail -1 || true)
  [[ -n $executions ]] || executions=$(grep -oE '^#[0-9]+' <<<"$last" | tr -d '#' || true)
  cov=$(grep -oE 'cov: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || true)
  features=$(grep -oE 'ft: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || true)
  corpus_size=$(find "$corpus" -type f | wc -l)
  new=$((after - before))
  ((status != 0 || new > 0)) && found_any=1
  report+=("$(printf '%-8s %12s %8s %8s %8s %9s %s' "$target" "${executions:-?}" "${cov:-?}" "${features:-?}" \
                      "$corpus_size" "$new" "$( ((status == 0 || keep_going)) || echo "(stopped: exit $status)")")")
done

echo
echo "fuzz.sh: $seconds s per target"
printf '%-8s %12s %8s %8s %8s %9s\n' target executions cov ft corpus findings
printf '%s\n' "${report[@]}"
echo
summarize_findings

if ((coverage)); then
  coverage_build=build/fuzz-coverage
  build_targets fuzz-coverage "$coverage_build"
  for target in "${targets[@]}"; do
    profiles=$coverage_build/profiles/$target
    rm -rf "$profiles" && mkdir -p "$profiles"
    # Every input of the corpus and the seeds once (-runs=0), each process writing its profile.
    LLVM_PROFILE_FILE="$profiles/%p.profraw" "$coverage_build/fuzz/fuzz_$target" -runs=0 \
      -timeout=$timeout_seconds -rss_limit_mb=$rss_limit_mb "$build/corpus/$target" "fuzz/corpus/$target" \
      </dev/null >"$coverage_build/coverage_$target.log" 2>&1 || true
    llvm-profdata merge -sparse "$profiles"/*.profraw -o "$profiles/merged.profdata"
    echo
    echo "fuzz.sh: source coverage of fuzz_$target's corpus (llvm-cov; regions, functions, lines, branches)"
    # shellcheck disable=SC2086  # the sources are a list
    llvm-cov report "$coverage_build/fuzz/fuzz_$target" -instr-profile="$profiles/merged.profdata" ${sources[$target]}
  done
fi

exit $found_any
