#!/usr/bin/env bash
# The flashlab command line's output files: a bad path is refused by name before any work (exit
# 2, one line on stderr, nothing on stdout); "-" is stdout; devices, FIFOs and this process's
# stdout are written through, never replaced; a regular file is replaced whole or not at all,
# and no temporary is ever left behind. Usage: cli_output_files.sh path/to/flashlab
#
# Device nodes are private copies made with mknod in a scratch folder (skipped where mknod is
# not allowed), so that a regression can never replace the real /dev/null.
set -u
flashlab="$(realpath "$1")"
work="$(mktemp -d)"
reader=""
trap '[[ -n $reader ]] && kill "$reader" 2>/dev/null; rm -rf "$work"' EXIT
chmod 755 "$work"
failures=0
run_args=(run --schedule fa2 --seqlen 256 --head-dim 32 --sram 32K)

fail() {
  echo "FAILED: $*"
  failures=$((failures + 1))
}

# No temporary may be left beside any output.
no_leftovers() {
  local left
  left=$(find "$work" -name '*.partial*' -o -name '.*.flashlab-*')
  if [[ -n $left ]]; then
    fail "$1: temporaries left behind: $(echo $left)"
    rm -rf $left
  fi
}

# expect_refused_up_front "words of the message" args...: exit 2, one stderr line, empty stdout.
expect_refused_up_front() {
  local needle="$1"
  shift
  "$flashlab" "$@" >"$work/stdout" 2>"$work/stderr"
  local status=$? lines
  lines=$(wc -l <"$work/stderr")
  if [[ $status -ne 2 || $lines -ne 1 || -s "$work/stdout" ]] || ! grep -q -- "$needle" "$work/stderr"; then
    fail "flashlab $* -> status $status, $lines stderr lines, $(wc -c <"$work/stdout") bytes on stdout: $(cat "$work/stderr")"
  else
    echo "ok: flashlab $* -> $(cat "$work/stderr")"
  fi
  no_leftovers "$*"
}

# A directory as the path: refused before the run, for every command that writes a file.
mkdir -p "$work/a_directory" "$work/out_dir/experiment.json"
expect_refused_up_front "output file $work/a_directory is a directory" "${run_args[@]}" --json "$work/a_directory"
expect_refused_up_front "output file $work/a_directory is a directory" sweep --schedules fa2 --sram 32K --csv "$work/a_directory"
expect_refused_up_front "output file $work/a_directory is a directory" trace --schedule fa2 --sram 8K --out "$work/a_directory"
expect_refused_up_front "output file $work/a_directory is a directory" figure2 --json "$work/a_directory"
expect_refused_up_front "output file $work/a_directory is a directory" kernel-tiles --json "$work/a_directory"
expect_refused_up_front "output file $work/out_dir/experiment.json is a directory" experiment --out-dir "$work/out_dir"
# A missing directory, a path through a regular file, and a place nobody may create files in.
expect_refused_up_front "directory $work/missing does not exist" "${run_args[@]}" --json "$work/missing/out.json"
touch "$work/plain"
expect_refused_up_front "output file $work/plain/out.json" "${run_args[@]}" --json "$work/plain/out.json"
expect_refused_up_front "output file /proc/flashlab-out.json cannot be written" "${run_args[@]}" --json /proc/flashlab-out.json
# A read-only directory: as root only through an unprivileged user, where one can be switched to.
mkdir "$work/read_only" && chmod 555 "$work/read_only"
if [[ $(id -u) -ne 0 ]]; then
  expect_refused_up_front "cannot be written" "${run_args[@]}" --json "$work/read_only/out.json"
elif command -v setpriv >/dev/null && setpriv --reuid=65534 --regid=65534 --clear-groups test -x "$flashlab" 2>/dev/null; then
  setpriv --reuid=65534 --regid=65534 --clear-groups "$flashlab" "${run_args[@]}" --json "$work/read_only/out.json" \
    >"$work/stdout" 2>"$work/stderr"
  status=$?
  if [[ $status -ne 2 || -s "$work/stdout" ]] || ! grep -q "output file $work/read_only/out.json cannot be written" "$work/stderr"; then
    fail "read-only directory as an unprivileged user -> status $status: $(cat "$work/stderr")"
  else
    echo "ok: read-only directory as an unprivileged user -> $(cat "$work/stderr")"
  fi
else
  echo "skipped: a read-only directory (root, and no unprivileged user to switch to)"
fi

# "-" is stdout: the JSON follows the table, and no file named "-" appears.
(cd "$work" && "$flashlab" "${run_args[@]}" --json - >"$work/stdout" 2>"$work/stderr")
status=$?
if [[ $status -ne 0 || -e "$work/-" ]] || ! grep -q '"format": "flashlab-run"' "$work/stdout"; then
  fail "--json - -> status $status, file '-' $( [[ -e $work/- ]] && echo written || echo absent)"
else
  echo "ok: --json - writes to stdout"
fi

# This process's stdout by another name (what /dev/stdout is): written in order through it, the
# link left alone. The link lives in the scratch folder, so a regression cannot replace /dev/stdout.
ln -s /proc/self/fd/1 "$work/stdout_link"
"$flashlab" "${run_args[@]}" --json "$work/stdout_link" >"$work/captured" 2>"$work/stderr"
status=$?
if [[ $status -ne 0 || ! -L "$work/stdout_link" ]] || ! grep -q "closed form" "$work/captured" ||
   ! grep -q '"format": "flashlab-run"' "$work/captured"; then
  fail "--json <link to stdout> -> status $status, link $( [[ -L $work/stdout_link ]] && echo kept || echo replaced): $(cat "$work/stderr")"
else
  echo "ok: a link to stdout is written through, after the table"
fi

# A FIFO: written through to its reader, still a FIFO afterwards.
mkfifo "$work/fifo"
timeout 20 cat "$work/fifo" >"$work/from_fifo" &
reader=$!
timeout 20 "$flashlab" "${run_args[@]}" --json "$work/fifo" >/dev/null 2>"$work/stderr"
status=$?
wait "$reader"
reader=""
if [[ $status -ne 0 || ! -p "$work/fifo" ]] || ! grep -q '"format": "flashlab-run"' "$work/from_fifo"; then
  fail "--json <fifo> -> status $status, $( [[ -p $work/fifo ]] && echo still a FIFO || echo replaced): $(cat "$work/stderr")"
else
  echo "ok: a FIFO is written through to its reader"
fi

# Device nodes: a private /dev/null stays a device; a private /dev/full reports the failed write.
if mknod "$work/null" c 1 3 2>/dev/null && mknod "$work/full" c 1 7 2>/dev/null; then
  "$flashlab" "${run_args[@]}" --json "$work/null" >/dev/null 2>"$work/stderr"
  status=$?
  if [[ $status -ne 0 || ! -c "$work/null" ]]; then
    fail "--json <null device> -> status $status, $( [[ -c $work/null ]] && echo still a device || echo replaced)"
  else
    echo "ok: a null device is written through and stays a device"
  fi
  "$flashlab" "${run_args[@]}" --json "$work/full" >/dev/null 2>"$work/stderr"
  status=$?
  if [[ $status -ne 2 || ! -c "$work/full" || $(wc -l <"$work/stderr") -ne 1 ]] ||
     ! grep -q "output file $work/full cannot be written" "$work/stderr"; then
    fail "--json <full device> -> status $status: $(cat "$work/stderr")"
  else
    echo "ok: a full device -> $(cat "$work/stderr")"
  fi
  no_leftovers "device nodes"
else
  echo "skipped: device nodes (mknod is not allowed here)"
fi

# A write that fails midway (the file size limit): one line, exit 2, the old file intact, no
# temporary left. SIGXFSZ is ignored so that the write fails instead of killing the program.
echo "the previous content" >"$work/kept.json"
(trap '' XFSZ; ulimit -f 1; exec "$flashlab" "${run_args[@]}" --json "$work/kept.json") >/dev/null 2>"$work/stderr"
status=$?
if [[ $status -ne 2 || $(wc -l <"$work/stderr") -ne 1 || "$(cat "$work/kept.json")" != "the previous content" ]] ||
   ! grep -q "output file $work/kept.json cannot be written" "$work/stderr"; then
  fail "a failed write -> status $status, file now '$(head -c 40 "$work/kept.json")': $(cat "$work/stderr")"
else
  echo "ok: a failed write -> $(cat "$work/stderr"); the old file is intact"
fi
no_leftovers "a failed write"

# A regular file is replaced whole, keeping its permissions.
echo "old" >"$work/replaced.json"
chmod 640 "$work/replaced.json"
if ! "$flashlab" "${run_args[@]}" --json "$work/replaced.json" >/dev/null 2>"$work/stderr" ||
   ! python3 -c "import json,sys; assert json.load(open(sys.argv[1]))['format'] == 'flashlab-run'" "$work/replaced.json" ||
   [[ $(stat -c %a "$work/replaced.json") != 640 ]]; then
  fail "replacing a regular file: $(cat "$work/stderr"), mode $(stat -c %a "$work/replaced.json")"
else
  echo "ok: a regular file is replaced whole and keeps its mode"
fi
no_leftovers "replacing a regular file"

if [[ $failures -ne 0 ]]; then
  echo "$failures output-file cases wrong"
  exit 1
fi
echo "every output path is checked before the work, written through or replaced whole"
