#!/usr/bin/env bash
# Every GPU check of a built wheel in one command (one machine start): the test suite, the four
# compute-sanitizer tools, the demo's flag sets, the benchmark, and (when the machine has two or
# more GPUs and the script exists) the cross-GPU context-parallel run.
#   bash ci/gpu_all.sh [path/to/kda_aot-*.whl] [step ...]
# Give it the measurement wheel (every kernel variant: KDA_KERNEL_LATTICE=all bash ci/build_wheels.sh
# cu12; docs/testing.md) for the full suite: with the shipped wheel the steps run, and what needs a
# measurement-only kernel (KDA_K2_KERNEL=k2 tests, the mma-* sanitizer cases) skips.
# Steps: tests sanitize demo bench limits probes distributed (default: all but limits, which runs
# Nsight Compute over the benchmark rows: ci/ncu_limits.sh, and probes, which builds and runs the
# CUDA probes of ci/probes/ with nvcc: ci/probes/run.sh). Each step is time-bounded and writes
# its logs to its own folder; at the end everything is packed into $OUT/gpu_all.tgz (the device
# tool brings back only a few files) beside $OUT/summary.txt, one line per step with its status.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
FINAL_OUT=${OUT:-/tmp/kda-gpu-out}
mkdir -p "$FINAL_OUT"
WHEEL=${1:-$(ls "$REPO"/dist/kda_aot*.whl 2>/dev/null | head -n 1)}
shift || true
STEPS=("$@")
[[ ${#STEPS[@]} -gt 0 ]] || STEPS=(tests sanitize demo bench distributed)
WORK=$(mktemp -d)
SUMMARY="$FINAL_OUT/summary.txt"
: > "$SUMMARY"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
run_step() {  # name, limit in seconds, command...
  local name=$1 limit=$2
  shift 2
  mkdir -p "$WORK/$name"
  local start=$SECONDS
  OUT="$WORK/$name" timeout --signal=KILL "$limit" "$@" > "$WORK/$name/step.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc in $((SECONDS - start)) s" | tee -a "$SUMMARY"
  tail -n 3 "$WORK/$name/step.log" | sed 's/^/    /' | tee -a "$SUMMARY"
}
for step in "${STEPS[@]}"; do
  case $step in
    tests) run_step tests "${KDA_TESTS_LIMIT:-420}" bash "$REPO/ci/gpu_tests.sh" "$WHEEL" ;;
    sanitize) run_step sanitize "${KDA_SANITIZE_LIMIT:-300}" bash "$REPO/ci/sanitize.sh" "$WHEEL"
              cat "$WORK/sanitize/sanitize_summary.txt" >> "$SUMMARY" 2>/dev/null ;;
    demo) run_step demo 180 bash "$REPO/ci/demo_flags.sh" "$WHEEL" ;;
    bench) KDA_SKIP_PROFILE=1 run_step bench "${KDA_BENCH_LIMIT:-900}" bash "$REPO/ci/gpu_bench.sh" "$WHEEL" ${KDA_BENCH_ARGS:---no-accuracy --iters 30 --warmup 5}
           cat "$WORK/bench/bench.md" >> "$SUMMARY" 2>/dev/null ;;
    limits) run_step limits 420 bash "$REPO/ci/ncu_limits.sh" "$WHEEL"
            cat "$WORK/limits/limits.md" >> "$SUMMARY" 2>/dev/null ;;
    probes) run_step probes "${KDA_PROBES_LIMIT:-420}" bash "$REPO/ci/probes/run.sh" ${KDA_PROBES:-}
            cat "$WORK/probes/probes.md" >> "$SUMMARY" 2>/dev/null ;;
    distributed)
      if [[ $gpus -ge 2 && -f $REPO/ci/distributed_run.sh ]]; then
        run_step distributed "${KDA_DIST_LIMIT:-240}" bash "$REPO/ci/distributed_run.sh" "$WHEEL"
      else
        echo "distributed: skipped ($gpus GPU(s); ci/distributed_run.sh present: $([[ -f $REPO/ci/distributed_run.sh ]] && echo yes || echo no))" | tee -a "$SUMMARY"
      fi ;;
    *) echo "unknown step $step" | tee -a "$SUMMARY" ;;
  esac
done
tar -czf "$FINAL_OUT/gpu_all.tgz" -C "$WORK" .
grep -q "rc=[1-9]" "$SUMMARY" && exit 1 || exit 0
