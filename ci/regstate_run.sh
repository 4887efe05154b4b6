#!/usr/bin/env bash
# The register-state K2 prototype (branch k2-regstate) on a GPU machine, in one call:
#   bash ci/regstate_run.sh [path/to/kda_aot-*.whl]
# 1. the step probes (ci/probes/run.sh: bitwise check and microseconds per step);
# 2. tests/test_k2_regstate_gpu.py (bit for bit against K2 in the three modes);
# 3. the serial benchmark, kernels and graph modes, with K2 and with each prototype mode
#    (KDA_EXPERIMENTAL_REGSTATE unset, =1, =folded), forced value splits 2 and 1 as well.
# Everything goes to $OUT ($OUT/summary.md plus one log per step); each step is time-bounded.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
SUMMARY="$OUT/summary.md"
: > "$SUMMARY"
step() {  # name, limit in seconds, command...
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout --signal=KILL "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc in $((SECONDS - start)) s" | tee -a "$SUMMARY"
  tail -n 4 "$OUT/$name.log" | sed 's/^/    /' >> "$SUMMARY"
}
step probes 300 env OUT="$OUT" bash "$REPO/ci/probes/run.sh"
cat "$OUT/probes.md" >> "$SUMMARY" 2>/dev/null
step tests 900 python3 -m pytest -c "$REPO/pyproject.toml" --rootdir "$REPO" "$REPO/tests/test_k2_regstate_gpu.py" \
  -p no:cacheprovider --timeout 300 -q
for mode in k2 1 folded; do
  if [[ $mode == k2 ]]; then unset KDA_EXPERIMENTAL_REGSTATE; else export KDA_EXPERIMENTAL_REGSTATE=$mode; fi
  step "bench_$mode" 420 python3 -m kda_aot.bench --suite serial --no-fla --value-split 2 1 --md "$OUT/bench_$mode.md"
  cat "$OUT/bench_$mode.md" >> "$SUMMARY" 2>/dev/null
done
grep -q "rc=[1-9]" "$SUMMARY" && exit 1 || exit 0
