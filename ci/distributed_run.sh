#!/usr/bin/env bash
# Cross-GPU context parallelism on real ranks, against a built wheel:
#   KDA_NPROC=2 bash ci/distributed_run.sh path/to/kda_aot-*.whl [ci/distributed_run.py args...]
# NCCL with one GPU per rank by default; a one-GPU smoke run:
#   KDA_NPROC=2 bash ci/distributed_run.sh WHEEL --backend gloo --same-device --heads 8 --iters 3
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0). Every rank has its own alarm (--timeout) and the
# whole run is bounded by KDA_DIST_TIMEOUT seconds. Log and JSON go to $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" "${1:-}"
shift || true
export NCCL_NVLS_ENABLE=0
timeout --signal=KILL "${KDA_DIST_TIMEOUT:-600}" python3 -m torch.distributed.run --standalone \
  --nproc-per-node "${KDA_NPROC:-2}" "$REPO/ci/distributed_run.py" --out "$OUT" "$@" 2>&1 | tee "$OUT/distributed_run.log"
exit "${PIPESTATUS[0]}"
