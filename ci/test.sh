#!/usr/bin/env bash
# Set up and run the test suite on this machine (CPU tests; GPU tests skip without a Hopper GPU).
#   bash ci/test.sh [pytest args...]
# Installs the package from this source tree (which compiles the kernels, a few seconds each,
# cached under ~/.cache/kda-aot-build) and runs pytest against the installed copy.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
python3 -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch is a test-only dependency. Keep an installed one (e.g. a CUDA build); otherwise take the
# CPU build that lies on disk here (an unpinned torch would download several GB of CUDA build).
python3 -c "import torch" 2>/dev/null || python3 -m pip install -q "torch==2.13.0"
python3 -m pip install -q ".[test]" "nvidia-cutlass-dsl==4.8.1"
cd /tmp  # tests import the installed package, not the source tree
python3 -m pytest -c "$REPO/pyproject.toml" --rootdir "$REPO" "$REPO/tests" -p no:cacheprovider "$@"
