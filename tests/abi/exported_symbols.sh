#!/usr/bin/env bash
# The shared library exports exactly the functions flashlab.h declares (FLASHLAB_API ...
# flashlab_*(...)): no declared function missing, and no other defined dynamic symbol (the kernels,
# the problem description and libstdc++'s inline code have hidden or local visibility).
# Usage: exported_symbols.sh LIBRARY HEADER
set -euo pipefail
library=$1 header=$2
declared=$(tr '\n' ' ' <"$header" | grep -oE 'FLASHLAB_API [^;(]*\bflashlab_[a-z0-9_]+ *\(' |
           grep -oE 'flashlab_[a-z0-9_]+ *\($' | tr -d ' (' | sort -u)
exported=$(nm -D --defined-only --format=posix "$library" | awk '{print $1}' | sort -u)
if [ -z "$declared" ]; then
  echo "no FLASHLAB_API function found in $header" >&2
  exit 1
fi
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
extra=$(comm -13 <(echo "$declared") <(echo "$exported"))
if [ -n "$missing" ] || [ -n "$extra" ]; then
  [ -n "$missing" ] && printf 'declared in %s but not exported:\n%s\n' "$header" "$missing" >&2
  [ -n "$extra" ] && printf 'exported but not declared in %s (%s in all):\n%s\n' "$header" \
    "$(echo "$extra" | wc -l)" "$(echo "$extra" | head -20)" >&2
  exit 1
fi
echo "$(echo "$exported" | wc -l) exported symbols, each declared in $(basename "$header"):" $exported
