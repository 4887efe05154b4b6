#!/usr/bin/env bash
# Which limit each benchmark row hits: Nsight Compute's duration, DRAM bytes and throughput of
# every kernel of one prefill call per shape (the third call; the first two warm up), then
# ci/ncu_limits.py turns them into a table of each kernel's time against its DRAM floor. Clocks are
# left as the GPU sets them (--clock-control none): Nsight Compute's default locks the base clock,
# which made K1 and K2 18-29% slower than in the benchmark (docs/speed_limits.md).
#   bash ci/ncu_limits.sh [wheel] [--quick]      (--quick: the first three shapes only)
# Writes $OUT/ncu_limits.csv (raw) and $OUT/limits.md (the table). Time-bounded per shape.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
shift || true
SHAPES=("64 8192" "64 1300 547 2048 963 271 3063" "64 1024 1024 1024 1024 1024 1024 1024 1024" "96 8192" "4 8192" "8 16384")
[[ ${1:-} == --quick ]] && SHAPES=("${SHAPES[@]:0:3}")
cat > "$SITE/_limits_driver.py" <<'PY'
import sys, torch, kda_aot
from kda_aot.tools import bench
H, lens = int(sys.argv[1]), [int(x) for x in sys.argv[2:]]
x, cu, out, final = bench.make_case(H, lens)
for i in range(3):
    if i == 2:
        torch.cuda.synchronize(); torch.cuda.profiler.start()
    kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                    initial_state=x["initial_state"], output_final_state=True, cu_seqlens=cu, seq_lens=lens,
                    out=out, final_state=final, cp="auto")
torch.cuda.synchronize(); torch.cuda.profiler.stop()
PY
METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active
CSV="$OUT/ncu_limits.csv"
: > "$CSV"
for shape in "${SHAPES[@]}"; do
  echo "# shape $shape" >> "$CSV"
  timeout --signal=KILL 150 /usr/local/cuda/bin/ncu --profile-from-start off --clock-control none --metrics "$METRICS" --csv --print-units base \
    --page raw python3 "$SITE/_limits_driver.py" $shape >> "$CSV" 2>> "$OUT/ncu_limits.err"
done
python3 "$REPO/ci/ncu_limits.py" "$CSV" | tee "$OUT/limits.md"
