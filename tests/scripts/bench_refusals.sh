#!/usr/bin/env bash
# The kernel bench programs refuse bad arguments before they make a CUDA call: exit 2, one line on
# stderr naming the input, nothing on stdout. $1: test_fa2_backward_bench, $2: fa2_forward_bench.
set -uo pipefail
backward_bench=$1 forward_bench=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0 cases=0
expect_refusal() {  # expect_refusal <program> <text the one stderr line must hold> <arguments...>
  local program=$1 text=$2
  shift 2
  local status out err
  out=$("$program" "$@" 2>"$work/stderr")
  status=$?
  err=$(cat "$work/stderr")
  cases=$((cases + 1))
  if [[ $status != 2 || -n $out || $(wc -l <"$work/stderr") != 1 || $err != *"$text"* ]]; then
    echo "FAILED: $(basename "$program") $* -> exit $status, stdout '$out', stderr '$err' (expected exit 2 and '$text')"
    failures=$((failures + 1))
  fi
}
b=$backward_bench
expect_refusal $b "--heads = 0; allowed: 1 to 256" --heads 0
expect_refusal $b "--heads = 257; allowed: 1 to 256" --generation 3 --heads 257
expect_refusal $b "--heads = 3x; allowed: 1 to 256" --heads 3x
expect_refusal $b "--generation = 4; allowed: 2 or 3" --generation 4
expect_refusal $b "--seqlens = 0; allowed: 1 to 1048576, comma-separated" --seqlens 0
expect_refusal $b "--seqlens = 2048,; allowed: 1 to 1048576, comma-separated" --seqlens 2048,
expect_refusal $b "--hdims = 64,,128; allowed: 1 to 256, comma-separated" --hdims 64,,128
expect_refusal $b "--hdims = 512; allowed: 1 to 256, comma-separated" --hdims 512
expect_refusal $b "--causal = 2; allowed: 0, 1 or 0,1" --causal 2
expect_refusal $b "total_tokens = 0; allowed: 1 to 16777216" 0
expect_refusal $b "total_tokens = many; allowed: 1 to 16777216" many
expect_refusal $b "option = --seqlen; allowed:" --seqlen 2048
expect_refusal $b "option = --hdims; allowed:" --hdims  # an option without its value
f=$forward_bench
expect_refusal $f "usage: " 4 16 1024                     # too few
expect_refusal $f "usage: " 4 16 1024 128 0 1 2 9         # too many
expect_refusal $f "batch = 0; allowed: 1 to 65536" 0 16 1024 128 0
expect_refusal $f "heads = x; allowed: 1 to 256" 4 x 1024 128 0
expect_refusal $f "seqlen = 0; allowed: 1 to 1048576" 4 16 0 128 0
expect_refusal $f "head_dim = 300; allowed: 1 to 256" 4 16 1024 300 0
expect_refusal $f "causal = 2; allowed: 0 to 1" 4 16 1024 128 2
expect_refusal $f "repeats = 0; allowed: 1 to 10000" 4 16 1024 128 0 0
expect_refusal $f "generation = 4; allowed: 1 to 3" 4 16 1024 128 0 1 4
expect_refusal $f "batch x heads x seqlen x head_dim = 4294967296; allowed: up to 2147483648" 1024 256 128 128 0
((failures == 0)) || exit 1
echo "bench programs: $cases refusals, each exit 2 with one line naming its input"
