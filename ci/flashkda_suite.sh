#!/usr/bin/env bash
# FlashKDA's own test file (tests/test_fwd_full.py of its public source) run unchanged against
# kda_aot.flashkda_compat on a GPU machine (docs/testing.md): a package named `flash_kda` that
# re-exports kda_aot.flashkda_compat goes first on the path, and the test imports the torch reference
# beside it (tests/torch_ref.py of vLLM's FlashKDA fork, the stable-inverse recipe). Neither file is
# part of this repository: put both in TESTS_DIR (with the source's conftest.py if it has one).
#
#   bash ci/flashkda_suite.sh WHEEL TESTS_DIR list                 # every case id, by the reference's cost
#   bash ci/flashkda_suite.sh WHEEL TESTS_DIR run IDS_FILE [BUDGET_S]
#
# The reference dominates the time (about 1,300 of its head-chunks per second with 12 workers on an
# H200), so `list` orders the ids by that cost, sequences x heads x 16-token chunks, and `run` takes
# a file of ids, one per line (a slice of the list), within BUDGET_S seconds (default 540) counted
# from the start: pytest (-n FK_WORKERS, default 12) is killed with its workers at the deadline, and
# the summary says what passed, failed and did not run, from the junit or, when killed, the log.
# $OUT gets fk.log and fk_junit.xml. Exit 0 all passed, 1 a failure, 4 some not run, 2 usage.
set -o pipefail
T0=$SECONDS
WHEEL=$1 TESTS=$2 MODE=$3
[ -f "$WHEEL" ] && [ -f "$TESTS/test_fwd_full.py" ] && [ -f "$TESTS/torch_ref.py" ] && [[ $MODE == list || $MODE == run ]] || {
  echo "usage: bash ci/flashkda_suite.sh WHEEL TESTS_DIR (list | run IDS_FILE [BUDGET_S])"; exit 2; }
TESTS=$(cd "$TESTS" && pwd)
if [[ $MODE == run ]]; then
  IDS_FILE=$(cd "$(dirname "$4")" && pwd)/$(basename "$4"); BUDGET=${5:-540}
  [ -f "$IDS_FILE" ] || { echo "no ids file $4"; exit 2; }
fi
source "$(dirname "$0")/gpu_env.sh" "$WHEEL" > /dev/null  # installs the wheel, sets OUT, cds to /tmp
rm -f "$OUT/lattice.txt" "$OUT/gpu.txt"
STANDIN=$(mktemp -d)
mkdir -p "$STANDIN/flash_kda"
cat > "$STANDIN/flash_kda/__init__.py" <<'PY'
"""A stand-in `flash_kda`: FlashKDA's Python API as kda_aot.flashkda_compat provides it."""
from kda_aot.flashkda_compat import *  # noqa: F401,F403
from kda_aot.flashkda_compat import fwd, get_workspace_size  # noqa: F401
PY
export PYTHONPATH="$STANDIN:$TESTS:$PYTHONPATH" TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/torch_ext}
mkdir -p "$TORCH_EXTENSIONS_DIR"
cd "$TESTS" || exit 2
[ -f pytest.ini ] || printf '[pytest]\n' > pytest.ini  # this folder's own config, not the repository's

if [[ $MODE == list ]]; then
  python3 -m pytest -p no:cacheprovider -q --collect-only test_fwd_full.py 2>/dev/null | grep '::' | python3 -c '
import re, sys
def chunks(n): return -(-n // 16)
rows = []
for k, i in enumerate(l.strip() for l in sys.stdin):
    fn, par = re.match(r"test_fwd_full\.py::(\w+)\[(.*)\]$", i).groups()
    parts = par.split("-")
    if fn == "test_fwd_fixed":
        seqs, H = [int(parts[2][1:])], int(parts[3][1:])
    elif fn == "test_fwd_varlen":
        seqs, H = [int(x) for x in parts[2][4:].split("_")], int(parts[3][1:])
    elif fn == "test_fwd_batched":
        B, T = re.match(r"B(\d+)_T(\d+)", parts[2]).groups()
        seqs, H = [int(T)] * int(B), int(parts[3][1:])
    elif fn == "test_fwd_long":
        seqs, H = [int(par[1:])], 1
    elif fn == "test_fwd_long_varlen":
        seqs, H = [int(x) for x in par[4:].split("_")], 1
    else:
        raise SystemExit(f"unknown test {fn}: teach ci/flashkda_suite.sh its shape")
    rows.append((sum(H * chunks(s) for s in seqs), k, i))
for cost, _, i in sorted(rows):
    print(f"{cost}\t{i}")
'
  exit "${PIPESTATUS[0]}"
fi

LOG=$OUT/fk.log
mapfile -t IDS < <(grep -v '^\s*$' "$IDS_FILE" | sed 's/^[0-9]*\t//')
NW=${FK_WORKERS:-12}
[ "${#IDS[@]}" -lt "$NW" ] && NW=${#IDS[@]}
echo "${#IDS[@]} cases from $IDS_FILE, $NW workers, budget ${BUDGET}s" | tee "$LOG"
# The reference builds a small CUDA extension on import: once here, before the workers race to it,
# with a check of what resolves where.
timeout 300 python3 -c '
import torch, torch_ref, flash_kda
assert hasattr(torch_ref, "inv_fwd_subst_16"), "torch_ref.py is not the stable-inverse reference (the vLLM fork'"'"'s)"
assert flash_kda.fwd.__module__ == "kda_aot.flashkda_compat", flash_kda.fwd.__module__
print("flash_kda is kda_aot.flashkda_compat; torch", torch.__version__, torch.cuda.get_device_name())
' 2>&1 | tee -a "$LOG" || exit 3
LEFT=$(( BUDGET - (SECONDS - T0) - 15 ))
RC=124
if [ "$LEFT" -ge 30 ]; then
  # -v: under xdist it prints "[gwN] PASSED id" as each case ends, readable when the budget kills pytest
  timeout --signal=KILL "$LEFT" python3 -m pytest -p no:cacheprovider -v --tb=short -n "$NW" --dist load \
      "${IDS[@]}" --junitxml "$OUT/fk_junit.xml" 2>&1 \
    | while IFS= read -r line; do printf '%4ds %s\n' $(( SECONDS - T0 )) "$line"; done | tee -a "$LOG"
  RC=${PIPESTATUS[0]}
fi
python3 - "$LOG" "$OUT/fk_junit.xml" "$RC" "${IDS[@]}" <<'PY' 2>&1 | tee -a "$LOG"
import os, re, sys
log, junit, rc, ids = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
rank = {"PASSED": 0, "SKIPPED": 1, "FAILED": 2, "ERROR": 3}
outcome, src = {}, "log"
if os.path.exists(junit):
    import xml.etree.ElementTree as ET
    src = "junit"
    for tc in ET.parse(junit).iter("testcase"):
        kids = {c.tag for c in tc}
        o = "ERROR" if "error" in kids else "FAILED" if "failure" in kids else "SKIPPED" if "skipped" in kids else "PASSED"
        outcome["test_fwd_full.py::" + tc.get("name")] = o
else:
    for line in open(log, errors="replace"):
        for o, name in re.findall(r"\b(PASSED|FAILED|ERROR|SKIPPED)\b\s+(test_fwd_full\.py::\S+)", line):
            if rank[o] >= rank.get(outcome.get(name), -1):
                outcome[name] = o
count = {o: sum(outcome.get(i) == o for i in ids) for o in rank}
notrun = [i for i in ids if i not in outcome]
print(f"FK SUMMARY: {len(ids)} cases | passed {count['PASSED']} | failed {count['FAILED']} | error {count['ERROR']} "
      f"| skipped {count['SKIPPED']} | not run {len(notrun)} | pytest rc {rc} (from {src})")
for i in ids:
    if outcome.get(i, "NOT RUN") != "PASSED":
        print(f"  {outcome.get(i, 'NOT RUN')} {i}")
sys.exit(1 if count["FAILED"] or count["ERROR"] else 4 if notrun else 0)
PY
