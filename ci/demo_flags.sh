#!/usr/bin/env bash
# The demo with each documented flag set (kda_aot/demo.py's docstring), one pass/fail line each.
#   bash ci/demo_flags.sh [path/to/kda_aot-*.whl]
# Like the other device scripts it runs a built wheel (ci/gpu_env.sh), not the source tree. Each
# run's output goes to $OUT/demo_<n>.log; the exit status is the number of failed runs (0: all
# passed). Every flag set must pass on a correct build: the demo's bounds are the recipe's own.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
FLAG_SETS=(
  ""                     # the default problem: H=4, sequences 300 17 1024
  "--heads 1"
  "--heads 2"
  "--seq-lens 4096"
  "--seq-lens 64 64"
)
failed=0
summary=()
for i in "${!FLAG_SETS[@]}"; do
  flags=${FLAG_SETS[$i]}
  log="$OUT/demo_$i.log"
  t0=$SECONDS
  # Word splitting of $flags is intended: each set is a list of arguments.
  # shellcheck disable=SC2086
  timeout --signal=KILL 600 python3 -m kda_aot.demo $flags >"$log" 2>&1
  rc=$?
  case $rc in
    0) verdict=PASS ;;
    1) verdict=FAIL ;;
    2) verdict="CANNOT RUN" ;;
    *) verdict="ERROR rc=$rc" ;;
  esac
  [[ $rc == 0 ]] || failed=$((failed + 1))
  line=$(printf '%-11s python -m kda_aot.demo %-18s (%ss, %s)' "$verdict" "${flags:-(defaults)}" "$((SECONDS - t0))" "$log")
  echo "$line"
  [[ $rc == 0 ]] || sed 's/^/    /' "$log"  # a failure shows its whole report right away
  summary+=("$line")
done
printf '\n%s\n' "${summary[@]}" | tee "$OUT/demo_flags.txt"
echo "$failed of ${#FLAG_SETS[@]} flag sets failed"
exit "$failed"
