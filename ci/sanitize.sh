#!/usr/bin/env bash
# compute-sanitizer over the prefill cases of ci/sanitize_cases.py, against a built wheel.
#   bash ci/sanitize.sh [path/to/kda_aot-*.whl] [tool ...]      (default: all four tools)
# One process per tool runs every case (or those named in KDA_SANITIZE_CASES, space-separated); the summary (sanitize_summary.txt under $OUT) counts the
# errors each tool reported per case. API errors that are not ours are filtered by exact message:
# the CUDA bindings probe driver symbols with cuGetProcAddress, which memcheck lists as errors.
# The mma-* cases need the measurement wheel (KDA_KERNEL_LATTICE=all bash ci/build_wheels.sh cu12;
# docs/testing.md): with the shipped one they are listed as skipped.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
shift || true
TOOLS=("$@")
[[ ${#TOOLS[@]} -gt 0 ]] || TOOLS=(memcheck racecheck synccheck initcheck)
SUMMARY="$OUT/sanitize_summary.txt"
: > "$SUMMARY"
status=0
for tool in "${TOOLS[@]}"; do
  log="$OUT/sanitize_$tool.log"
  extra=()
  [[ $tool == racecheck ]] && extra=(--racecheck-report hazard)
  limit=${KDA_SANITIZE_TIMEOUT:-600}
  [[ $tool == racecheck ]] && limit=${KDA_RACECHECK_TIMEOUT:-$limit}
  timeout --signal=KILL "$limit" compute-sanitizer --tool "$tool" "${extra[@]}" \
    --print-limit 50 python3 "$REPO/ci/sanitize_cases.py" ${KDA_SANITIZE_CASES:-} > "$log" 2>&1
  rc=$?
  python3 - "$tool" "$log" "$rc" >> "$SUMMARY" <<'PY'
import re, sys
tool, path, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
ours_only = re.compile(r"Program hit CUDA_ERROR_\w+ \(error \d+\) due to .* on CUDA API call to cuGetProcAddress")
case, counts, done, skipped = "(start)", {}, set(), set()
lines = open(path, errors="replace").read().splitlines()
skip_next = 0
for i, line in enumerate(lines):
    m = re.match(r"=== (case|done|skip) ([^\s:]+)", line)
    if m:
        case = m.group(2)
        {"done": done, "skip": skipped}.get(m.group(1), set()).add(case)
        counts.setdefault(case, 0)
        continue
    body = line.removeprefix("========= ")
    if ours_only.search(body):
        continue
    if re.match(r"(Invalid|Race reported|Barrier error|Uninitialized|Program hit|Error|Warning:|Malformed)", body) \
            or re.search(r"\b(hazard|race)\b.*(detected|reported)", body, re.I):
        counts[case] = counts.get(case, 0) + 1
tail = [l for l in lines if "ERROR SUMMARY" in l or "RACECHECK SUMMARY" in l]
for c, n in counts.items():
    status = "ran" if c in done else "skipped" if c in skipped else "DID NOT FINISH"
    print(f"{tool:10s} {c:28s} {status:14s} reports={n}")
print(f"{tool:10s} exit={rc} {' | '.join(t.replace('========= ', '') for t in tail)}")
PY
  grep -q "reports=[1-9]\|DID NOT FINISH" "$SUMMARY" && status=1
done
cat "$SUMMARY"
exit $status
