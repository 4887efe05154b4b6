#!/usr/bin/env bash
# Set up and run the main job: the demo (prefill on a default problem, checked against the GPU
# reference and the float64 reference; on a machine without a Hopper GPU it says so and runs the
# CPU reference instead).
#   bash ci/demo.sh [demo args...]      (python -m kda_aot.demo --help lists them)
# Works in the checkout's own virtual environment .venv/ (ci/venv.sh), shared with ci/test.sh.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
source "$REPO/ci/venv.sh"
venv_setup demo.sh
venv_ensure_torch  # only with a GPU: the GPU checks' reference is torch's; the CPU path is NumPy
venv_install_package .
say "python -m kda_aot.demo $*"
cd /tmp  # run the installed package, not the source tree
"$PY" -m kda_aot.demo "$@"
