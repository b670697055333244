#!/usr/bin/env bash
# test_fa2_backward_bench (given as $1) refuses bad arguments before it looks for a device: exit 2,
# one line on stderr naming the input, nothing on stdout.
set -uo pipefail
bench=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
expect_refusal() {  # expect_refusal <text the one stderr line must hold> <arguments...>
  local text=$1
  shift
  local status out err
  out=$("$bench" "$@" 2>"$work/stderr")
  status=$?
  err=$(cat "$work/stderr")
  if [[ $status != 2 || -n $out || $(wc -l <"$work/stderr") != 1 || $err != *"$text"* ]]; then
    echo "FAILED: test_fa2_backward_bench $* -> exit $status, stdout '$out', stderr '$err' (expected exit 2 and '$text')"
    failures=$((failures + 1))
  fi
}
expect_refusal "--heads = 0; allowed: 1 to 256" --heads 0
expect_refusal "--heads = 257; allowed: 1 to 256" --generation 3 --heads 257
expect_refusal "--heads = 3x; allowed: 1 to 256" --heads 3x
expect_refusal "--generation = 4; allowed: 2 or 3" --generation 4
expect_refusal "--seqlens = 0; allowed: 1 to 1048576, comma-separated" --seqlens 0
expect_refusal "--seqlens = 2048,; allowed: 1 to 1048576, comma-separated" --seqlens 2048,
expect_refusal "--hdims = 64,,128; allowed: 1 to 256, comma-separated" --hdims 64,,128
expect_refusal "--hdims = 512; allowed: 1 to 256, comma-separated" --hdims 512
expect_refusal "--causal = 2; allowed: 0, 1 or 0,1" --causal 2
expect_refusal "total_tokens = 0; allowed: 1 to 16777216" 0
expect_refusal "total_tokens = many; allowed: 1 to 16777216" many
expect_refusal "option = --seqlen; allowed:" --seqlen 2048
expect_refusal "option = --hdims; allowed:" --hdims  # an option without its value
((failures == 0)) || exit 1
echo "test_fa2_backward_bench: 13 refusals, each exit 2 with one line naming its input"
