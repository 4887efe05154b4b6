#!/usr/bin/env bash
# A/B of two built wheels on a GPU machine: ci/ab_rows.py through each, alternated ROUNDS times
# (default 2) in separate processes, then the table of both means and whether the bits agree.
#   bash ci/ab_wheels.sh A.whl B.whl [ROUNDS] [ab_rows.py args, e.g. --classes model random]
# Writes the JSON of every side and round, and the table (ab_table.txt), under $OUT (default /tmp/kda-gpu-out).
set -uo pipefail
[[ $# -ge 2 ]] || { sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
REPO=$(cd "$(dirname "$0")/.." && pwd)
A=$(realpath "$1") B=$(realpath "$2"); shift 2
ROUNDS=2
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then ROUNDS=$1; shift; fi
OUT=${OUT:-/tmp/kda-gpu-out}; mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    wheel=$A; [[ $side == B ]] && wheel=$B
    ( source "$REPO/ci/gpu_env.sh" "$wheel" > /dev/null
      timeout --signal=KILL "${KDA_AB_TIMEOUT:-300}" python3 "$REPO/ci/ab_rows.py" "$OUT/ab_${side}_$r.json" "$@" ) \
      > "$OUT/ab_${side}_$r.log" 2>&1 || { echo "ab_wheels: side $side round $r failed (log: $OUT/ab_${side}_$r.log)"; exit 1; }
  done
done
python3 - "$OUT" "$ROUNDS" <<'PY' | tee "$OUT/ab_table.txt"
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
runs = {s: [json.load(open(f"{out}/ab_{s}_{r}.json"))["rows"] for r in range(1, rounds + 1)] for s in "AB"}
print("| row | A kernels ms | B kernels ms | B / A | A graph ms | B graph ms | B / A | same bits |")
print("|---|---|---|---|---|---|---|---|")
for key in runs["A"][0]:
    mean = lambda s, c: sum(run[key][c] for run in runs[s]) / rounds
    bits = {run[key]["bits"] for s in "AB" for run in runs[s]}
    ak, bk, ag, bg = mean("A", "kernels ms"), mean("B", "kernels ms"), mean("A", "graph ms"), mean("B", "graph ms")
    print(f"| {key} | {ak:.4f} | {bk:.4f} | {bk / ak:.3f} | {ag:.4f} | {bg:.4f} | {bg / ag:.3f} | "
          f"{'yes' if len(bits) == 1 else 'NO'} |")
print()
print("device us per kernel, in launch order (round 1):")
for key in runs["A"][0]:
    for s in "AB":
        ks = runs[s][0][key]["kernel us"]
        print(f"  {key} {s}: " + ", ".join(f"{name.split('_ptr')[0][-40:]} {us:.1f}" for name, us in ks.items()))
PY
