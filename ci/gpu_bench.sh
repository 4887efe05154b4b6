#!/usr/bin/env bash
# Benchmark and per-kernel profile of a built wheel on a GPU machine.
#   bash ci/gpu_bench.sh [path/to/kda_aot-*.whl] [extra `python -m kda_aot.bench` args...]
# --k2-kernel k2 (and ci/numerics_table.py's ablations) need the measurement wheel:
# KDA_KERNEL_LATTICE=all bash ci/build_wheels.sh cu12 (docs/build.md, "Kernel lattice").
# Writes bench.md, bench.json and profile.txt under $OUT; each step is time-bounded (a hang still
# leaves logs). The peers run when importable (carried wheels in .whl/; FlashKDA on PYTHONPATH).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
shift || true
# cuDNN's Hopper KDA engine compiles its kernel with NVRTC and needs the toolkit's headers.
if [[ -z ${CUDA_HOME:-} ]] && command -v nvcc >/dev/null; then
  CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  export CUDA_HOME
fi
timeout --signal=KILL "${KDA_BENCH_TIMEOUT:-400}" python3 -m kda_aot.bench --md "$OUT/bench.md" --json "$OUT/bench.json" --png "$OUT/bench.png" "$@" 2>&1 | tee "$OUT/bench.log"
status=${PIPESTATUS[0]}
# Where the time of the CP shapes goes (device time per kernel); KDA_SKIP_PROFILE=1 skips it.
[[ ${KDA_SKIP_PROFILE:-0} == 1 ]] && exit "$status"
for shape in "4 8192" "4 8192 2048" "4 16384" "8 8192" "8 8192 2048" "8 16384"; do
  set -- $shape
  timeout --signal=KILL 120 python3 -m kda_aot.profile --heads "$1" --seq-lens "${@:2}" --cp auto --iters 30 2>&1
done | tee "$OUT/profile.txt"
exit "$status"
