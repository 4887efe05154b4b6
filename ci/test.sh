#!/usr/bin/env bash
# Set up and run the test suite on this machine (CPU tests; GPU tests skip without a Hopper GPU).
#   bash ci/test.sh [pytest args...]
# Works in the checkout's own virtual environment .venv/ (created on first use, reused after;
# ci/venv.sh), never in the interpreter that runs it: installs the test dependencies and the
# package from this source tree (which compiles the kernels, about a second each, cached under
# ~/.cache/kda-aot-build) and runs pytest against the installed copy. torch only where needed
# (a GPU, or KDA_WITH_TORCH=1): without it the torch tests skip (ci/venv.sh venv_want_torch). JAX's CPU
# wheel for the kda_aot.jax tests (ci/venv.sh venv_ensure_jax; KDA_WITH_JAX=0 leaves it out).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
source "$REPO/ci/venv.sh"
venv_setup test.sh
venv_ensure_torch
venv_ensure_jax
# The DSL is a build requirement only, but tests/build/test_ptx.py compiles kernels itself.
venv_install_package ".[test]" "nvidia-cutlass-dsl==4.8.1"
say "running pytest $* on the installed package"
cd /tmp  # tests import the installed package, not the source tree
"$PY" -m pytest -c "$REPO/pyproject.toml" --rootdir "$REPO" "$REPO/tests" -p no:cacheprovider "$@"
