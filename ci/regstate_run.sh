#!/usr/bin/env bash
# The register-state K2 prototype (branch k2-regstate) on a GPU machine:
#   bash ci/regstate_run.sh [path/to/kda_aot-*.whl] [step ...]      (steps: probes tests bench; default all)
# probes: the step probes (ci/probes/run.sh: bitwise check and microseconds per step), about a minute;
# tests:  tests/test_k2_regstate_gpu.py (bit for bit against K2 in the three modes);
# bench:  the serial and CP benchmarks (30 iterations) with K2 and with each prototype mode
#         (KDA_EXPERIMENTAL_REGSTATE unset, =1, =folded), forced value splits 2 and 1 as well.
# Everything goes to $OUT ($OUT/summary.md plus one log per step); each step is time-bounded, and
# "probes tests" and "bench" each fit the device tool's ten minutes per command (two calls).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
shift || true
STEPS=("$@")
[[ ${#STEPS[@]} -gt 0 ]] || STEPS=(probes tests bench)
SUMMARY="$OUT/summary.md"
touch "$SUMMARY"
step() {  # name, limit in seconds, command...
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout --signal=KILL "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc in $((SECONDS - start)) s" | tee -a "$SUMMARY"
  tail -n 4 "$OUT/$name.log" | sed 's/^/    /' >> "$SUMMARY"
}
for s in "${STEPS[@]}"; do
  case $s in
    probes) step probes 120 env OUT="$OUT" KDA_PROBE_LIMIT=40 bash "$REPO/ci/probes/run.sh"
            cat "$OUT/probes.md" >> "$SUMMARY" 2>/dev/null ;;
    tests) step tests 200 python3 -m pytest -c "$REPO/pyproject.toml" --rootdir "$REPO" \
             "$REPO/tests/test_k2_regstate_gpu.py" -p no:cacheprovider --timeout 120 -q ;;
    bench) for mode in k2 1 folded; do
             if [[ $mode == k2 ]]; then unset KDA_EXPERIMENTAL_REGSTATE; else export KDA_EXPERIMENTAL_REGSTATE=$mode; fi
             for suite in serial cp; do
               step "bench_${suite}_$mode" 90 python3 -m kda_aot.bench --suite $suite --no-fla --iters 30 --warmup 5 \
                 --value-split 2 1 --md "$OUT/bench_${suite}_$mode.md"
               cat "$OUT/bench_${suite}_$mode.md" >> "$SUMMARY" 2>/dev/null
             done
           done ;;
    *) echo "unknown step $s" | tee -a "$SUMMARY" ;;
  esac
done
grep -q "rc=[1-9]" "$SUMMARY" && exit 1 || exit 0
