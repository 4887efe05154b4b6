#!/usr/bin/env bash
# Set up and run the main job: the demo (prefill on a default problem, checked against the
# float64 reference; on a machine without a Hopper GPU it runs the CPU reference instead).
#   bash ci/demo.sh [demo args...]
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
# torch drives the demo; keep an installed one, else take the CPU build that lies on disk here.
python3 -c "import torch" 2>/dev/null || python3 -m pip install -q "torch==2.13.0"
python3 -m pip install -q .
cd /tmp  # run the installed package, not the source tree
python3 -m kda_aot.demo "$@"
