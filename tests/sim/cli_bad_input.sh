#!/usr/bin/env bash
# The flashlab command line on bad input: exit status 2, exactly one line on stderr naming the
# problem, nothing on the requested output file. Usage: cli_bad_input.sh path/to/flashlab
set -u
flashlab="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo '{"format": "flashlab-machine", "version": 1, "key": ' > "$work/malformed.json"
echo '{"format": "flashlab-machine", "version": 1, "key": "x", "name": "x", "dtype": "bf16", "sram_bytes": -5}' > "$work/bad_field.json"
failures=0

# expect_refusal "words the message must contain" args...
expect_refusal() {
  local needle="$1"
  shift
  rm -f "$work/out.json" "$work/out.csv"
  "$flashlab" "$@" >"$work/stdout" 2>"$work/stderr"
  local status=$?
  local lines
  lines=$(wc -l <"$work/stderr")
  if [[ $status -ne 2 || $lines -ne 1 ]] || ! grep -q -- "$needle" "$work/stderr" || [[ -e "$work/out.json" || -e "$work/out.csv" ]]; then
    echo "FAILED: flashlab $* -> status $status, $lines stderr lines, output file $( [[ -e $work/out.json ]] && echo present || echo absent)"
    cat "$work/stderr"
    failures=$((failures + 1))
  else
    echo "ok: flashlab $* -> $(cat "$work/stderr")"
  fi
}

expect_refusal "schedule 'fa9' is unknown" run --schedule fa9 --sram 64K --json "$work/out.json"
expect_refusal "block rule 'papr' is unknown; allowed: fitting, paper" sweep --schedules fa1 --seqlens 256 --head-dims 64 \
  --sram 64K --block-rule papr --json "$work/out.json"
expect_refusal "block rule 'x' is unknown; allowed: fitting, paper" experiment --block-rule x --out-dir "$work"
expect_refusal "machine 'z80' is unknown" run --schedule fa2 --machine z80 --json "$work/out.json"
expect_refusal "not valid JSON" run --schedule fa2 --machine "$work/malformed.json" --json "$work/out.json"
expect_refusal "sram_bytes" sweep --machine "$work/bad_field.json" --json "$work/out.json"
expect_refusal "--seqlen = '0' is out of range; allowed: 1..1073741824" run --schedule fa2 --seqlen 0 --sram 64K --json "$work/out.json"
expect_refusal "--head-dims = '0' is out of range; allowed: 1..4096" sweep --schedules fa2 --seqlens 1024 --head-dims 0 --sram 64K --json "$work/out.json" --csv "$work/out.csv"
expect_refusal "below the smallest working set" run --schedule fa1 --head-dim 128 --sram 512 --json "$work/out.json"
expect_refusal "size '12Q' is not understood" sweep --schedules fa2 --sram 12Q --json "$work/out.json"
expect_refusal "mask 'diagonal' is not understood" sweep --schedules fa2 --sram 64K --masks diagonal --csv "$work/out.csv"
expect_refusal "heads_q = 3 is not a multiple of heads_kv = 2" run --schedule fa2 --heads 3 --heads-kv 2 --sram 64K --json "$work/out.json"
expect_refusal "--bogus" run --bogus
expect_refusal "allowed: a paged KV cache with the decode schedule split_kv only" run --schedule fa2 --sram 64K --page-size 16 --json "$work/out.json"
expect_refusal "--page-size = '70000' is out of range; allowed: 0..65536" run --schedule split_kv -n 1 --sram 64K --page-size 70000 --json "$work/out.json"
expect_refusal "allowed: valid_rows, whole_pages" run --schedule split_kv -n 1 --sram 64K --page-size 16 --page-reads some --json "$work/out.json"
expect_refusal "--page-reads needs --page-size" run --schedule split_kv -n 1 --sram 64K --page-reads whole_pages --json "$work/out.json"
expect_refusal "allowed: fp32_partials, in_place" run --schedule fa2_backward --heads 4 --heads-kv 1 --sram 64K --dkv-reduction atomics --json "$work/out.json"
expect_refusal "allowed: backward schedules only" run --schedule fa2 --sram 64K --dkv-reduction in_place --json "$work/out.json"
expect_refusal "schedule 'fa9' is unknown" search --schedule fa9 --sram 64K --json "$work/out.json"
expect_refusal "different passes" search --schedules fa2,fa2_backward --sram 64K --json "$work/out.json"
expect_refusal "needs a machine preset" search --objective time --sram 64K --json "$work/out.json"
expect_refusal "objective 'speed' is unknown; allowed: hbm, time" search --objective speed --sram 64K --json "$work/out.json"
expect_refusal "--multiple-of = '0' is out of range" search --multiple-of 0 --sram 64K --json "$work/out.json"
expect_refusal "give the SRAM size" search --schedule fa2 --json "$work/out.json"
expect_refusal "no tiling of fa2 has its working set within M = 4096 B" search -d 128 --sram 4K --multiple-of 16 --json "$work/out.json"
expect_refusal "--threads = '0' is out of range; allowed: 1..65536" search --threads 0 --sram 64K --json "$work/out.json"
expect_refusal "--max-tile-steps = '0' is out of range" search --max-tile-steps 0 --sram 64K --json "$work/out.json"
expect_refusal "events" trace --schedule fa2 --sram 8K --max-events 10 --out "$work/out.json"
expect_refusal "generation 'fa9' is unknown; allowed: fa1, fa2" kernel-tiles --generation fa9 --json "$work/out.json"
expect_refusal "direction 'sideways' is unknown" kernel-tiles --direction sideways --json "$work/out.json"
expect_refusal "machine 'z80' is unknown" kernel-tiles --machine z80 --json "$work/out.json"
expect_refusal "does not exist" kernel-tiles --json "$work/missing/out.json"
expect_refusal "kernel 'fa9' is unknown; allowed: fa1, fa2, fa3" hardware --kernel fa9 --json "$work/out.json"
expect_refusal "the fa1 kernel has no backward" hardware --kernel fa1 --backward --json "$work/out.json"
expect_refusal "direction 'up' is unknown; allowed: forward, backward" hardware --direction up --json "$work/out.json"
expect_refusal "machine 'h100' has no \"gpu\" description" hardware --machine h100 --json "$work/out.json"
expect_refusal "--sram with hardware" hardware --sram 64K --json "$work/out.json"
expect_refusal "allowed: heads_kv = heads_q" hardware --backward --heads 4 --heads-kv 2 --json "$work/out.json"
expect_refusal "dtype bf16 with the fa1 kernel; allowed: fp16" hardware --kernel fa1 --dtype bf16 --json "$work/out.json"
expect_refusal "layout 'bshd' is unknown; allowed: flash, bhsd" hardware --layout bshd --json "$work/out.json"
expect_refusal "allowed: the fa3 kernels only" hardware --kernel fa2 --no-l2-sections --json "$work/out.json"
expect_refusal "size '12Q' is not understood" hardware --l2 12Q --json "$work/out.json"
expect_refusal "--blocks-per-sm = '-1' is out of range" hardware --blocks-per-sm -1 --json "$work/out.json"
expect_refusal "head_dim = 320 has no fa2 forward tiling" hardware --head-dim 320 --json "$work/out.json"

# Ring Attention: the ring's sizes, its ordering, a machine without a link, what the ring cannot run.
python3 -c 'import json, sys; m = json.load(open(sys.argv[1])); [m.pop(k) for k in ("link_bytes_per_second", "link_source")]
json.dump(m, open(sys.argv[2], "w"))' "$(dirname "$0")/../../sim/machines/h200.json" "$work/no_link.json"
expect_refusal "--devices = '0' is out of range; allowed: 1..1024" ring --devices 0 --json "$work/out.json"
expect_refusal "--ordering: ring ordering 'spiral' is unknown; allowed: contiguous, striped, zigzag" ring --ordering spiral \
  --json "$work/out.json"
expect_refusal "has no link_bytes_per_second" ring --machine "$work/no_link.json" --json "$work/out.json"
expect_refusal "tokens; allowed: at most 1073741824" ring --devices 1024 --seqlen-per-device 2000000 --json "$work/out.json"
expect_refusal "give both --block-rows and --block-cols" ring --block-rows 64 --json "$work/out.json"
expect_refusal "--sweep-devices = '0' is out of range" ring --sweep --sweep-devices 2,0 --json "$work/out.json"
expect_refusal "devices 8, ordering zigzag are a ring's; allowed: ring, ring_backward" run --schedule fa2 --sram 64K \
  --devices 8 --json "$work/out.json"
expect_refusal "--ordering: ring ordering 'diagonal' is unknown" run --schedule ring --sram 64K --ordering diagonal \
  --json "$work/out.json"

if [[ $failures -ne 0 ]]; then
  echo "$failures refusals wrong"
  exit 1
fi
echo "all refusals exit 2 with one line and no output file"
