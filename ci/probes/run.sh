#!/usr/bin/env bash
# Builds and runs the CUDA probes on the GPU machine (nvcc, sm_90a), each under a time limit.
#   bash ci/probes/run.sh [probe ...]      (default: the two K2 step probes)
# Probes: ctas_per_sm mma_vs_wgmma wgmma_k2_layouts k2_chain_floor k2_wgmma_chain bulk_copy_rate. Logs go to
# $OUT/probes.md (one section per probe: its ptxas register line and its output); binaries stay in
# a temporary folder. Exit status 1 when a probe fails to build, times out or exits non-zero
# (a probe's own exit status says why: see the comment at the top of each .cu).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/kda-probes}
mkdir -p "$OUT"
BIN=$(mktemp -d)
LOG="$OUT/probes.md"
probes=("$@")
[[ ${#probes[@]} -gt 0 ]] || probes=(k2_chain_floor k2_wgmma_chain)
rc=0
{
  echo "# CUDA probes, $(date -u +%Y-%m-%dT%H:%MZ)"
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'
  nvcc --version | tail -n 1
} > "$LOG"
for p in "${probes[@]}"; do
  src="$REPO/ci/probes/$p.cu"
  echo -e "\n## $p\n" >> "$LOG"
  if ! nvcc -gencode arch=compute_90a,code=sm_90a -O3 -Xptxas -v -o "$BIN/$p" "$src" > "$BIN/$p.build" 2>&1; then
    echo "build failed:" >> "$LOG"; cat "$BIN/$p.build" >> "$LOG"; echo "$p: build failed"; rc=1; continue
  fi
  grep -E "registers|spill" "$BIN/$p.build" | sed 's/^/    /' >> "$LOG"
  timeout --signal=KILL "${KDA_PROBE_LIMIT:-180}" "$BIN/$p" >> "$LOG" 2>&1
  status=$?
  echo "exit status $status" >> "$LOG"
  echo "$p: exit $status"
  [[ $status -eq 0 ]] || rc=1
done
rm -rf "$BIN"
exit $rc
