#!/usr/bin/env bash
# The registry (sim/schedules.cpp) is the only place that names schedules: the oracle, the
# bounds, the search and the pseudocode renderer reach a schedule's pieces through its entry.
# Fails listing any comparison with a quoted lowercase name in those files.
set -u
root=$1
files=(sim/closed_forms.cpp sim/bounds.cpp sim/search.cpp viz/pseudocode.cpp)
hits=$(cd "$root" && grep -nE '(schedule|name) *[=!]= *"[a-z0-9_]+"' "${files[@]}" | grep -vE '"(hbm|time)"')
if [[ -n $hits ]]; then
  echo "schedule names compared outside the registry (sim/schedules.cpp):"
  echo "$hits"
  exit 1
fi
echo "no schedule-name comparisons in ${files[*]}"
