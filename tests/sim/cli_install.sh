#!/usr/bin/env bash
# `cmake --install` of a build into a fresh prefix: the program runs from there, reports the
# project's version and finds its machine presets in <prefix>/share/flashlab/machines.
#   cli_install.sh BUILD_DIR VERSION
set -euo pipefail
build=$1 version=$2
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
unset FLASHLAB_MACHINES
cmake --install "$build" --prefix "$prefix" >/dev/null
fail() { echo "cli_install: $*" >&2; exit 1; }
[[ -x $prefix/bin/flashlab ]] || fail "bin/flashlab was not installed"
[[ $("$prefix/bin/flashlab" --version) == "flashlab $version" ]] || fail "--version printed '$("$prefix/bin/flashlab" --version)'"
presets=$(ls "$prefix/share/flashlab/machines" | wc -l)
source_presets=$(ls "$(dirname "$0")/../../sim/machines"/*.json | wc -l)
((presets == source_presets)) || fail "share/flashlab/machines holds $presets presets, sim/machines $source_presets"
first=$("$prefix/bin/flashlab" machines | head -1)
[[ $first == "machine presets in $prefix/share/flashlab/machines" ]] || fail "machines read: $first"
"$prefix/bin/flashlab" run --schedule fa2 --seqlen 1024 --head-dim 64 --machine h200 >/dev/null || fail "run --machine h200 failed"
echo "cli_install: flashlab $version installed with its presets"
