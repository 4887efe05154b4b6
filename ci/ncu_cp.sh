#!/usr/bin/env bash
# Nsight Compute on the kernels of one CP call (device tool; ncu must be on the machine).
#   bash ci/ncu_cp.sh [wheel] -- H LEN [LEN ...]
# Profiles the third call's pre_scan, merge and segmented K2 (the first two warm up) and writes
# the stall and throughput sections to $OUT/ncu.txt.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
shift || true
[[ ${1:-} == -- ]] && shift
H=${1:-8}; shift || true
LENS=${*:-8192}
cat > "$SITE/_ncu_driver.py" <<PY
import torch, kda_aot
from kda_aot.tools import bench
lens = [int(x) for x in "$LENS".split()]
x, cu, out, final = bench.make_case($H, lens)
for _ in range(3):
    kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                    initial_state=x["initial_state"], output_final_state=True, cu_seqlens=cu, seq_lens=lens,
                    out=out, final_state=final, cp="auto")
torch.cuda.synchronize()
PY
timeout 300 /usr/local/cuda/bin/ncu --kernel-name regex:"merge|k2_kernel|pre_scan" --launch-skip 6 --launch-count 3 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
  --section LaunchStats --section MemoryWorkloadAnalysis python3 "$SITE/_ncu_driver.py" 2>&1 | tee "$OUT/ncu.txt"
